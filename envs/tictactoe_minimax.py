"""The exact TicTacToe expert: full minimax over the board, for TextArena's `TicTacToe-v0`.

TextArena's board is 3 x 3 lists of "", "X" or "O"; player 1 plays "X" and
player 0 "O". A position's value is searched to the end (at most 9! lines,
memoised by position: a few thousand positions), so the expert never loses;
among equally good moves it takes the quickest win (or slowest loss), then the
lowest cell number, so it is deterministic.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def mark_of(player: int) -> str:
    """TextArena's mark of a player id: 1 plays "X", 0 plays "O"."""
    return "X" if player == 1 else "O"


def minimax_move(board: Sequence[Sequence[str]], player: int) -> int:
    """The best cell (0-8) for `player` on `board` (rows of "", "X", "O")."""
    cells = "".join(cell or "." for row in board for cell in row)
    if len(cells) != 9:
        raise ValueError(f"a TicTacToe board has 9 cells, got {len(cells)}")
    if "." not in cells or _winner(cells):
        raise ValueError(f"the game on board {cells!r} is over: there is no move to make")
    mark = mark_of(player)
    return max(_moves(cells), key=lambda cell: (-_search(_play(cells, cell, mark), _other(mark)), -cell))


@functools.cache
def _search(cells: str, to_move: str) -> int:
    """The position's value for `to_move`: > 0 a win (larger sooner), < 0 a loss, 0 a draw."""
    if _winner(cells):  # the player who just moved won
        return -(1 + cells.count("."))
    if "." not in cells:
        return 0
    return max(-_search(_play(cells, cell, to_move), _other(to_move)) for cell in _moves(cells))


def _moves(cells: str) -> list[int]:
    return [i for i, cell in enumerate(cells) if cell == "."]


def _play(cells: str, cell: int, mark: str) -> str:
    return cells[:cell] + mark + cells[cell + 1 :]


def _other(mark: str) -> str:
    return "O" if mark == "X" else "X"


def _winner(cells: str) -> bool:
    return any(cells[a] != "." and cells[a] == cells[b] == cells[c] for a, b, c in _LINES)
