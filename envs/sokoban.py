"""Sokoban as a text env: push every box onto a target.

Rewards (as gym-sokoban and RAGEN): -0.1 per valid move (also a move into a
wall), +1 for pushing a box onto a target, -1 for pushing one off, +10 when
the last box lands (the episode then terminates with success). Truncated
after `max_steps` valid moves; invalid actions do not count (see envs.base).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from envs.base import REPEATED_NO_OP, TextEnv, build_config, check_cell_separator, match_action
from envs.board import Board, Move
from envs.no_effect_note import check_note_no_effect, last_no_op, with_note
from envs.sokoban_generator import generate_room
from envs.sokoban_room import (
    ACTIONS,
    DIRECTIONS,
    GRID_VOCABULARIES,
    GridSymbols,
    Room,
    apply_move,
    parse_room,
    render_room,
)
from envs.sokoban_solver import live_cells
from envs.sokoban_words import describe

STEP_PENALTY = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_PENALTY = -1.0
SOLVED_REWARD = 10.0
DEAD_BOX = "dead_box"

# A move's direction -> its action name.
_ACTION_OF = {direction: name for name, direction in DIRECTIONS.items()}

# How the state is shown: RAGEN's symbol grid, or sentences relative to the player (`envs.sokoban_words`).
RENDERS = ("grid", "words")

RULES = (
    "Actions: Up, Down, Left, Right. Each moves you one cell. Walking into a box "
    "pushes it one cell if the cell behind it is free; boxes cannot be pulled, "
    "so a box pushed into a corner is stuck. The puzzle is solved when every box "
    "is on a target."
)


@dataclasses.dataclass(frozen=True)
class SokobanConfig:
    """Room generation and episode length.

    Attributes:
        dim_room: (height, width) including the outer wall.
        num_boxes: boxes (and targets) per room.
        max_steps: valid moves before the episode is truncated.
        search_depth: most reverse moves explored when generating a start.
        grid_vocabulary: the symbols of the rendered grid, a key of
            `GRID_VOCABULARIES`: "standard" (RAGEN's) or "new" (SokobanNewVocab's).
        cell_separator: what joins the cells of a rendered row, one of
            `envs.base.CELL_SEPARATORS`: "" (RAGEN's render) or " " (one token a cell).
        render: "grid" (RAGEN's symbols) or "words" (boxes, targets and the
            player's neighbours in steps from the player; `envs.sokoban_words`).
        note_no_effect: after a move that changed nothing, the state ends in a line
            saying so and why (`envs.no_effect_note`), e.g. "Your last move, Left,
            changed nothing: the box there is against a wall."
        describe_box_sides: with the words render, a line says what lies on each
            side of each box (`envs.sokoban_words`), e.g. "Next to the box: Up
            floor, Down wall, Left you, Right floor."
    """

    dim_room: tuple[int, int] = (6, 6)
    num_boxes: int = 1
    max_steps: int = 100
    search_depth: int = 300
    grid_vocabulary: str = "standard"
    cell_separator: str = ""
    render: str = "grid"
    note_no_effect: bool = False
    describe_box_sides: bool = False

    def __post_init__(self) -> None:
        dims = tuple(self.dim_room)
        if len(dims) != 2 or any(not isinstance(d, numbers.Integral) or d < 4 for d in dims):
            raise ValueError(f"dim_room must be two ints >= 4 (height, width), got {self.dim_room!r}")
        dims = (int(dims[0]), int(dims[1]))
        object.__setattr__(self, "dim_room", dims)
        interior = (dims[0] - 2) * (dims[1] - 2)
        if not 1 <= self.num_boxes <= interior - 2:
            raise ValueError(
                f"num_boxes must be between 1 and {interior - 2} for a {dims[0]}x{dims[1]} room, got {self.num_boxes}"
            )
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.search_depth < 1:
            raise ValueError(f"search_depth must be >= 1, got {self.search_depth}")
        if self.grid_vocabulary not in GRID_VOCABULARIES:
            raise ValueError(
                f"grid_vocabulary must be one of {sorted(GRID_VOCABULARIES)}, got {self.grid_vocabulary!r}"
            )
        check_cell_separator(self.cell_separator)
        if self.render not in RENDERS:
            raise ValueError(f"render must be one of {RENDERS}, got {self.render!r}")
        check_note_no_effect(self.note_no_effect)
        if not isinstance(self.describe_box_sides, bool):
            raise ValueError(f"describe_box_sides must be True or False, got {self.describe_box_sides!r}")
        if self.describe_box_sides and self.render != "words":
            raise ValueError(
                f"describe_box_sides needs render='words' (a sentence of the words render), got {self.render!r}"
            )

    @property
    def symbols(self) -> GridSymbols:
        return GRID_VOCABULARIES[self.grid_vocabulary]


class SokobanEnv(TextEnv):
    """Sokoban rooms generated per seed; see the module docstring for rewards.

    `reset(options={"room": room})` plays a given room (a `Room` or its text
    render, in the env's grid vocabulary) instead of a generated one.
    """

    config_class = SokobanConfig
    failure_kinds: ClassVar[Mapping[str, str]] = {
        DEAD_BOX: "box stuck: a box was pushed where it can never reach a target (a corner, along a wall)",
        REPEATED_NO_OP: "repeated no-op: the last moves (two or more) went into a wall or an unpushable box",
    }

    def __init__(self, config: SokobanConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        self.config: SokobanConfig = build_config(SokobanConfig, config, overrides)
        self.room: Room | None = None
        self.num_steps = 0
        self.moves: list[Move] = []
        # The cells from which a box can still reach a target (the room's layout never changes).
        self.live: frozenset[int] = frozenset()

    @property
    def instructions(self) -> str:
        legend = f"Symbols: {self.config.symbols.legend()}.\n" if self.config.render == "grid" else ""
        return f"You are solving Sokoban: push every box onto a target.\n{legend}{RULES}"

    @property
    def action_vocabulary(self) -> tuple[str, ...]:
        return ACTIONS

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(options) - {"room"})
        if unknown:
            raise ValueError(f"unknown Sokoban reset option(s) {unknown}; accepted: ['room']")
        room = options.get("room")
        if room is None:
            cfg = self.config
            room = generate_room(rng, dim_room=cfg.dim_room, num_boxes=cfg.num_boxes, search_depth=cfg.search_depth)
        elif isinstance(room, str):
            room = parse_room(room, self.config.symbols, separator=self.config.cell_separator)
        elif not isinstance(room, Room):
            raise TypeError(f"options['room'] must be a Room or its text, got {type(room).__name__}")
        self.room = room
        self.num_steps = 0
        self.moves = []
        self.live = live_cells(room.layout)
        return {"success": room.solved}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        room = self.room
        assert room is not None, "TextEnv.step steps only after reset"
        name = match_action(action, ACTIONS)
        if name is None:
            info = {"action_is_valid": False, "action_is_effective": False, "success": room.solved}
            return 0.0, False, False, info
        move = apply_move(room.layout, room.player, room.boxes, ACTIONS.index(name))
        self.room = Room(room.layout, move.player, move.boxes)
        self.num_steps += 1
        self.moves.append(Move(*room.coords(room.player), *DIRECTIONS[name], effective=move.player != room.player))
        reward = STEP_PENALTY + _box_reward(room, move.box_from, move.box_to)
        solved = self.room.solved
        if solved:
            reward += SOLVED_REWARD
        truncated = not solved and self.num_steps >= self.config.max_steps
        info = {"action_is_effective": move.player != room.player, "success": solved}
        return reward, solved, truncated, info

    def board(self) -> Board:
        room = self.room
        if room is None:
            raise RuntimeError("SokobanEnv has no room yet: call reset() first")
        layout = room.layout
        terrain = tuple(
            "".join(
                "#" if cell in layout.walls else "T" if cell in layout.targets else "."
                for cell in range(row * layout.width, (row + 1) * layout.width)
            )
            for row in range(layout.height)
        )
        dead = any(box not in self.live for box in room.boxes)
        return Board(
            terrain=terrain,
            player=room.coords(room.player),
            boxes=tuple(room.coords(box) for box in sorted(room.boxes)),
            moves=tuple(self.moves),
            fault=DEAD_BOX if dead else None,
        )

    def render_text(self) -> str:
        if self.room is None:
            raise RuntimeError("SokobanEnv has no room yet: call reset() first")
        if self.config.render == "words":
            state = describe(self.room, box_sides=self.config.describe_box_sides)
        else:
            state = render_room(self.room, self.config.symbols, separator=self.config.cell_separator)
        no_op = last_no_op(self.moves) if self.config.note_no_effect else None
        if no_op is None:
            return state
        action = _ACTION_OF[no_op.d_row, no_op.d_col]
        return with_note(state, action, _blocker(self.room, ACTIONS.index(action)))


def _blocker(room: Room, direction: int) -> str:
    """Why a move in `direction` (an index into ACTIONS) changed nothing: a wall ahead, or a box ahead
    that a wall or another box holds (`apply_move`'s two ways to refuse a move)."""
    neighbors = room.layout.neighbors
    ahead = neighbors[room.player][direction]
    if ahead < 0:  # a wall, or outside a room without outer walls
        return "a wall is there"
    assert ahead in room.boxes, "a move onto free floor changes the state"
    holder = "a wall" if neighbors[ahead][direction] < 0 else "another box"
    return f"the box there is against {holder}"


def _box_reward(room: Room, box_from: int, box_to: int) -> float:
    """+1 for a push onto a target, -1 for a push off one (both cancel on target->target)."""
    if box_to < 0:
        return 0.0
    targets = room.layout.targets
    onto = BOX_ON_TARGET_REWARD if box_to in targets else 0.0
    off = BOX_OFF_TARGET_PENALTY if box_from in targets else 0.0
    return onto + off
