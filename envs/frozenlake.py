"""FrozenLake as a text env, on top of gymnasium's FrozenLakeEnv.

Each seed draws a map: every cell is frozen with probability `p_frozen`, the
start and goal are random distinct cells, and the map is redrawn until the
goal is reachable without crossing a hole. On slippery ice a move goes the
intended way with probability 1/3 and to either perpendicular side otherwise
(gymnasium's dynamics). Reward 1 on reaching the goal, else 0; the episode
ends in a hole or at the goal, and is truncated after `max_steps` valid moves.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake

from envs.base import REPEATED_NO_OP, TextEnv, build_config, check_cell_separator, match_action
from envs.board import Board, Move
from envs.frozenlake_words import DIRECTIONS, describe
from envs.no_effect_note import check_note_no_effect, last_no_op, with_note

# gymnasium's action indices: 0 Left, 1 Down, 2 Right, 3 Up.
ACTIONS: tuple[str, ...] = ("Left", "Down", "Right", "Up")
MAX_MAP_TRIES = 1000

# gymnasium map letter -> symbol without / with the player on it.
_SYMBOLS = {"S": ("_", "P"), "F": ("_", "P"), "H": ("O", "X"), "G": ("G", "√")}
# gymnasium map letter -> `envs.board.TERRAIN` letter.
_TERRAIN = {"S": ".", "F": ".", "H": "H", "G": "G"}
HOLE = "hole"
# A move's direction -> its action name.
_ACTION_OF = {(d_row, d_col): name for name, d_row, d_col in DIRECTIONS}

# How the state is shown: RAGEN's symbol grid, or sentences relative to the player (`envs.frozenlake_words`).
RENDERS = ("grid", "words")
_TASK = "You are walking on a frozen lake: reach the goal without falling into a hole.\n"
_LEGENDS = {
    "grid": "Symbols: P you, _ frozen ice, O hole, G goal, X you fell into a hole, √ you reached the goal.\n",
    "words": "",  # the words render explains itself
}
_ICE = {
    True: "The ice is slippery: you may slide to a side instead of moving where you intended.",
    False: "The ice is not slippery.",
}


@dataclasses.dataclass(frozen=True)
class FrozenLakeConfig:
    """Map generation and dynamics.

    Attributes:
        size: the map is size x size.
        p_frozen: probability that a cell is frozen (else a hole).
        is_slippery: moves go the intended way only with probability 1/3.
        max_steps: valid moves before the episode is truncated.
        cell_separator: what joins the cells of a rendered row, one of
            `envs.base.CELL_SEPARATORS`: "" (RAGEN's render) or " " (one token a cell).
        render: "grid" (RAGEN's symbols) or "words" (the goal, the neighbouring
            cells and the holes in steps from the player; `envs.frozenlake_words`).
        note_no_effect: after a move that changed nothing, the state ends in a line
            saying so and why (`envs.no_effect_note`), e.g. "Your last move, Down,
            changed nothing: the edge of the lake is there."
    """

    size: int = 4
    p_frozen: float = 0.8
    is_slippery: bool = True
    max_steps: int = 100
    cell_separator: str = ""
    render: str = "grid"
    note_no_effect: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.size, numbers.Integral) or self.size < 2:
            raise ValueError(f"size must be an int >= 2, got {self.size!r}")
        if not 0.0 < self.p_frozen <= 1.0:
            raise ValueError(f"p_frozen must be in (0, 1], got {self.p_frozen}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        check_cell_separator(self.cell_separator)
        if self.render not in RENDERS:
            raise ValueError(f"render must be one of {RENDERS}, got {self.render!r}")
        check_note_no_effect(self.note_no_effect)


class FrozenLakeEnv(TextEnv):
    """FrozenLake with a random reachable map per seed.

    `reset(options={"desc": rows})` plays a given map instead (gymnasium's
    letters: S start, F frozen, H hole, G goal; one S and one G).
    """

    config_class = FrozenLakeConfig
    failure_kinds: ClassVar[Mapping[str, str]] = {
        HOLE: "fell into a hole",
        # The lake has no walls: a move that changes nothing walks into the edge.
        REPEATED_NO_OP: "stuck against an edge: the last moves (two or more) walked into the lake's edge",
    }

    def __init__(self, config: FrozenLakeConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        self.config: FrozenLakeConfig = build_config(FrozenLakeConfig, config, overrides)
        self.lake: GymFrozenLake | None = None
        self.num_steps = 0
        self.moves: list[Move] = []

    @property
    def instructions(self) -> str:
        return f"{_TASK}{_LEGENDS[self.config.render]}Actions: Left, Down, Right, Up. {_ICE[self.config.is_slippery]}"

    @property
    def action_vocabulary(self) -> tuple[str, ...]:
        return ACTIONS

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(options) - {"desc"})
        if unknown:
            raise ValueError(f"unknown FrozenLake reset option(s) {unknown}; accepted: ['desc']")
        if "desc" in options:
            desc = check_desc(options["desc"])
        else:
            desc = generate_map(rng, size=self.config.size, p_frozen=self.config.p_frozen)
        self.lake = GymFrozenLake(desc=list(desc), is_slippery=self.config.is_slippery)
        # The slips: gymnasium's lake draws them from its own generator, seeded here.
        assert self.dynamics_rng is not None, "TextEnv.reset sets dynamics_rng before _reset"
        self.lake.reset(seed=int(self.dynamics_rng.integers(2**63)))
        self.num_steps = 0
        self.moves = []
        return {"success": False}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        name = match_action(action, ACTIONS)
        if name is None:
            return 0.0, False, False, {"action_is_valid": False, "action_is_effective": False}
        assert self.lake is not None, "TextEnv.step steps only after reset"
        before = int(self.lake.s)
        _, reward, terminated, _, _ = self.lake.step(ACTIONS.index(name))
        self.num_steps += 1
        effective = int(self.lake.s) != before
        _, d_row, d_col = DIRECTIONS[ACTIONS.index(name)]
        row, col = divmod(before, self.lake.ncol)
        self.moves.append(Move(row, col, d_row, d_col, effective=effective))
        truncated = not terminated and self.num_steps >= self.config.max_steps
        info = {"action_is_effective": effective, "success": reward > 0}
        return float(reward), bool(terminated), truncated, info

    def board(self) -> Board:
        if self.lake is None:
            raise RuntimeError("FrozenLakeEnv has no map yet: call reset() first")
        desc = self.lake.desc.astype(str)
        player = divmod(int(self.lake.s), self.lake.ncol)
        return Board(
            terrain=tuple("".join(_TERRAIN[ch] for ch in row) for row in desc),
            player=player,
            moves=tuple(self.moves),
            fault=HOLE if desc[player] == "H" else None,
        )

    def render_text(self) -> str:
        if self.lake is None:
            raise RuntimeError("FrozenLakeEnv has no map yet: call reset() first")
        desc = self.lake.desc.astype(str)
        player = divmod(int(self.lake.s), self.lake.ncol)
        if self.config.render == "words":
            state = describe(desc, player)
        else:
            rows = []
            for r, row in enumerate(desc):
                rows.append(self.config.cell_separator.join(_SYMBOLS[ch][(r, c) == player] for c, ch in enumerate(row)))
            state = "\n".join(rows)
        no_op = last_no_op(self.moves) if self.config.note_no_effect else None
        if no_op is None:
            return state
        return with_note(state, _ACTION_OF[no_op.d_row, no_op.d_col], _edge_reason(no_op, desc.shape))


def _edge_reason(move: Move, shape: tuple[int, ...]) -> str:
    """Why `move` changed nothing: the lake has no walls, so the player met its edge, straight ahead or
    (on slippery ice) after sliding to a side."""
    row, col = move.row + move.d_row, move.col + move.d_col
    ahead_inside = 0 <= row < shape[0] and 0 <= col < shape[1]
    return "you slid into the edge of the lake" if ahead_inside else "the edge of the lake is there"


def generate_map(rng: np.random.Generator, *, size: int, p_frozen: float) -> tuple[str, ...]:
    """A size x size map (gymnasium letters) whose goal is reachable from its start."""
    for _ in range(MAX_MAP_TRIES):
        grid = np.where(rng.random((size, size)) < p_frozen, "F", "H")
        start, goal = rng.choice(size * size, size=2, replace=False)
        grid.flat[start], grid.flat[goal] = "S", "G"
        desc = tuple("".join(row) for row in grid)
        if goal_reachable(desc):
            return desc
    raise RuntimeError(f"no reachable {size}x{size} map with p_frozen={p_frozen} in {MAX_MAP_TRIES} tries")


def goal_reachable(desc: Sequence[str]) -> bool:
    """Whether G can be reached from S by 4-neighbour steps that avoid holes."""
    cells = {(r, c): ch for r, row in enumerate(desc) for c, ch in enumerate(row)}
    start = next(pos for pos, ch in cells.items() if ch == "S")
    seen, frontier = {start}, deque([start])
    while frontier:
        r, c = frontier.popleft()
        if cells[(r, c)] == "G":
            return True
        for nxt in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if cells.get(nxt, "H") != "H" and nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return False


def check_desc(desc: Sequence[str]) -> tuple[str, ...]:
    """Validates a user map: equal-length rows of S/F/H/G with one S and one G."""
    rows = tuple(desc)
    if not rows or any(len(r) != len(rows[0]) for r in rows):
        raise ValueError(f"desc must be non-empty rows of equal length, got {rows!r}")
    text = "".join(rows)
    if set(text) - set("SFHG") or text.count("S") != 1 or text.count("G") != 1:
        raise ValueError(f"desc must use only S, F, H, G with exactly one S and one G, got {rows!r}")
    return rows
