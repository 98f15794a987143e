"""Sokoban positions and the push rule, shared by the env, generator and solver.

Cells are flat indices `row * width + col` so that search code can hash
states cheaply; `Room.cell` / `Room.coords` convert to and from (row, col).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

# Action name -> (d_row, d_col). Order fixes the direction indices used below.
DIRECTIONS: dict[str, tuple[int, int]] = {
    "Up": (-1, 0),
    "Down": (1, 0),
    "Left": (0, -1),
    "Right": (0, 1),
}
ACTIONS: tuple[str, ...] = tuple(DIRECTIONS)

_NO_CELL = -1


@dataclasses.dataclass(frozen=True)
class GridSymbols:
    """The character drawn for each kind of cell (seven distinct characters)."""

    wall: str
    floor: str
    target: str
    box: str
    box_on_target: str
    player: str
    player_on_target: str

    def __post_init__(self) -> None:
        symbols = dataclasses.astuple(self)
        if any(len(s) != 1 for s in symbols) or len(set(symbols)) != len(symbols):
            raise ValueError(f"grid symbols must be seven distinct single characters, got {symbols}")

    def legend(self) -> str:
        """The symbols explained, for the instructions."""
        return (
            f"{self.wall} wall, {self.floor} empty floor, {self.target} target, {self.box} box, "
            f"{self.box_on_target} box on a target, {self.player} you (the player), "
            f"{self.player_on_target} you standing on a target"
        )

    def kinds(self) -> dict[str, tuple[bool, bool, bool, bool]]:
        """symbol -> (wall, target, box, player)."""
        return {
            self.wall: (True, False, False, False),
            self.floor: (False, False, False, False),
            self.target: (False, True, False, False),
            self.box: (False, False, True, False),
            self.box_on_target: (False, True, True, False),
            self.player: (False, False, False, True),
            self.player_on_target: (False, True, False, True),
        }


# RAGEN's symbols; and the other set of its SokobanNewVocab setting (RAGEN's
# `SokobanDifferentGridVocab`), which tests whether a policy reads the legend.
STANDARD_SYMBOLS = GridSymbols(
    wall="#", floor="_", target="O", box="X", box_on_target="√", player="P", player_on_target="S"
)
NEW_VOCAB_SYMBOLS = GridSymbols(
    wall="W", floor=".", target="G", box="B", box_on_target="C", player="A", player_on_target="@"
)
GRID_VOCABULARIES: dict[str, GridSymbols] = {"standard": STANDARD_SYMBOLS, "new": NEW_VOCAB_SYMBOLS}


@dataclasses.dataclass(frozen=True)
class Layout:
    """The fixed part of a room: its size, walls and targets (flat cell indices).

    Cells outside the grid count as walls, so a room need not have a border.
    """

    height: int
    width: int
    walls: frozenset[int]
    targets: frozenset[int]
    # neighbors[cell][d]: the non-wall cell next to `cell` in direction d, or -1.
    neighbors: tuple[tuple[int, ...], ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.height < 1 or self.width < 1:
            raise ValueError(f"room must be at least 1x1, got {self.height}x{self.width}")
        size = self.height * self.width
        outside = [c for c in self.walls | self.targets if not 0 <= c < size]
        if outside:
            raise ValueError(f"cells {sorted(outside)} lie outside the {self.height}x{self.width} grid")
        if self.walls & self.targets:
            raise ValueError(f"targets {sorted(self.walls & self.targets)} are on walls")
        object.__setattr__(self, "neighbors", tuple(self._neighbors_of(c) for c in range(size)))

    def _neighbors_of(self, cell: int) -> tuple[int, ...]:
        row, col = divmod(cell, self.width)
        result = []
        for d_row, d_col in DIRECTIONS.values():
            r, c = row + d_row, col + d_col
            inside = 0 <= r < self.height and 0 <= c < self.width
            nxt = r * self.width + c
            result.append(nxt if inside and nxt not in self.walls else _NO_CELL)
        return tuple(result)

    @property
    def floor(self) -> frozenset[int]:
        """Every non-wall cell (targets included)."""
        return frozenset(range(self.height * self.width)) - self.walls


@dataclasses.dataclass(frozen=True)
class Room:
    """A Sokoban position: the layout plus the player and box cells."""

    layout: Layout
    player: int
    boxes: frozenset[int]

    def __post_init__(self) -> None:
        floor = self.layout.floor
        if self.player not in floor:
            raise ValueError(f"player cell {self.player} is not a floor cell")
        if not self.boxes or len(self.boxes) != len(self.layout.targets):
            raise ValueError(
                f"need as many boxes as targets (at least 1), got {len(self.boxes)} boxes "
                f"and {len(self.layout.targets)} targets"
            )
        if not self.boxes <= floor or self.player in self.boxes:
            raise ValueError("boxes must stand on free floor cells, not on walls or the player")

    @property
    def solved(self) -> bool:
        return self.boxes == self.layout.targets

    def cell(self, row: int, col: int) -> int:
        return row * self.layout.width + col

    def coords(self, cell: int) -> tuple[int, int]:
        return divmod(cell, self.layout.width)


class Move(NamedTuple):
    """Result of one action: the new pieces and the pushed box (or -1, -1)."""

    player: int
    boxes: frozenset[int]
    box_from: int = _NO_CELL
    box_to: int = _NO_CELL


def apply_move(layout: Layout, player: int, boxes: frozenset[int], direction: int) -> Move:
    """Moves the player one cell in `direction` (an index into ACTIONS).

    A box in the way is pushed if the cell behind it is free floor; a move into
    a wall or an unpushable box leaves everything unchanged.
    """
    nxt = layout.neighbors[player][direction]
    if nxt == _NO_CELL:
        return Move(player, boxes)
    if nxt not in boxes:
        return Move(nxt, boxes)
    beyond = layout.neighbors[nxt][direction]
    if beyond == _NO_CELL or beyond in boxes:
        return Move(player, boxes)
    return Move(nxt, (boxes - {nxt}) | {beyond}, nxt, beyond)


def render_room(room: Room, symbols: GridSymbols = STANDARD_SYMBOLS, *, separator: str = "") -> str:
    """The room as rows of `symbols` (cells joined by `separator`) joined by newlines."""
    layout = room.layout
    rows = []
    for row in range(layout.height):
        rows.append(separator.join(_symbol(room, room.cell(row, col), symbols) for col in range(layout.width)))
    return "\n".join(rows)


def _symbol(room: Room, cell: int, symbols: GridSymbols) -> str:
    on_target = cell in room.layout.targets
    if cell in room.layout.walls:
        return symbols.wall
    if cell == room.player:
        return symbols.player_on_target if on_target else symbols.player
    if cell in room.boxes:
        return symbols.box_on_target if on_target else symbols.box
    return symbols.target if on_target else symbols.floor


def parse_room(text: str, symbols: GridSymbols = STANDARD_SYMBOLS, *, separator: str = "") -> Room:
    """Inverse of `render_room`: builds a Room from rows of `symbols` (cells joined by `separator`).

    Raises ValueError on ragged rows, unknown symbols or a missing/duplicate player.
    """
    kinds = symbols.kinds()
    rows = [line.split(separator) if separator else list(line) for line in text.strip("\n").split("\n")]
    width = len(rows[0])
    if any(len(r) != width for r in rows):
        raise ValueError(f"rows have different lengths: {[len(r) for r in rows]}")
    walls, targets, boxes, players = set(), set(), set(), []
    for row, line in enumerate(rows):
        for col, symbol in enumerate(line):
            cell = row * width + col
            if symbol not in kinds:
                raise ValueError(f"unknown symbol {symbol!r} at row {row}, col {col}")
            is_wall, is_target, is_box, is_player = kinds[symbol]
            if is_wall:
                walls.add(cell)
            if is_target:
                targets.add(cell)
            if is_box:
                boxes.add(cell)
            if is_player:
                players.append(cell)
    if len(players) != 1:
        raise ValueError(
            f"need exactly one player ({symbols.player!r} or {symbols.player_on_target!r}), found {len(players)}"
        )
    layout = Layout(len(rows), width, frozenset(walls), frozenset(targets))
    return Room(layout, players[0], frozenset(boxes))
