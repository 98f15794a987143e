"""A study's answer, read back from MLflow: its figure (success with 95% intervals, entropy,
in-group reward spread and gradient norm against minutes, per arm), a markdown table of its
trials and one verdict line per question (`rllib_ragen.run.study_verdicts`,
`rllib_ragen.run.early_warning`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from rllib_ragen.intervals import wilson_interval
from rllib_ragen.run.analysis import EVALUATION_SUCCESS, TRAINING_SECONDS, metric_histories, training_minutes
from rllib_ragen.run.early_warning import (
    EARLY_WARNING_METRICS,
    ENTROPY,
    GRAD_NORM,
    IN_GROUP_STD,
    early_warning_verdict,
    warning_times,
)
from rllib_ragen.run.study import ARM_TAG, SEED_TAG, STUDY_TAG, Compare, EarlyWarning, Study
from rllib_ragen.run.study_verdicts import ArmOutcome, verdict

# The figure's panels after evaluation success: title -> MLflow metric key.
TRAINING_PANELS = {"policy entropy": ENTROPY, "in-group reward std": IN_GROUP_STD, "policy grad norm": GRAD_NORM}
HISTORY_KEYS = (*EVALUATION_SUCCESS, TRAINING_SECONDS, *EARLY_WARNING_METRICS)


@dataclasses.dataclass(frozen=True)
class TrialRun:
    """One trial's MLflow run: its arm, training seed and env, status, evaluation size and curves."""

    arm: str
    seed: int
    env: str
    run_id: str
    status: str
    eval_size: int
    history: pd.DataFrame

    @property
    def final_successes(self) -> int | None:
        """Successes of the trial's last evaluation on the fixed seeds (None: not finished)."""
        evaluated = self.history[EVALUATION_SUCCESS[0]].dropna()
        if self.status != "FINISHED" or evaluated.empty:
            return None
        return round(float(evaluated.iloc[-1]) * self.eval_size)


def study_runs(client: MlflowClient, experiment: str, study: str | None = None) -> list[Run]:
    """The (active) MLflow runs of `study`, or of every study when None."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise KeyError(f"no MLflow experiment {experiment!r} in this store")
    query = f"tags.`{STUDY_TAG}` = '{study}'" if study else ""
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs([found.experiment_id], filter_string=query, max_results=1000, page_token=token)
        runs.extend(run for run in page if STUDY_TAG in run.data.tags)
        token = page.token
        if not token:
            return runs


def read_trials(
    client: MlflowClient, experiment: str, study: Study, keys: Sequence[str] = HISTORY_KEYS
) -> list[TrialRun]:
    """The study's trial runs with their curves.

    Raises:
        ValueError: two runs for one trial (arm, seed, env): the store holds a duplicate.
    """
    trials = [
        TrialRun(
            arm=run.data.tags[ARM_TAG],
            seed=int(run.data.tags[SEED_TAG]),
            env=run.data.tags["env"],
            run_id=run.info.run_id,
            status=run.info.status,
            eval_size=int(run.data.params["eval_size"]),
            history=metric_histories(client, run.info.run_id, [*keys, *study.extra_panels.values()]),
        )
        for run in study_runs(client, experiment, study.name)
    ]
    twice = [key for key, count in Counter((t.arm, t.seed, t.env) for t in trials).items() if count > 1]
    if twice:
        raise ValueError(f"study {study.name} has more than one MLflow run for the trials (arm, seed, env) {twice}")
    return trials


def arm_outcome(trials: Sequence[TrialRun], arm: str, env: str) -> ArmOutcome:
    """An arm's finished trials on `env` as an `ArmOutcome` (the evaluation size of its trials)."""
    mine = [t for t in trials if t.arm == arm and t.env == env]
    finished = {t.seed: t.final_successes for t in mine if t.final_successes is not None}
    eval_sizes = {t.eval_size for t in mine}
    if len(eval_sizes) > 1:
        raise ValueError(f"arm {arm} on {env}: its trials evaluated on different numbers of seeds {eval_sizes}")
    return ArmOutcome(arm, finished, eval_sizes.pop() if eval_sizes else 1)


def verdict_lines(client: MlflowClient, experiment: str, study: Study, trials: Sequence[TrialRun]) -> list[str]:
    """One line per question (and env, for comparisons)."""
    lines = []
    for question in study.all_questions:
        if isinstance(question, Compare):
            for env in study.envs:
                outcome = verdict(
                    question, arm_outcome(trials, question.arm, env), arm_outcome(trials, question.baseline, env)
                )
                lines.append(f"{study.name} on {env}: {question.text} {outcome}")
        elif isinstance(question, EarlyWarning):
            everything = study_runs(client, experiment)
            times = [
                warning_times(run.info.run_name, metric_histories(client, run.info.run_id, EARLY_WARNING_METRICS))
                for run in everything
                if run.info.status == "FINISHED"
            ]
            lines.append(f"{study.name} (all study runs): {question.text} {early_warning_verdict(times)}")
    return lines


def trials_table(trials: Sequence[TrialRun]) -> str:
    """A markdown table, a row per trial: final success [95%], minutes, iterations, last entropy and spread."""
    columns = ["env", "arm", "seed", "status", "iterations", "minutes", "final eval success [95%]", "entropy"]
    columns += ["in-group std", "max grad norm"]
    rows = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    for t in sorted(trials, key=lambda t: (t.env, t.arm, t.seed)):
        history = t.history[t.history.index >= 1]
        success = t.final_successes
        rate = "-" if success is None else _rate(success, t.eval_size)
        minutes = history[TRAINING_SECONDS].dropna().max() / 60 if not history.empty else float("nan")
        rows.append(
            f"| {t.env} | {t.arm} | {t.seed} | {t.status} | {len(history)} | {minutes:.1f} | {rate} | "
            f"{_last(history, ENTROPY)} | {_last(history, IN_GROUP_STD)} | {_max(history, GRAD_NORM)} |"
        )
    return "\n".join(rows)


