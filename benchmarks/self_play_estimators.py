"""RAE against a shared baseline in self-play: win rates, success, response length and entropy, from MLflow.

SPIRAL's role-conditioned advantages (RAE: one moving-average baseline per game and seat) against GRPO over
each game's group (the two seats of one game share a baseline). Each arm is one run of a self-play tuned
example with only `--estimator` changed, the same seed and the same RL minutes, each in its own MLflow
experiment of one store; every experiment with a finished run is one arm, labelled by its estimator.
Prints, per arm, the iterations and minutes of RL, the win and loss rates against each evaluation opponent
before and after RL (95% Wilson intervals), and the first and last training success, response length and
entropy; writes a PNG with those curves against minutes of RL and the win rates before and after.

    python tuned_examples/tictactoe_selfplay.py --tracking-uri sqlite:///selfplay.db --experiment ttt-rae
    python tuned_examples/tictactoe_selfplay.py --tracking-uri sqlite:///selfplay.db --experiment ttt-grpo \\
        --estimator grpo
    python benchmarks/self_play_estimators.py --store sqlite:///selfplay.db --output docs/results/rae_grpo.png

When the first run built the warm start and the second found it cached, give the second `--job-budget-min`
less by the warm start's minutes, so both have the same minutes of RL.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from envs.user_errors import CLIParser, UserError, front_door
from rllib_ragen.run.analysis import (
    ECHO_TRAP_SIGNALS,
    TRAINING_SECONDS,
    list_runs,
    metric_histories,
    save_figure,
    training_minutes,
)
from rllib_ragen.run.given_paths import existing_store, output_file
from rllib_ragen.run.mlflow_store import tracking_client

# Panel title -> MLflow metric key of the training curves.
CURVES = {
    "training success (wins of the trained seats)": ECHO_TRAP_SIGNALS["success rate"],
    "response length (tokens)": "env_runners/response_length_mean",
    "policy entropy": ECHO_TRAP_SIGNALS["policy entropy"],
}
OPPONENTS = ("random", "frozen", "minimax")
OUTCOMES = ("win", "loss")


def rate_keys(opponent: str, outcome: str) -> tuple[str, str, str]:
    """The game evaluation's keys of one rate and its interval (`rollout.game_evaluation.GameScore.metrics`)."""
    key = f"evaluation/vs_{opponent}/{outcome}_rate"
    return key, f"{key}_low", f"{key}_high"


METRICS = [TRAINING_SECONDS, *CURVES.values(), *(k for o in OPPONENTS for w in OUTCOMES for k in rate_keys(o, w))]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, metavar="URI", help="the MLflow store holding one experiment per arm")
    parser.add_argument("--output", type=output_file, required=True, help="PNG file to write")
    return parser.parse_args(argv)


def arm_runs(uri: str) -> dict[str, pd.DataFrame]:
    """Estimator -> metric histories of the newest finished run of each experiment in the store."""
    client = tracking_client(uri)
    arms: dict[str, pd.DataFrame] = {}
    for experiment in sorted(e.name for e in client.search_experiments()):
        finished = list_runs(client, experiment).query("status == 'FINISHED'")
        if finished.empty:
            continue
        run = finished.iloc[0]
        label = str(run.get("advantage_estimator", experiment))
        if label in arms:
            raise UserError(f"two experiments in {uri} ran estimator {label!r}: keep one run per arm in the store")
        arms[label] = metric_histories(client, run.run_id, METRICS)
    if len(arms) < 2:
        raise UserError(f"{uri} has {len(arms)} finished run(s) in separate experiments; the figure compares 2 or more")
    return arms


def rate_cell(frame: pd.DataFrame, opponent: str, outcome: str) -> str:
    """'before [low, high] -> after [low, high]' of one rate, or 'n/a' when the run did not evaluate it."""
    key, low, high = rate_keys(opponent, outcome)
    if key not in frame or frame[key].dropna().empty:
        return "n/a"
    ends = [frame[[key, low, high]].dropna().iloc[i] for i in (0, -1)]
    return " -> ".join(f"{row[key]:.3f} [{row[low]:.3f}, {row[high]:.3f}]" for row in ends)


def summary_lines(arms: dict[str, pd.DataFrame]) -> list[str]:
    """A markdown table: a row per arm and opponent, then the curves' first and last values."""
    lines = ["| arm | iterations | minutes of RL | opponent | win before -> after | loss before -> after |"]
    lines.append("|---|---|---|---|---|---|")
    for arm, frame in arms.items():
        trained = frame[frame.index > 0]
        minutes = f"{training_minutes(frame).iloc[-1]:.1f}"
        for opponent in OPPONENTS:
            cells = [arm, str(len(trained)), minutes, opponent, *(rate_cell(frame, opponent, o) for o in OUTCOMES)]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| arm | " + " | ".join(CURVES) + " |", "|---|" + "---|" * len(CURVES)]
    for arm, frame in arms.items():
        trained = frame[frame.index > 0]
        cells = [arm]
        for key in CURVES.values():
            curve = trained[key].dropna() if key in trained else pd.Series(dtype=float)
            cells.append(f"{curve.iloc[0]:.3f} -> {curve.iloc[-1]:.3f}" if len(curve) else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot_arms(arms: dict[str, pd.DataFrame]) -> Figure:
    """The training curves against minutes of RL, a line per arm, then each opponent's win rate before
    and after RL with its 95% interval."""
    figure = Figure(figsize=(4.2 * (len(CURVES) + 1), 3.6), layout="constrained")
    axes = figure.subplots(1, len(CURVES) + 1)
    colours = {arm: f"C{i % 10}" for i, arm in enumerate(arms)}
    for ax, (title, key) in zip(axes, CURVES.items()):
        for arm, frame in arms.items():
            curve = frame[key].dropna() if key in frame else pd.Series(dtype=float)
            curve = curve[curve.index > 0]
            ax.plot(training_minutes(frame).loc[curve.index], curve, color=colours[arm], label=arm)
        ax.set(title=title, xlabel="minutes of RL")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    ax = axes[-1]
    for i, opponent in enumerate(OPPONENTS):
        for j, (arm, frame) in enumerate(arms.items()):
            key, low, high = rate_keys(opponent, "win")
            if key not in frame or frame[key].dropna().empty:
                continue
            rows = frame[[key, low, high]].dropna()
            for k, (row, marker) in enumerate(zip((rows.iloc[0], rows.iloc[-1]), ("o", "s"))):
                x = i + 0.25 * j + 0.1 * k - 0.15
                ax.errorbar(x, row[key], yerr=[[row[key] - row[low]], [row[high] - row[key]]], color=colours[arm],
                            marker=marker, capsize=3, markerfacecolor="white" if k == 0 else colours[arm])
    ax.set_xticks(range(len(OPPONENTS)), [f"vs {o}" for o in OPPONENTS])
    ax.set(title="win rate, before (open) and after RL (95%)", ylim=(-0.02, 1.02))
    ax.grid(alpha=0.3, axis="y")
    return figure


@front_door
def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    existing_store(args.store)
    arms = arm_runs(args.store)
    print("\n".join(summary_lines(arms)))
    output = save_figure(plot_arms(arms), args.output)
    print(f"self-play estimator figure of {len(arms)} arm(s) written to {output}")
    return output


if __name__ == "__main__":
    main()
