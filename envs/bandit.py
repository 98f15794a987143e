"""Two-armed bandit as a single-turn text env.

The low arm always pays `low_payoff`; the high arm pays `high_payoff` with
probability `high_prob`, else 0 (defaults: 0.1 vs 1.0 w.p. 0.25, so the high
arm is better in expectation). The arms' order in the text is random per
seed, and each arm is shown with how it pays (small every time / large
only some of the time), not with its mean. Success = the high arm was
picked. Any valid pick ends the episode.
Names: Phoenix (low) / Dragon (high) for training, Trader / Librarian for the
held-out test env.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from envs.base import TextEnv, build_config, match_action


@dataclasses.dataclass(frozen=True)
class BanditConfig:
    """Arm names and payoffs.

    Attributes:
        low_arm: name of the arm that always pays `low_payoff`.
        high_arm: name of the arm that pays `high_payoff` with probability `high_prob`.
        low_payoff, high_payoff: the rewards.
        high_prob: chance that the high arm pays (1.0 makes it deterministic).
    """

    low_arm: str = "Phoenix"
    high_arm: str = "Dragon"
    low_payoff: float = 0.1
    high_payoff: float = 1.0
    high_prob: float = 0.25

    def __post_init__(self) -> None:
        for field in ("low_arm", "high_arm"):
            name = getattr(self, field)
            if not isinstance(name, str) or not name.strip() or name != name.strip():
                raise ValueError(
                    f"{field} must be a non-empty name without outer spaces, got {name!r}"
                )
        if self.low_arm.casefold() == self.high_arm.casefold():
            raise ValueError(f"arm names must differ (ignoring case), got {self.low_arm!r} twice")
        for field in ("low_payoff", "high_payoff"):
            if not math.isfinite(getattr(self, field)):
                raise ValueError(f"{field} must be a finite number, got {getattr(self, field)}")
        if not 0.0 <= self.high_prob <= 1.0:
            raise ValueError(f"high_prob must be in [0, 1], got {self.high_prob}")


class BanditEnv(TextEnv):
    """Pick one of two named slot machines; see the module docstring."""

    config_class = BanditConfig

    def __init__(self, config: BanditConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        self.config: BanditConfig = build_config(BanditConfig, config, overrides)
        self.arm_order: tuple[str, str] | None = None
        self._rng: np.random.Generator | None = None

    @property
    def action_vocabulary(self) -> tuple[str, ...]:
        # Sorted, so the vocabulary never tells which arm is the high one.
        return tuple(sorted((self.config.low_arm, self.config.high_arm)))

    @property
    def instructions(self) -> str:
        first, second = self.action_vocabulary
        return (
            "You are in front of two slot machines and may pull exactly one.\n"
            f"Actions: {first} or {second} (the name of the machine you pull)."
        )

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> dict[str, Any]:
        if options:
            raise ValueError(f"Bandit takes no reset options, got {sorted(options)}")
        arms = (self.config.low_arm, self.config.high_arm)
        self.arm_order = (arms[0], arms[1]) if rng.random() < 0.5 else (arms[1], arms[0])
        self._rng = rng
        return {"success": False}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        cfg = self.config
        arm = match_action(action, (cfg.low_arm, cfg.high_arm))
        if arm is None:
            return 0.0, False, False, {"action_is_valid": False}
        if arm == cfg.low_arm:
            reward = cfg.low_payoff
        else:
            reward = cfg.high_payoff if self._rng.random() < cfg.high_prob else 0.0
        return reward, True, False, {"success": arm == cfg.high_arm, "arm": arm}

    def render_text(self) -> str:
        if self.arm_order is None:
            raise RuntimeError("BanditEnv has no arms yet: call reset() first")
        # Each arm is described by how it pays, never by its mean: which one is
        # better must be learned from the rewards. Because the description, not
        # the name, carries the payout style, a policy that learned it transfers
        # to held-out arm names (bandit_test).
        lines = [f"{arm}: {self._description(arm)}" for arm in self.arm_order]
        return "Two slot machines stand before you.\n" + "\n".join(lines) + "\nWhich machine do you pull?"

    def _description(self, arm: str) -> str:
        if arm == self.config.low_arm:
            return "pays a small reward every time."
        return "pays a large reward, but only some of the time."
