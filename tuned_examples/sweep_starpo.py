"""A Ray Tune sweep of StarPO: `python tuned_examples/sweep_starpo.py --help` lists the flags
(the same command as `rllib-ragen sweep`).

By default it sweeps RAGEN's data knobs on the CPU preset: rollout frequency
(1, 2), group size (4, 8) and the turn budget (max_turns 3, 5) -- 8 trials,
one MLflow run each (./mlflow.db unless --tracking-uri), and prints a results
table at the end. Sweep any config key instead with --grid KEY=V1,V2
(repeatable); --scheduler asha stops weak trials early. Each trial reserves the
CPUs of what it starts (the algorithm and its vLLM engine: 2 with the CPU preset),
and Tune runs as many side by side as fit, at most --max-concurrent.

    python tuned_examples/sweep_starpo.py --env bandit --stop-iters 3 --grid group_size=4,8

From Python, the same sweep is `rllib_ragen.run.sweep.run_sweep(config, SweepSettings(grid=...), settings)`.
"""

from rllib_ragen.run.sweep import main

if __name__ == "__main__":
    main()
