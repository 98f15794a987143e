"""Corridor: a deterministic multi-turn text MDP whose only reward comes at the end.

The player stands `distance` cells to the left of the goal in a one-row
corridor; each seed draws the corridor's length and where the pair sits in it,
so every seed renders differently. One valid move per turn (`Left` or
`Right`; a move into the end wall stays put), and the reward is 1 on reaching
the goal, else 0, with nothing in between. With one action a turn the goal
takes at least `distance` turns: a learning test of the multi-turn update
(credit must reach the first turn from a reward that comes only after the
last), small enough for a tiny model. A random player with `max_turns ==
distance` succeeds with probability 2**-distance.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from envs.base import TextEnv, build_config, match_action

ACTIONS: tuple[str, ...] = ("Left", "Right")

INSTRUCTIONS = (
    "You are in a corridor: walk to the goal.\n"
    "Symbols: P you, _ floor, G goal, # wall.\n"
    "Actions: Left, Right. Each moves you one cell."
)


# The prompt draws every cell of the corridor: a longer one is no prompt a model can read.
MAX_DISTANCE = 100


@dataclasses.dataclass(frozen=True)
class CorridorConfig:
    """Corridor layout.

    Attributes:
        distance: Cells between the player's start and the goal (moves needed).
        max_padding: Most extra floor cells drawn per seed on each side of the pair.
        max_steps: Valid moves before the episode is truncated.
    """

    distance: int = 3
    max_padding: int = 3
    max_steps: int = 20

    def __post_init__(self) -> None:
        if not 1 <= self.distance <= MAX_DISTANCE:
            raise ValueError(
                f"distance must be between 1 and {MAX_DISTANCE} (the prompt shows every cell), got {self.distance}"
            )
        if self.max_padding < 0:
            raise ValueError(f"max_padding must be >= 0, got {self.max_padding}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")


class CorridorEnv(TextEnv):
    """A one-row corridor; the goal lies `distance` cells to the player's right."""

    config_class = CorridorConfig

    def __init__(self, config: CorridorConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        self.config: CorridorConfig = build_config(CorridorConfig, config, overrides)
        self.length = self.position = self.goal = self.num_steps = 0

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    @property
    def action_vocabulary(self) -> tuple[str, ...]:
        return ACTIONS

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> dict[str, Any]:
        if options:
            raise ValueError(f"Corridor takes no reset options, got {sorted(options)}")
        left, right = (int(x) for x in rng.integers(0, self.config.max_padding + 1, size=2))
        self.length = left + self.config.distance + 1 + right
        self.position, self.goal = left, left + self.config.distance
        self.num_steps = 0
        return {"success": False}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        name = match_action(action, ACTIONS)
        if name is None:
            return 0.0, False, False, {"action_is_valid": False}
        before = self.position
        self.position = int(np.clip(self.position + (1 if name == "Right" else -1), 0, self.length - 1))
        self.num_steps += 1
        success = self.position == self.goal
        truncated = not success and self.num_steps >= self.config.max_steps
        info = {"success": success, "action_is_effective": self.position != before}
        return float(success), success, truncated, info

    def render_text(self) -> str:
        cells = ["_"] * self.length
        cells[self.goal] = "G"
        cells[self.position] = "P"
        return "#" + "".join(cells) + "#"

    def optimal_action(self) -> str:
        """The move that brings the player closer to the goal (for demonstrations)."""
        return "Right" if self.goal > self.position else "Left"
