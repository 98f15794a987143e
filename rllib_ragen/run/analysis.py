"""Reading StarPO runs back from MLflow: run lists, metric curves, evaluation
success with its interval, the echo-trap signals and the trajectory pages (used
by notebooks/starpo_runs.ipynb).

RAGEN's Echo Trap shows first as falling in-group reward spread and policy
entropy, with spiking gradient norms, while the success rate stalls; RAGEN-2
adds the reasoning's mutual information with the prompt I(X;Z) (template
collapse) and its conditional entropy H(Z|X) (entropy collapse), measured
every few iterations. The curves of `ECHO_TRAP_SIGNALS` are those signals.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from mlflow.tracking import MlflowClient

from rllib_ragen.training.collapse_metrics import (
    COLLAPSE_RESULTS,
    CONDITIONAL_ENTROPY,
    MUTUAL_INFORMATION,
    REWARD_VARIANCE,
    EchoTrapMonitor,
    EchoTrapSettings,
)

# Plot title -> MLflow metric key (as logged by MLflowCallback).
ECHO_TRAP_SIGNALS: dict[str, str] = {
    "success rate": "env_runners/success_rate",
    "in-group reward std": "env_runners/in_group_reward_std",
    "policy entropy": "learners/default_policy/entropy",
    "policy grad norm": "learners/default_policy/gradients_policy_global_norm",
    "I(X;Z), nats per token": f"{COLLAPSE_RESULTS}/{MUTUAL_INFORMATION}",
    "H(Z|X), nats per token": f"{COLLAPSE_RESULTS}/{CONDITIONAL_ENTROPY}",
}
IN_GROUP_STD = ECHO_TRAP_SIGNALS["in-group reward std"]
# Success on the fixed evaluation seeds (step 0: before RL) and its 95% Wilson interval.
EVALUATION_SUCCESS = ("evaluation/success_rate", "evaluation/success_rate_low", "evaluation/success_rate_high")
# RLlib's seconds of training up to each iteration.
TRAINING_SECONDS = "time_total_s"
# EchoTrapMonitor signal -> the MLflow metric it reads.
MONITORED_METRICS = {
    REWARD_VARIANCE: IN_GROUP_STD,
    CONDITIONAL_ENTROPY: f"{COLLAPSE_RESULTS}/{CONDITIONAL_ENTROPY}",
    MUTUAL_INFORMATION: f"{COLLAPSE_RESULTS}/{MUTUAL_INFORMATION}",
}
TRAJECTORY_DIR = "trajectories"
RUN_PARAMS = ("env", "llm_model", "advantage_estimator", "n_groups", "group_size", "max_turns", "rollout_frequency")


def list_runs(client: MlflowClient, experiment: str, *, max_runs: int = 20) -> pd.DataFrame:
    """The newest runs of `experiment`: id, name, status, start time and key params.

    Raises:
        KeyError: the experiment does not exist in this tracking store.
    """
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = [e.name for e in client.search_experiments()]
        raise KeyError(f"no MLflow experiment {experiment!r} in this store; it has {names}")
    runs = client.search_runs([found.experiment_id], order_by=["attributes.start_time DESC"], max_results=max_runs)
    rows = [
        {
            "run_id": run.info.run_id,
            "run_name": run.info.run_name,
            "status": run.info.status,
            "start": pd.Timestamp(run.info.start_time, unit="ms"),
            **{name: run.data.params.get(name) for name in RUN_PARAMS},
        }
        for run in runs
    ]
    return pd.DataFrame(rows, columns=["run_id", "run_name", "status", "start", *RUN_PARAMS])


def metric_histories(client: MlflowClient, run_id: str, keys: Sequence[str]) -> pd.DataFrame:
    """Per-iteration values of `keys`: index = iteration (MLflow step), one column
    per key, NaN where a key was not logged at that iteration."""
    columns = {}
    for key in keys:
        history = client.get_metric_history(run_id, key)
        columns[key] = pd.Series({m.step: m.value for m in history}, dtype=float)
    frame = pd.DataFrame(columns, columns=list(keys))
    frame.index.name = "iteration"
    return frame.sort_index()


def echo_trap_warnings(history: pd.DataFrame, rule: EchoTrapSettings | None = None) -> list[tuple[int, str]]:
    """(iteration, warning) for every warning `EchoTrapMonitor` gives, replayed over a run's
    logged curves (`metric_histories` with the `MONITORED_METRICS` columns; NaN = not measured)."""
    monitor = EchoTrapMonitor(rule or EchoTrapSettings())
    columns = {signal: key for signal, key in MONITORED_METRICS.items() if key in history}
    flagged = []
    for iteration, row in history[history.index >= 1].iterrows():  # step 0: the evaluation before training
        for warning in monitor.update({signal: row[key] for signal, key in columns.items()}).values():
            flagged.append((int(iteration), warning))
    return flagged


def plot_signals(histories: Mapping[str, pd.DataFrame], signals: Mapping[str, str] = ECHO_TRAP_SIGNALS) -> Figure:
    """One panel per signal, one line per run (`histories`: run label -> `metric_histories`)."""
    if not histories:
        raise ValueError("no runs to plot: histories is empty")
    figure = Figure(figsize=(11, 3.2 * ((len(signals) + 1) // 2)), layout="constrained")
    axes = figure.subplots((len(signals) + 1) // 2, 2, squeeze=False).ravel()
    for ax, (title, key) in zip(axes, signals.items()):
        for label, frame in histories.items():
            # Measured iterations only: the collapse diagnostics skip most of them.
            curve = frame[key].dropna() if key in frame else pd.Series(dtype=float)
            if not curve.empty:
                ax.plot(curve.index, curve, marker="o", markersize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    for ax in axes[len(signals) :]:
        ax.set_visible(False)
    return figure


def plot_evaluation(histories: Mapping[str, pd.DataFrame], *, against_minutes: bool = False) -> Figure:
    """Evaluation success (0 = before RL), one line per run, each with its 95% interval as a band.

    Args:
        histories: run label -> `metric_histories` of `EVALUATION_SUCCESS`
            (plus `TRAINING_SECONDS` when `against_minutes`).
        against_minutes: x = minutes of training (RLlib's `time_total_s`; 0
            before RL) instead of the iteration.
    """
    figure = Figure(figsize=(8, 3.5), layout="constrained")
    ax = figure.subplots()
    draw_evaluation(ax, histories, against_minutes=against_minutes)
    if ax.get_lines():
        ax.legend(fontsize="small")
    return figure


def draw_evaluation(ax: Axes, histories: Mapping[str, pd.DataFrame], *, against_minutes: bool) -> None:
    """`plot_evaluation`'s panel, on `ax`."""
    success, low, high = EVALUATION_SUCCESS
    for label, frame in histories.items():
        if success not in frame or not frame[success].notna().any():
            continue
        evaluated = frame[frame[success].notna()]
        x = training_minutes(frame).loc[evaluated.index] if against_minutes else evaluated.index
        (line,) = ax.plot(x, evaluated[success], marker="o", markersize=3, label=label)
        ax.fill_between(x, evaluated[low], evaluated[high], color=line.get_color(), alpha=0.2)
    ax.set_title("evaluation success (95% interval)")
    _label_x(ax, against_minutes=against_minutes)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)


