"""Echo-trap detection: warns when in-group reward spread collapses.

RAGEN's early signal of the Echo Trap (the policy collapsing into one
repetitive answer template) is the in-group reward std falling far below its
early level. `EchoTrapMonitor` takes the mean of the first `window` values as
the baseline and warns once the value has stayed below `ratio` x baseline for
`window` consecutive iterations (RAGEN stops there; we warn and keep going).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class EchoTrapMonitor:
    """Tracks in-group reward std per iteration.

    Args:
        window: Iterations in the baseline, and consecutive low iterations before a warning.
        ratio: A value below `ratio * baseline` counts as collapsed.
    """

    window: int = 10
    ratio: float = 0.1
    _history: list[float] = dataclasses.field(default_factory=list)
    _low_streak: int = 0

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"echo-trap window must be >= 1, got {self.window}")
        if not 0 < self.ratio < 1:
            raise ValueError(f"echo-trap ratio must be in (0, 1), got {self.ratio}")

    @property
    def baseline(self) -> float | None:
        if len(self._history) < self.window:
            return None
        return sum(self._history[: self.window]) / self.window

    def update(self, in_group_std: float) -> str | None:
        """Records one iteration; returns a warning text while the trap persists."""
        self._history.append(float(in_group_std))
        baseline = self.baseline
        if baseline is None or len(self._history) <= self.window:
            return None
        self._low_streak = self._low_streak + 1 if in_group_std < self.ratio * baseline else 0
        if self._low_streak < self.window:
            return None
        return (
            f"echo trap: in-group reward std {in_group_std:.4f} has stayed below "
            f"{self.ratio:g} x its early mean {baseline:.4f} for {self._low_streak} iterations; "
            "the policy may have collapsed to one answer template (consider stopping, "
            "a larger rollout_filter_ratio or a higher temperature)"
        )
