"""Two-armed bandit as a single-turn text env, with arms known by name only.

Each reset draws one (low-risk, high-risk) pair of names from `arm_pairs` and
shows the two names in random order. Nothing in the text says how an arm
pays: the model is asked to judge that from what each name stands for (RAGEN-2's
set-up: a steady profession against a risky one), and must otherwise learn it
from the rewards. The low arm always pays `low_payoff`; the high arm pays
`high_payoff` with probability `high_prob`, else 0 (defaults: 0.1 vs 1.0 w.p.
0.25, so the high-risk arm is better in expectation). Success = the high arm was
picked. Any valid pick ends the episode. Payouts come from `dynamics_rng`
(see `envs.base`), so group members may draw their own.

Name sets (facts from RAGEN's repositories and paper): `TRAIN_PAIRS` and
`TEST_PAIRS` are RAGEN-2's 12 training and 8 held-out profession pairs;
`PHOENIX_DRAGON` is RAGEN v1's pair, whose low arm pays `V1_LOW_PAYOFF`.
`describe_payouts=True` adds how each arm pays to the state: a reading task,
kept only as an explicit option.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from envs.base import TextEnv, build_config, match_action

# (low-risk arm, high-risk arm)
TRAIN_PAIRS: tuple[tuple[str, str], ...] = (
    ("Teacher", "Trader"),
    ("Nurse", "StartupFounder"),
    ("Librarian", "Investor"),
    ("Accountant", "StockBroker"),
    ("Engineer", "RealEstateAgent"),
    ("Pharmacist", "Musician"),
    ("Clerk", "Freelancer"),
    ("Technician", "Youtuber"),
    ("Planner", "Artist"),
    ("Postman", "Pilot"),
    ("Banker", "VentureCapitalist"),
    ("Gardener", "Cryptominer"),
)
TEST_PAIRS: tuple[tuple[str, str], ...] = (
    ("Receptionist", "Explorer"),
    ("Archivist", "Filmmaker"),
    ("Bookkeeper", "Consultant"),
    ("SocialWorker", "Photographer"),
    ("Mechanic", "GameDesigner"),
    ("Secretary", "Entrepreneur"),
    ("Cashier", "DataScientist"),
    ("CivilServant", "StartupAccelerator"),
)
PHOENIX_DRAGON: tuple[tuple[str, str], ...] = (("Phoenix", "Dragon"),)
V1_LOW_PAYOFF = 0.15

INSTRUCTIONS = (
    "You stand before two slot machines and may pull exactly one.\n"
    "Each machine is named after something, and the way it pays out is in keeping with "
    "what its name stands for. Think about what each name symbolises to judge how its "
    "payouts behave, then pull the machine you expect to pay more on average.\n"
    "Action: the name of the machine you pull, spelled as in the state."
)


@dataclasses.dataclass(frozen=True)
class BanditConfig:
    """Arm names and payoffs.

    Attributes:
        arm_pairs: (low-risk name, high-risk name) pairs; each reset draws one.
            Every name appears once over all pairs (case-insensitively).
        low_payoff: what the low arm always pays.
        high_payoff: what the high arm pays when it pays.
        high_prob: chance that the high arm pays (1.0 makes it deterministic).
        describe_payouts: also state how each arm pays (gives the answer away).
    """

    arm_pairs: tuple[tuple[str, str], ...] = TRAIN_PAIRS
    low_payoff: float = 0.1
    high_payoff: float = 1.0
    high_prob: float = 0.25
    describe_payouts: bool = False

    def __post_init__(self) -> None:
        pairs = tuple(tuple(pair) for pair in self.arm_pairs)
        if not pairs or any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"arm_pairs must be one or more (low, high) name pairs, got {self.arm_pairs!r}")
        object.__setattr__(self, "arm_pairs", pairs)
        names = [name for pair in pairs for name in pair]
        for name in names:
            if not isinstance(name, str) or not name.strip() or name != name.strip():
                raise ValueError(f"arm_pairs: every name must be non-empty without outer spaces, got {name!r}")
        folded = [name.casefold() for name in names]
        repeated = sorted({name for name in names if folded.count(name.casefold()) > 1})
        if repeated:
            raise ValueError(f"arm_pairs: each name may appear once (ignoring case), repeated: {repeated}")
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
        self.pair: tuple[str, str] | None = None  # (low, high) of this episode
        self.arm_order: tuple[str, str] | None = None  # as shown

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    @property
    def action_vocabulary(self) -> tuple[str, ...]:
        # Every name of every pair, sorted: the vocabulary never tells which arm is the high one.
        return tuple(sorted(name for pair in self.config.arm_pairs for name in pair))

    @property
    def available_actions(self) -> tuple[str, ...]:
        return self.action_vocabulary if self.pair is None else tuple(sorted(self.pair))

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> dict[str, Any]:
        if options:
            raise ValueError(f"Bandit takes no reset options, got {sorted(options)}")
        pairs = self.config.arm_pairs
        self.pair = pairs[int(rng.integers(len(pairs)))]
        low, high = self.pair
        self.arm_order = (low, high) if rng.random() < 0.5 else (high, low)
        return {"success": False}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        cfg = self.config
        assert self.pair is not None and self.dynamics_rng is not None, "TextEnv.step steps only after reset"
        low, high = self.pair
        arm = match_action(action, self.pair)
        if arm is None:
            return 0.0, False, False, {"action_is_valid": False}
        if arm == low:
            reward = cfg.low_payoff
        else:
            reward = cfg.high_payoff if self.dynamics_rng.random() < cfg.high_prob else 0.0
        return reward, True, False, {"success": arm == high, "arm": arm}

    def render_text(self) -> str:
        if self.arm_order is None:
            raise RuntimeError("BanditEnv has no arms yet: call reset() first")
        first, second = self.arm_order
        lines = [f"Two slot machines stand before you: {first} and {second}."]
        if self.config.describe_payouts:
            lines += [f"{arm}: {self._payout_description(arm)}" for arm in (first, second)]
        return "\n".join([*lines, "Which machine do you pull?"])

    def _payout_description(self, arm: str) -> str:
        assert self.pair is not None, "render_text describes arms only after reset"
        if arm == self.pair[0]:
            return "pays a small reward every time."
        return "pays a large reward, but only some of the time."
