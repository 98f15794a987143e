"""Sokoban described in words relative to the player, and read back.

SmolLM2 cannot find the player's column in a symbol grid (its tokenizer merges
runs of symbols). This render states the same facts as sentences whose
direction words are the action names: where each box and each target lies
from the player, where each box lies from its nearest target, what is on each
side of the player, and where the walls are. It describes the state only: no
planner output, no best action. `parse_words` reads it back into the room, so
the render loses nothing.

    You are at (3,2) in a 6x6 room with walls all around.
    Boxes: 1 Down and 1 Right.
    Targets: 2 Down and 2 Right.
    From box to nearest target: 1 Down and 1 Right.
    Next to you: Up floor, Down floor, Left wall, Right floor.
    Walls inside: (2,4), (4,4).

With `box_sides=True` (the env option `describe_box_sides`) a line after "Next to
you" says what is on each side of each box, so whether a push leaves a box in a
corner or against a wall can be read without working it out from the walls'
coordinates:

    Next to the box: Up floor, Down wall, Left you, Right floor.

Cells are (row,column), counted from 1 at the top left. With walls all
around, "Walls inside" lists the walls off the outer ring; otherwise the first
line says only the size and "Walls" lists every wall. A box on a target reads
"(on a target)"; several boxes or targets are separated by "; ".
"""

from __future__ import annotations

import re

from envs.offsets import offset_words, parse_offset
from envs.sokoban_room import DIRECTIONS, Layout, Room

_FIRST_LINE = re.compile(r"^You are at \((\d+),(\d+)\) in a (\d+)x(\d+) room( with walls all around)?\.$")
_CELL = re.compile(r"\((\d+),(\d+)\)")
_ON_TARGET = " (on a target)"
_BOX_SIDES = ("Next to the box: ", "Next to the boxes: ")
_LINES = ("Boxes: ", "Targets: ", "From box to nearest target: ", "Next to you: ")


def describe(room: Room, *, box_sides: bool = False) -> str:
    """The words render of `room`, with the line of what lies on each side of each box if `box_sides`."""
    layout = room.layout
    row, col = room.coords(room.player)
    ring = _outer_ring(layout)
    walled = ring <= layout.walls
    listed_walls = sorted(layout.walls - ring) if walled else sorted(layout.walls)
    lines = [
        f"You are at ({row + 1},{col + 1}) in a {layout.height}x{layout.width} room"
        + (" with walls all around." if walled else "."),
        "Boxes: "
        + "; ".join(_from(room, room.player, box) + _on_target(room, box) for box in sorted(room.boxes))
        + ".",
        "Targets: " + "; ".join(_from(room, room.player, target) for target in sorted(layout.targets)) + ".",
        "From box to nearest target: "
        + "; ".join(_from(room, box, _nearest(room, box, layout.targets)) for box in sorted(room.boxes))
        + ".",
        "Next to you: "
        + ", ".join(f"{name} {_neighbour(room, row + dr, col + dc)}" for name, (dr, dc) in DIRECTIONS.items())
        + ".",
        *([_box_sides(room)] if box_sides else []),
        ("Walls inside: " if walled else "Walls: ")
        + (", ".join(_cell_text(room, w) for w in listed_walls) or "none")
        + ".",
    ]
    return "\n".join(lines)


def parse_words(text: str) -> Room:
    """Reads a words render back into its room (a box-sides line, derived from the rest, is skipped).

    Raises:
        ValueError: naming the line that does not read as `describe` writes it.
    """
    lines = [line for line in text.split("\n") if not line.startswith(_BOX_SIDES)]
    if len(lines) != 6:
        raise ValueError(f"a Sokoban words render has 6 lines, got {len(lines)}: {text!r}")
    first = _FIRST_LINE.match(lines[0])
    if first is None:
        raise ValueError(f"unreadable position line {lines[0]!r}")
    row, col, height, width = (int(first.group(i)) for i in range(1, 5))
    player = (row - 1) * width + col - 1
    boxes = {_cell(player, width, offset) for offset in _items(lines[1], "Boxes: ", strip=_ON_TARGET)}
    targets = {_cell(player, width, offset) for offset in _items(lines[2], "Targets: ")}
    walls_prefix = "Walls inside: " if first.group(5) else "Walls: "
    if not (lines[5].startswith(walls_prefix) and lines[5].endswith(".")):
        raise ValueError(f"unreadable walls line {lines[5]!r}")
    walls = {(int(r) - 1) * width + int(c) - 1 for r, c in _CELL.findall(lines[5])}
    blank = Layout(height, width, frozenset(), frozenset())
    if first.group(5):
        walls |= _outer_ring(blank)
    return Room(Layout(height, width, frozenset(walls), frozenset(targets)), player, frozenset(boxes))


def _items(line: str, prefix: str, *, strip: str = "") -> list[tuple[int, int]]:
    if not (line.startswith(prefix) and line.endswith(".")):
        raise ValueError(f"unreadable line {line!r} (expected it to start with {prefix!r})")
    try:
        return [parse_offset(item.removesuffix(strip)) for item in line[len(prefix) : -1].split("; ")]
    except ValueError as error:
        raise ValueError(f"unreadable line {line!r}: {error}") from None


def _cell(origin: int, width: int, offset: tuple[int, int]) -> int:
    row, col = divmod(origin, width)
    return (row + offset[0]) * width + col + offset[1]


def _from(room: Room, origin: int, cell: int) -> str:
    (r0, c0), (r1, c1) = room.coords(origin), room.coords(cell)
    return offset_words(r1 - r0, c1 - c0)


def _nearest(room: Room, box: int, targets: frozenset[int]) -> int:
    """The target closest to `box` in steps (ties: the first in reading order)."""
    row, col = room.coords(box)
    return min(sorted(targets), key=lambda t: abs(room.coords(t)[0] - row) + abs(room.coords(t)[1] - col))


def _on_target(room: Room, box: int) -> str:
    return _ON_TARGET if box in room.layout.targets else ""


def _box_sides(room: Room) -> str:
    """What lies Up, Down, Left and Right of each box (in the Boxes line's order; "you" for the player)."""
    player = room.coords(room.player)
    sides = []
    for box in sorted(room.boxes):
        row, col = room.coords(box)
        sides.append(
            ", ".join(
                f"{name} " + ("you" if (row + dr, col + dc) == player else _neighbour(room, row + dr, col + dc))
                for name, (dr, dc) in DIRECTIONS.items()
            )
        )
    return _BOX_SIDES[len(sides) > 1] + "; ".join(sides) + "."


def _neighbour(room: Room, row: int, col: int) -> str:
    layout = room.layout
    if not (0 <= row < layout.height and 0 <= col < layout.width):
        return "wall"
    cell = room.cell(row, col)
    if cell in layout.walls:
        return "wall"
    if cell in room.boxes:
        return "box on a target" if cell in layout.targets else "box"
    return "target" if cell in layout.targets else "floor"


def _cell_text(room: Room, cell: int) -> str:
    row, col = room.coords(cell)
    return f"({row + 1},{col + 1})"


def _outer_ring(layout: Layout) -> frozenset[int]:
    h, w = layout.height, layout.width
    return frozenset(r * w + c for r in range(h) for c in range(w) if r in (0, h - 1) or c in (0, w - 1))