# The echo-trap figure's panels after evaluation success: title -> MLflow metric key.
ECHO_TRAP_PANELS: dict[str, str] = {
    "policy entropy": ECHO_TRAP_SIGNALS["policy entropy"],
    "in-group reward std (sampled groups)": IN_GROUP_STD,
}


def plot_echo_trap(runs: Mapping[str, Mapping[str, pd.DataFrame]]) -> Figure:
    """RAGEN's echo-trap figure: per env a row of evaluation success, policy entropy and
    in-group reward spread against minutes of training, one line per run (e.g. StarPO, StarPO-S).

    Args:
        runs: env -> run label -> `metric_histories` of `EVALUATION_SUCCESS`, `TRAINING_SECONDS`
            and the `ECHO_TRAP_PANELS` keys.
    """
    if not runs:
        raise ValueError("no envs to plot: runs is empty")
    figure = Figure(figsize=(13, 3.4 * len(runs)), layout="constrained")
    rows = figure.subplots(len(runs), 1 + len(ECHO_TRAP_PANELS), squeeze=False)
    for axes, (env, histories) in zip(rows, runs.items()):
        draw_evaluation(axes[0], histories, against_minutes=True)
        axes[0].set_title(f"{env}: evaluation success (95% interval)")
        for ax, (title, key) in zip(axes[1:], ECHO_TRAP_PANELS.items()):
            for label, frame in histories.items():
                curve = frame[key].dropna() if key in frame else pd.Series(dtype=float)
                curve = curve[curve.index > 0]  # step 0 is the evaluation before RL: no training signal
                if not curve.empty:
                    ax.plot(training_minutes(frame).loc[curve.index], curve, marker="o", markersize=3, label=label)
            ax.set_title(f"{env}: {title}")
            _label_x(ax, against_minutes=True)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize="small")
    return figure


def _label_x(ax: Axes, *, against_minutes: bool) -> None:
    if against_minutes:
        ax.set_xlabel("minutes of training (0: before RL)")
    else:
        ax.set_xlabel("iteration (0: before RL)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def save_figure(figure: Figure, path: str | Path) -> Path:
    """Writes `figure` as a PNG at `path`, making its folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def training_minutes(frame: pd.DataFrame) -> pd.Series:
    """Minutes of training at each iteration of a `metric_histories` frame with `TRAINING_SECONDS` (0 before RL)."""
    if TRAINING_SECONDS not in frame:
        raise KeyError(f"the history has no {TRAINING_SECONDS!r} column: pass it to metric_histories")
    minutes = frame[TRAINING_SECONDS] / 60.0
    return minutes.where(frame.index > 0, 0.0).interpolate(limit_direction="both")


def trajectory_pages(client: MlflowClient, run_id: str) -> list[str]:
    """Artifact paths of the run's trajectory pages, oldest evaluation first."""
    return sorted(a.path for a in client.list_artifacts(run_id, TRAJECTORY_DIR) if a.path.endswith(".html"))


def read_text_artifact(client: MlflowClient, run_id: str, path: str) -> str:
    """The text of one artifact file of a run."""
    with tempfile.TemporaryDirectory() as scratch:
        local = client.download_artifacts(run_id, path, scratch)
        return Path(local).read_text(encoding="utf-8")
