"""A Ray Tune sweep of StarPO: `python tuned_examples/sweep_starpo.py --help` lists the flags.

By default it sweeps RAGEN's data knobs on the CPU preset: rollout frequency
(1, 2), group size (4, 8) and the turn budget (max_turns 3, 5) -- 8 trials,
one MLflow run each (./mlflow.db unless --tracking-uri), and prints a results
table at the end. Sweep any config key instead with --grid KEY=V1,V2
(repeatable); --scheduler asha stops weak trials early. Each trial holds one
CPU, so --max-concurrent should not exceed the cores you can spare.

    python tuned_examples/sweep_starpo.py --env bandit --stop-iters 10 \\
        --grid rollout_frequency=1,2 --grid group_size=4,8 --scheduler asha --max-concurrent 2
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from rllib_ragen.run.experiment import (  # noqa: E402
    add_config_flags,
    add_tracking_flags,
    choose_starting_model,
    config_from_args,
    mlflow_settings,
)
from rllib_ragen.run.ray_session import init_ray  # noqa: E402
from rllib_ragen.run.sweep import (  # noqa: E402
    DEFAULT_GRID,
    DEFAULT_METRIC,
    SCHEDULERS,
    SweepConfig,
    parse_grid,
    run_sweep,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add_config_flags(parser, env="sokoban", stop_iters=20)
    add_tracking_flags(parser)
    default_grid = " ".join(f"{k}={','.join(map(str, v))}" for k, v in DEFAULT_GRID.items())
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                        help=f"sweep a config key over values (repeatable; default: {default_grid})")
    parser.add_argument("--scheduler", choices=SCHEDULERS, default="fifo", help="asha stops weak trials early")
    parser.add_argument("--metric", default=DEFAULT_METRIC, help="result key to compare trials by")
    parser.add_argument("--mode", choices=("max", "min"), default="max", help="maximise or minimise --metric")
    parser.add_argument("--grace-period", type=int, default=1, help="ASHA: iterations before a trial may be stopped")
    parser.add_argument("--max-concurrent", type=int, default=1, help="trials at once (1 CPU each)")
    parser.add_argument("--storage-path", help="where Tune keeps trial results (default: ~/ray_results)")
    parser.add_argument("--name", help="Tune experiment name")
    return parser


def main(argv: list[str] | None = None) -> pd.DataFrame:
    args = build_parser().parse_args(argv)
    config = config_from_args(args)
    grid = parse_grid(config, args.grid) if args.grid else dict(DEFAULT_GRID)
    sweep = SweepConfig(
        grid=grid, stop_iters=args.stop_iters, scheduler=args.scheduler, metric=args.metric, mode=args.mode,
        max_concurrent=args.max_concurrent, grace_period=args.grace_period,
        storage_path=str(Path(args.storage_path).resolve()) if args.storage_path else None, name=args.name,
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    init_ray(log_to_driver=True)
    tags = choose_starting_model(config, args)  # once, in the driver: every trial loads the same cached model
    settings = mlflow_settings(args, tags={**tags, "preset": args.preset})
    print(f"sweeping {sweep.num_trials} trials of {config.env} over {grid}; MLflow: {settings.tracking_uri} "
          f"experiment {settings.experiment}")
    _, table = run_sweep(config, sweep, settings)
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print("\nresults (best first):\n" + table.to_string(index=False))
    return table


if __name__ == "__main__":
    main()
