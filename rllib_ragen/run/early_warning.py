"""RAGEN's finding 3 on logged runs: does the in-group reward spread or the policy entropy fall
before success does, by how many iterations, and does the gradient norm spike before an
irreversible collapse? The rules (docs/studies.md):

- Curves are per iteration (MLflow step >= 1), each smoothed by a trailing mean of `SMOOTHING`
  iterations: training success, in-group reward std, policy entropy.
- Collapse: the first iteration where smoothed success is at most half its best so far (a best of at
  least `MIN_PEAK_SUCCESS`) and stays at or below that level to the run's end (irreversible).
- A signal falls at the first iteration where it is at most half its opening level (the mean of its
  first `SMOOTHING` iterations).
- The gradient norm spikes at the first iteration where it exceeds `SPIKE_FACTOR` times the median
  of all iterations before it (at least `SMOOTHING` of them).
- Lead = collapse iteration - signal iteration: positive when the signal came first.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

import pandas as pd

from rllib_ragen.run.analysis import ECHO_TRAP_SIGNALS, IN_GROUP_STD

TRAINING_SUCCESS = ECHO_TRAP_SIGNALS["success rate"]
ENTROPY = ECHO_TRAP_SIGNALS["policy entropy"]
GRAD_NORM = ECHO_TRAP_SIGNALS["policy grad norm"]
EARLY_WARNING_METRICS = (TRAINING_SUCCESS, IN_GROUP_STD, ENTROPY, GRAD_NORM)
SMOOTHING = 3
MIN_PEAK_SUCCESS = 0.2
SPIKE_FACTOR = 3.0


@dataclasses.dataclass(frozen=True)
class WarningTimes:
    """The iterations of one run's events (None: it did not happen)."""

    run: str
    collapse: int | None
    spread_fall: int | None
    entropy_fall: int | None
    grad_spike: int | None

    def lead(self, signal: int | None) -> int | None:
        """Iterations from `signal` to the collapse (positive: the signal came first)."""
        return None if self.collapse is None or signal is None else self.collapse - signal


def warning_times(run: str, history: pd.DataFrame) -> WarningTimes:
    """The events of one run (`metric_histories` with the `EARLY_WARNING_METRICS` columns)."""
    training = history[history.index >= 1]  # step 0: the evaluation before RL

    def curve(key: str) -> pd.Series:
        return training[key].dropna() if key in training else pd.Series(dtype=float)

    return WarningTimes(
        run=run,
        collapse=collapse_iteration(curve(TRAINING_SUCCESS)),
        spread_fall=fall_iteration(curve(IN_GROUP_STD)),
        entropy_fall=fall_iteration(curve(ENTROPY)),
        grad_spike=spike_iteration(curve(GRAD_NORM)),
    )


def collapse_iteration(success: pd.Series) -> int | None:
    """The first iteration where smoothed success halves from its best and never recovers."""
    smooth = success.rolling(SMOOTHING, min_periods=1).mean()
    best = smooth.cummax()
    for iteration, value in smooth.items():
        peak = best[iteration]
        if peak >= MIN_PEAK_SUCCESS and value <= peak / 2 and (smooth.loc[iteration:] <= peak / 2).all():
            return int(iteration)
    return None


def fall_iteration(signal: pd.Series) -> int | None:
    """The first iteration where the smoothed signal is at most half its opening level."""
    if len(signal) < SMOOTHING:
        return None
    opening = signal.iloc[:SMOOTHING].mean()
    smooth = signal.rolling(SMOOTHING, min_periods=1).mean()
    fallen = smooth[(smooth.index > signal.index[SMOOTHING - 1]) & (smooth <= opening / 2)]
    return None if opening <= 0 or fallen.empty else int(fallen.index[0])


def spike_iteration(grad_norm: pd.Series) -> int | None:
    """The first iteration whose gradient norm exceeds `SPIKE_FACTOR` x the median before it."""
    values = list(grad_norm.items())
    for position in range(SMOOTHING, len(values)):
        iteration, value = values[position]
        if value > SPIKE_FACTOR * statistics.median(v for _, v in values[:position]):
            return int(iteration)
    return None


def early_warning_verdict(times: Sequence[WarningTimes]) -> str:
    """One line: over the collapsing runs, how often (and how many iterations early) each signal came
    first; and the false alarms, signals that fell in runs that never collapsed."""
    collapsed = [t for t in times if t.collapse is not None]
    steady = [t for t in times if t.collapse is None]
    if not collapsed:
        return f"NOT TESTABLE: none of the {len(times)} runs collapsed (no irreversible halving of success)"
    parts = []
    for name in ("spread_fall", "entropy_fall", "grad_spike"):
        leads = [t.lead(getattr(t, name)) for t in collapsed]
        ahead = [lead for lead in leads if lead is not None and lead > 0]
        parts.append(
            f"{name.replace('_', ' ')} first in {len(ahead)}/{len(collapsed)}"
            + (f" (median {statistics.median(ahead):g} iterations early)" if ahead else "")
        )
    both_first = sum(
        1
        for t in collapsed
        if any((lead := t.lead(getattr(t, name))) is not None and lead > 0 for name in ("spread_fall", "entropy_fall"))
    )
    word = "REPRODUCED" if both_first == len(collapsed) else "NOT REPRODUCED"
    alarms = sum(1 for t in steady if t.spread_fall is not None or t.entropy_fall is not None)
    return (
        f"{word}: {len(collapsed)} of {len(times)} runs collapsed; spread or entropy fell first in "
        f"{both_first}/{len(collapsed)}; " + "; ".join(parts) + f"; false alarms: {alarms}/{len(steady)} steady runs"
    )
