"""A board: a grid env's state as a picture draws it, made from the env's own state.

An env with a picture (`TextEnv.board`) hands one out after every reset and step,
and `TextEnv` puts it in the info as JSON values (`Board.to_json`), so it travels
wherever an info does (Ray, an OpenEnv server's answer) and a page reads it back
with `Board.from_json`. Cells are (row, column), 0-based from the top left.

The terrain is a fixed alphabet (`TERRAIN`), not an env's render vocabulary: the
picture is the same whatever symbols or words the model is shown.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

# Terrain letter -> what the cell is.
TERRAIN: dict[str, str] = {"#": "wall", ".": "floor", "H": "hole", "G": "goal", "T": "target"}


@dataclasses.dataclass(frozen=True)
class Move:
    """One valid move: where the player stood, the direction it was asked to go, and whether anything changed.

    Attributes:
        row: The player's row before the move.
        col: The player's column before the move.
        d_row: The move's row direction (-1, 0 or 1).
        d_col: The move's column direction (-1, 0 or 1).
        effective: The move changed the state (False: into an edge, a wall or an unpushable box).
    """

    row: int
    col: int
    d_row: int
    d_col: int
    effective: bool


@dataclasses.dataclass(frozen=True)
class Board:
    """A state as a picture draws it.

    Attributes:
        terrain: Rows of `TERRAIN` letters, all of one length.
        player: The player's cell.
        boxes: The boxes' cells (Sokoban).
        moves: Every valid move since the reset, oldest first: a turn's moves are
            those past the previous board's.
        fault: The failure kind this state already shows (e.g. "hole"), a key of
            the env's `failure_kinds`; None while the task can still be done.
    """

    terrain: tuple[str, ...]
    player: tuple[int, int]
    boxes: tuple[tuple[int, int], ...] = ()
    moves: tuple[Move, ...] = ()
    fault: str | None = None

    def __post_init__(self) -> None:
        if not self.terrain or len({len(row) for row in self.terrain}) != 1:
            raise ValueError(f"terrain must be non-empty rows of one length, got {self.terrain!r}")
        unknown = set("".join(self.terrain)) - set(TERRAIN)
        if unknown:
            raise ValueError(f"terrain letters {sorted(unknown)} are not in {sorted(TERRAIN)}")
        for cell in (self.player, *self.boxes):
            if not (0 <= cell[0] < self.height and 0 <= cell[1] < self.width):
                raise ValueError(f"cell {cell} lies outside the {self.height}x{self.width} board")

    @property
    def height(self) -> int:
        return len(self.terrain)

    @property
    def width(self) -> int:
        return len(self.terrain[0])

    def to_json(self) -> dict[str, Any]:
        """The board as JSON values (lists, not tuples), for an info."""
        return {
            "terrain": list(self.terrain),
            "player": list(self.player),
            "boxes": [list(box) for box in self.boxes],
            "moves": [[m.row, m.col, m.d_row, m.d_col, m.effective] for m in self.moves],
            "fault": self.fault,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Board:
        """Reads `to_json`'s form back; ValueError naming what is missing or malformed."""
        try:
            return cls(
                terrain=tuple(str(row) for row in data["terrain"]),
                player=_cell(data["player"]),
                boxes=tuple(_cell(box) for box in data.get("boxes", ())),
                moves=tuple(Move(int(r), int(c), int(dr), int(dc), bool(e)) for r, c, dr, dc, e in data["moves"]),
                fault=data.get("fault"),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not a board ({type(error).__name__}: {error}): {data!r}") from None


def _cell(value: Sequence[Any]) -> tuple[int, int]:
    row, col = value
    return int(row), int(col)


def trailing_no_ops(moves: Sequence[Move]) -> int:
    """How many moves at the end of `moves` changed nothing, in a row."""
    count = 0
    for move in reversed(moves):
        if move.effective:
            break
        count += 1
    return count
