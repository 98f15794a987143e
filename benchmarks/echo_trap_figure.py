"""The echo-trap figure: StarPO against StarPO-S, success, entropy and in-group spread against minutes.

RAGEN's central figure, drawn from this project's own runs. Each `--store ENV=URI` is one env's
MLflow store, e.g. the `--workdir` of a `benchmarks/cpu_learning.py` screen with one variant per
method; every experiment in it is one line, labelled by its variant (the experiment name after
`cpu-learning-<env>-<start>-`). Prints a table per run (first and last value of each signal) and
writes a PNG.

    python benchmarks/cpu_learning.py --envs sokoban --starts expert --minutes 15 --workdir /tmp/echo-sokoban \\
        --variant "starpo-s" --variant "starpo n_groups=4 rollout_filter_ratio=1.0"
    python benchmarks/echo_trap_figure.py --store sokoban=sqlite:////tmp/echo-sokoban/mlflow.db \\
        --store frozenlake=sqlite:////tmp/echo-frozenlake/mlflow.db --output docs/results/echo_trap.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from envs.user_errors import CLIParser, UserError, front_door
from rllib_ragen.run.given_paths import existing_store, output_file
from rllib_ragen.run.analysis import (
    ECHO_TRAP_PANELS,
    EVALUATION_SUCCESS,
    TRAINING_SECONDS,
    list_runs,
    metric_histories,
    plot_echo_trap,
    save_figure,
    training_minutes,
)
from rllib_ragen.run.mlflow_store import tracking_client

METRICS = [*EVALUATION_SUCCESS, TRAINING_SECONDS, *ECHO_TRAP_PANELS.values()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--store", action="append", required=True, metavar="ENV=URI", help="one env's MLflow store (repeatable)"
    )
    parser.add_argument("--output", type=output_file, required=True, help="PNG file to write")
    return parser.parse_args(argv)


def env_runs(env: str, uri: str) -> dict[str, pd.DataFrame]:
    """Variant label -> metric histories of the newest finished run of each experiment in the store."""
    client = tracking_client(uri)
    histories = {}
    for experiment in sorted(e.name for e in client.search_experiments()):
        finished = list_runs(client, experiment).query("status == 'FINISHED'")
        if finished.empty:
            continue
        label = experiment.split(f"{env}-", 1)[-1].split("-", 1)[-1] if env in experiment else experiment
        histories[label] = metric_histories(client, finished.iloc[0].run_id, METRICS)
    if not histories:
        raise UserError(f"no finished runs in {uri}")
    return histories


def summary(env: str, label: str, frame: pd.DataFrame) -> str:
    """One table row: iterations, minutes, success before and after RL, first and last entropy and spread."""
    success = frame[EVALUATION_SUCCESS[0]].dropna()
    trained = frame[frame.index > 0]
    cells = [env, label, str(len(trained)), f"{training_minutes(frame).iloc[-1]:.1f}"]
    cells.append(f"{success.iloc[0]:.3f} -> {success.iloc[-1]:.3f}")
    for key in ECHO_TRAP_PANELS.values():
        curve = trained[key].dropna() if key in trained else pd.Series(dtype=float)
        cells.append(f"{curve.iloc[0]:.3f} -> {curve.iloc[-1]:.3f}" if len(curve) else "n/a")
    return "| " + " | ".join(cells) + " |"


@front_door
def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    runs = {}
    for spec in args.store:
        env, sep, uri = spec.partition("=")
        if not sep or not env or not uri:
            raise UserError(f"--store takes ENV=URI, got {spec!r}")
        existing_store(uri)
        runs[env] = env_runs(env, uri)
    print("| env | run | iterations | minutes | evaluation success | " + " | ".join(ECHO_TRAP_PANELS) + " |")
    print("|---|---|---|---|---|" + "---|" * len(ECHO_TRAP_PANELS))
    for env, histories in runs.items():
        for label, frame in histories.items():
            print(summary(env, label, frame))
    output = save_figure(plot_echo_trap(runs), args.output)
    print(f"echo-trap figure of {sum(map(len, runs.values()))} run(s) written to {output}")
    return output


if __name__ == "__main__":
    main()
