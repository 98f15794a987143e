"""Offsets between grid cells in words whose direction names are the actions.

Both grid envs' words renders (FrozenLake's, Sokoban's) say where things lie
from the player as the moves that cover the distance: (2, -1) reads
"2 Down and 1 Left", (0, 0) reads "here". Rows grow downwards.
"""

from __future__ import annotations

import re

_OFFSET = re.compile(r"(?:(\d+) (Down|Up))?(?: and )?(?:(\d+) (Right|Left))?")


def offset_words(d_row: int, d_col: int) -> str:
    """An offset in steps named by the actions that cover it: (2, -1) -> "2 Down and 1 Left"."""
    parts = []
    if d_row:
        parts.append(f"{abs(d_row)} {'Down' if d_row > 0 else 'Up'}")
    if d_col:
        parts.append(f"{abs(d_col)} {'Right' if d_col > 0 else 'Left'}")
    return " and ".join(parts) if parts else "here"


def parse_offset(words: str) -> tuple[int, int]:
    """Inverse of `offset_words`: "2 Down and 1 Left" -> (2, -1).

    Raises:
        ValueError: naming `words` when they are not an offset as `offset_words` writes it.
    """
    if words == "here":
        return 0, 0
    found = _OFFSET.fullmatch(words)
    if found is None or not words or offset_words(*_signed(found.groups())) != words:
        raise ValueError(f"unreadable offset {words!r} (expected e.g. '2 Down and 1 Left' or 'here')")
    return _signed(found.groups())


def _signed(groups: tuple[str | None, ...]) -> tuple[int, int]:
    rows, vertical, cols, horizontal = groups
    d_row = int(rows or 0) * (1 if vertical == "Down" else -1)
    d_col = int(cols or 0) * (1 if horizontal == "Right" else -1)
    return d_row, d_col