def _rate(successes: int, n: int) -> str:
    low, high = wilson_interval(successes, n)
    return f"{successes / n:.3f} [{low:.3f}, {high:.3f}]"


def _last(history: pd.DataFrame, key: str) -> str:
    values = history[key].dropna() if key in history else pd.Series(dtype=float)
    return "-" if values.empty else f"{values.iloc[-1]:.3f}"


def _max(history: pd.DataFrame, key: str) -> str:
    values = history[key].dropna() if key in history else pd.Series(dtype=float)
    return "-" if values.empty else f"{values.max():.3f}"


def plot_study(study: Study, trials: Sequence[TrialRun]) -> Figure:
    """A row per env: evaluation success per arm (pooled over seeds, 95% interval), then entropy,
    in-group reward std, grad norm (and the study's extra panels), a line per trial, against minutes."""
    panels = {**TRAINING_PANELS, **study.extra_panels}
    figure = Figure(figsize=(4.2 * (1 + len(panels)), 3.4 * len(study.envs)), layout="constrained")
    rows = figure.subplots(len(study.envs), 1 + len(panels), squeeze=False)
    colours = {arm: f"C{i % 10}" for i, arm in enumerate(study.arms)}
    for axes, env in zip(rows, study.envs):
        mine = [t for t in trials if t.env == env]
        draw_pooled_success(axes[0], mine, colours)
        axes[0].set_title(f"{env}: evaluation success (95%, seeds pooled)")
        for ax, (title, key) in zip(axes[1:], panels.items()):
            for t in mine:
                curve = t.history[key].dropna() if key in t.history else pd.Series(dtype=float)
                curve = curve[curve.index > 0]
                if not curve.empty:
                    ax.plot(training_minutes(t.history).loc[curve.index], curve, color=colours[t.arm], alpha=0.7)
            ax.set_title(f"{env}: {title}")
        for ax in axes:
            ax.set_xlabel("minutes of training")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize="small")
    figure.suptitle(f"{study.name}: {study.question}")
    return figure


def draw_pooled_success(ax: Axes, trials: Sequence[TrialRun], colours: Mapping[str, str]) -> None:
    """Per arm, pooled success over its seeds and its Wilson band, at the mean minute of each seed's
    k-th evaluation (`aligned_evaluations`)."""
    for arm, colour in colours.items():
        mine = [t for t in trials if t.arm == arm]
        if not mine:
            continue
        minutes, successes = aligned_evaluations(mine)
        n = sum(t.eval_size for t in mine)
        counts = (successes * [t.eval_size for t in mine]).round().sum(axis=1)
        bands = [wilson_interval(float(count), n) for count in counts]
        x = minutes.mean(axis=1)
        ax.plot(x, counts / n, marker="o", markersize=3, color=colour, label=arm)
        ax.fill_between(x, [b[0] for b in bands], [b[1] for b in bands], color=colour, alpha=0.2)
    ax.set_ylim(-0.02, 1.02)


def aligned_evaluations(trials: Sequence[TrialRun]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(minutes, success) [evaluations x trials] of each trial's k-th evaluation, k below the fewest any
    trial made, the last row each trial's final evaluation: with time budgets the seeds evaluate at
    different iterations, and their finals must still be compared."""
    series = [t.history[EVALUATION_SUCCESS[0]].dropna() for t in trials]
    fewest = min(len(s) for s in series)
    if fewest == 0:
        return pd.DataFrame(), pd.DataFrame()
    rows = [[*range(fewest - 1), len(s) - 1] for s in series]
    successes = pd.DataFrame({i: s.iloc[r].to_numpy() for i, (s, r) in enumerate(zip(series, rows))})
    minutes = pd.DataFrame(
        {
            i: training_minutes(t.history).loc[s.index[r]].to_numpy()
            for i, (t, s, r) in enumerate(zip(trials, series, rows))
        }
    )
    return minutes, successes


@dataclasses.dataclass(frozen=True)
class StudyReport:
    """Where the figure and the table went, and the verdict lines."""

    figure: Path
    table: Path
    verdicts: list[str]


def report_study(client: MlflowClient, experiment: str, study: Study, directory: Path) -> StudyReport:
    """Reads the study's runs back, writes `<directory>/figure.png` and `report.md` (question,
    verdicts, trials table); returns them with the verdict lines."""
    trials = read_trials(client, experiment, study)
    if not trials:
        raise ValueError(f"no MLflow run of study {study.name} in experiment {experiment!r}")
    directory.mkdir(parents=True, exist_ok=True)
    figure_path, table_path = directory / "figure.png", directory / "report.md"
    plot_study(study, trials).savefig(figure_path, dpi=110)
    lines = verdict_lines(client, experiment, study, trials)
    table_path.write_text(
        f"# {study.name}: {study.question}\n\n"
        + "\n".join(f"- {line}" for line in lines)
        + f"\n\n![{study.name}](figure.png)\n\n{trials_table(trials)}\n"
    )
    return StudyReport(figure_path, table_path, lines)
