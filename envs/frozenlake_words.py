"""FrozenLake described in words relative to the player, and read back.

A small model cannot find the player's column in a character grid (SmolLM2
merges runs of symbols into one token). This render states the same facts as
sentences whose direction words are the action names: where the goal lies
from the player ("2 Down and 1 Right"), what is on each side ("Up hole"),
where the holes are, and where the player stands. It describes the state
only: no planner output, no best action. `parse_words` reads it back into
the map and the player's cell, so the render loses nothing.

    You are at (2,1) on a 4x4 lake.
    Goal: 2 Down and 1 Right.
    Next to you: Left edge, Down ice, Right ice, Up hole.
    Holes next to you: Up.
    Holes at: (1,1), (4,3).

Cells are (row,column), counted from 1 at the top left. In a hole the first
line reads "You fell into the hole at ...", on the goal "You reached the goal at ...".
"""

from __future__ import annotations

import re

import numpy as np

from envs.offsets import offset_words, parse_offset

# (action name, row step, column step), in gymnasium's action order.
DIRECTIONS: tuple[tuple[str, int, int], ...] = (("Left", 0, -1), ("Down", 1, 0), ("Right", 0, 1), ("Up", -1, 0))
_CELL_WORDS = {"F": "ice", "S": "ice", "H": "hole", "G": "goal"}
_WHERE = {"F": "You are at", "S": "You are at", "H": "You fell into the hole at", "G": "You reached the goal at"}
_FIRST_LINE = re.compile(
    r"^(You are at|You fell into the hole at|You reached the goal at) "
    r"\((\d+),(\d+)\) on a (\d+)x(\d+) lake\.$"
)
_CELL = re.compile(r"\((\d+),(\d+)\)")


def describe(desc: np.ndarray, player: tuple[int, int]) -> str:
    """The words render of a map (gymnasium letters, [rows, cols]) with the player at (row, col), 0-based."""
    n_rows, n_cols = desc.shape
    row, col = player
    goal = tuple(int(x[0]) for x in np.nonzero(desc == "G"))
    holes = [(int(r), int(c)) for r, c in zip(*np.nonzero(desc == "H"))]
    lines = [
        f"{_WHERE[str(desc[row, col])]} ({row + 1},{col + 1}) on a {n_rows}x{n_cols} lake.",
        f"Goal: {offset_words(goal[0] - row, goal[1] - col)}.",
        "Next to you: "
        + ", ".join(f"{name} {_neighbour(desc, row + dr, col + dc)}" for name, dr, dc in DIRECTIONS)
        + ".",
        # The same fact again, as the action names alone: SmolLM2 read the line above poorly (warm starts
        # and RL policies stepped into a hole beside them on a third of such turns).
        "Holes next to you: "
        + (", ".join(name for name, dr, dc in DIRECTIONS if _neighbour(desc, row + dr, col + dc) == "hole") or "none")
        + ".",
        "Holes at: " + (", ".join(f"({r + 1},{c + 1})" for r, c in holes) or "none") + ".",
    ]
    return "\n".join(lines)


def _neighbour(desc: np.ndarray, row: int, col: int) -> str:
    if not (0 <= row < desc.shape[0] and 0 <= col < desc.shape[1]):
        return "edge"
    return _CELL_WORDS[str(desc[row, col])]


def parse_words(text: str) -> tuple[tuple[str, ...], tuple[int, int]]:
    """Reads a words render back: (map rows in gymnasium letters F/H/G, player (row, col) 0-based).

    The start cell is not part of the state, so it reads back as frozen ("F").

    Raises:
        ValueError: naming the line that does not read as `describe` writes it.
    """
    lines = text.split("\n")
    if len(lines) != 5:
        raise ValueError(f"a FrozenLake words render has 5 lines, got {len(lines)}: {text!r}")
    first = _FIRST_LINE.match(lines[0])
    if first is None:
        raise ValueError(f"unreadable position line {lines[0]!r}")
    row, col, n_rows, n_cols = (int(first.group(i)) for i in range(2, 6))
    row, col = row - 1, col - 1
    grid = np.full((n_rows, n_cols), "F")
    if not (lines[1].startswith("Goal: ") and lines[1].endswith(".")):
        raise ValueError(f"unreadable goal line {lines[1]!r}")
    try:
        d_row, d_col = parse_offset(lines[1][len("Goal: ") : -1])
    except ValueError:
        raise ValueError(f"unreadable goal line {lines[1]!r}") from None
    grid[row + d_row, col + d_col] = "G"
    if not lines[4].startswith("Holes at: "):
        raise ValueError(f"unreadable holes line {lines[4]!r}")
    for r, c in _CELL.findall(lines[4]):
        grid[int(r) - 1, int(c) - 1] = "H"
    return tuple("".join(r) for r in grid), (row, col)
