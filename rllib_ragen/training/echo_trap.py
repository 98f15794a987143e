"""Echo-trap detection: warns when a collapse signal stays far below its early level.

RAGEN's Echo Trap is the policy collapsing into repetitive reasoning; RAGEN-2
tells its kinds apart. `EchoTrapMonitor` watches one signal per kind:

- reward-variance collapse: the in-group reward std (every iteration); groups
  no longer disagree, so StarPO has no signal left (RAGEN's early warning);
- entropy collapse: H(Z|X), the reasoning's conditional entropy
  (`rllib_ragen.training.collapse_metrics`, every few iterations);
- template collapse: I(X;Z), how much the reasoning depends on the prompt.

Rule (`EchoTrapSettings`), per signal: its early level is the mean of what was
measured in the monitor's first `baseline_iters` iterations; a later
measurement below `ratio` x that level is low, and `patience` low
measurements in a row raise the warning, repeated while the signal stays low.
A short baseline and a streak, rather than RAGEN's 10 + 10 iterations, let a
20-iteration run warn on a spread that collapses within it, while single or
paired dips of a healthy run do not (tests/training/test_echo_trap.py). A signal whose
early level is not positive cannot fall below it and never warns.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Mapping

from rllib_ragen.training.collapse_metrics import (
    CONDITIONAL_ENTROPY,
    MUTUAL_INFORMATION,
)

REWARD_VARIANCE = "reward_variance"
# Signal -> (the collapse it shows, what it measures, what its collapse means).
COLLAPSE_SIGNALS: dict[str, tuple[str, str, str]] = {
    REWARD_VARIANCE: (
        "reward-variance collapse",
        "in-group reward std",
        "groups no longer disagree in reward, so updates carry no signal (or every trajectory already succeeds)",
    ),
    CONDITIONAL_ENTROPY: (
        "entropy collapse",
        "H(Z|X)",
        "the model writes nearly the same reasoning every time for a given prompt",
    ),
    MUTUAL_INFORMATION: (
        "template collapse",
        "I(X;Z)",
        "the reasoning no longer depends on the prompt: one template for every input",
    ),
}


@dataclasses.dataclass(frozen=True)
class EchoTrapSettings:
    """When a signal counts as collapsed (`StarPOConfig.diagnostics()` sets these as `echo_trap_<name>`).

    Each field is documented where `StarPOConfig.diagnostics()` sets it (as `echo_trap_<field>`).
    """

    baseline_iters: int = 3
    patience: int = 3
    ratio: float = 0.2

    def __post_init__(self) -> None:
        for name in ("baseline_iters", "patience"):
            if getattr(self, name) < 1:
                raise ValueError(f"echo_trap_{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.ratio < 1:
            raise ValueError(f"echo_trap_ratio must be in (0, 1), got {self.ratio}")


class EchoTrapMonitor:
    """Applies an `EchoTrapSettings` to every signal of `COLLAPSE_SIGNALS`, one `update` per iteration."""

    def __init__(self, rule: EchoTrapSettings = EchoTrapSettings()) -> None:
        self.rule = rule
        self._iterations = 0
        self._early: dict[str, list[float]] = defaultdict(list)
        self._low_streak: dict[str, int] = defaultdict(int)

    def baseline(self, signal: str) -> float | None:
        """The signal's early level, once the baseline iterations are over and it was measured in them."""
        values = self._early[signal]
        if self._iterations < self.rule.baseline_iters or not values:
            return None
        return sum(values) / len(values)

    def update(self, measurements: Mapping[str, float | None]) -> dict[str, str]:
        """Records one iteration; returns {signal: warning} for every signal that has collapsed.

        Args:
            measurements: Signal name (a `COLLAPSE_SIGNALS` key) -> this iteration's
                value; None, NaN or a missing name = not measured this iteration.
        """
        unknown = set(measurements) - set(COLLAPSE_SIGNALS)
        if unknown:
            raise ValueError(f"unknown echo-trap signals {sorted(unknown)}; known: {sorted(COLLAPSE_SIGNALS)}")
        self._iterations += 1
        warnings = {}
        for signal, value in measurements.items():
            if value is None or not math.isfinite(value):
                continue
            if self._iterations <= self.rule.baseline_iters:
                self._early[signal].append(float(value))
                continue
            baseline = self.baseline(signal)
            if baseline is None or baseline <= 0:
                continue
            low = value < self.rule.ratio * baseline
            self._low_streak[signal] = self._low_streak[signal] + 1 if low else 0
            if self._low_streak[signal] >= self.rule.patience:
                warnings[signal] = self._warning(signal, value, baseline)
        return warnings

    def _warning(self, signal: str, value: float, baseline: float) -> str:
        kind, measure, meaning = COLLAPSE_SIGNALS[signal]
        return (
            f"echo trap, {kind}: {measure} {value:.4g} has stayed below {self.rule.ratio:g} x its early level "
            f"{baseline:.4g} for {self._low_streak[signal]} measurements; {meaning}. Consider stopping, "
            "rollout_filter_strategy='top_p' or a higher temperature"
        )
