"""A board (`envs.board`) as the shapes of a small SVG: cells, targets, boxes, the player and the turn's moves.

`drawing` lays the shapes out in pixels; the trajectory page's template writes
them as SVG elements. A move is an arrow from where the player stood; a move that
changed nothing is red with a cross where it hit the edge, wall or box; a move made
several times in one turn is one arrow marked with its count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envs.board import Board, Move

CELL = 32  # pixels per cell
_TERRAIN_FILL = {"#": "#4a4a4a", ".": "#eef6fb", "H": "#13294b", "G": "#f2c230", "T": "#eef6fb"}
_TARGET_RING = "#e0a800"
_BOX, _BOX_ON_TARGET = "#b5651d", "#2e9d4f"
_PLAYER, _PLAYER_FELL, _PLAYER_DONE = "#1e6fd9", "#d32f2f", "#2e9d4f"
_MOVE, _NO_OP = "#111111", "#d32f2f"


def legend() -> list[dict[str, str]]:
    """What the drawing's colours mean: (colour, mark, meaning), for the page's key."""
    entries = (
        (_PLAYER, "\u25cf", "you"),
        (_PLAYER_FELL, "\u25cf", "you, in a hole"),
        (_PLAYER_DONE, "\u25cf", "you, on the goal"),
        (_TERRAIN_FILL["H"], "\u25a0", "hole"),
        (_TERRAIN_FILL["G"], "\u25a0", "goal"),
        (_TARGET_RING, "\u25cb", "target"),
        (_BOX, "\u25a0", "box"),
        (_BOX_ON_TARGET, "\u25a0", "box on a target"),
        (_TERRAIN_FILL["#"], "\u25a0", "wall"),
        (_MOVE, "\u2192", "a move of the turn"),
        (_NO_OP, "\u2192\u2715", "a move that changed nothing (x2: made twice)"),
    )
    return [{"colour": colour, "mark": mark, "meaning": meaning} for colour, mark, meaning in entries]


def drawing(board: Board, moves: Sequence[Move] = ()) -> dict[str, Any]:
    """The shapes of `board` with `moves` (the turn that led to it) drawn as arrows, in pixels."""
    cells = [
        {"x": col * CELL, "y": row * CELL, "fill": _TERRAIN_FILL[letter]}
        for row, line in enumerate(board.terrain)
        for col, letter in enumerate(line)
    ]
    targets = [_centre(row, col) for row, line in enumerate(board.terrain) for col, c in enumerate(line) if c == "T"]
    boxes = [
        {"x": col * CELL + 5, "y": row * CELL + 5, "fill": _BOX_ON_TARGET if board.terrain[row][col] == "T" else _BOX}
        for row, col in board.boxes
    ]
    return {
        "width": board.width * CELL,
        "height": board.height * CELL,
        "cell": CELL,
        "cells": cells,
        "targets": [{"cx": x, "cy": y, "r": CELL // 2 - 3, "stroke": _TARGET_RING} for x, y in targets],
        "boxes": [{**box, "size": CELL - 10} for box in boxes],
        "player": _player(board),
        "arrows": [_arrow(move, count) for move, count in _repeats(moves)],
    }


def _repeats(moves: Sequence[Move]) -> list[tuple[Move, int]]:
    """Each distinct move with how often it was made (the same move into a wall five times is one arrow, x5)."""
    counts: dict[Move, int] = {}
    for move in moves:
        counts[move] = counts.get(move, 0) + 1
    return list(counts.items())


def _centre(row: int, col: int) -> tuple[float, float]:
    return (col + 0.5) * CELL, (row + 0.5) * CELL


def _player(board: Board) -> dict[str, Any]:
    row, col = board.player
    x, y = _centre(row, col)
    letter = board.terrain[row][col]
    fill = _PLAYER_FELL if letter == "H" else _PLAYER_DONE if letter == "G" else _PLAYER
    return {"cx": x, "cy": y, "r": CELL * 0.25, "fill": fill, "cell": f"{row},{col}"}


def _arrow(move: Move, count: int) -> dict[str, Any]:
    """An arrow from the player's cell one cell's length in the move's direction, its head, and the
    cross of a move that changed nothing (on the far side of its cell, where it hit)."""
    x, y = _centre(move.row, move.col)
    reach = 0.3 * CELL if not move.effective else 0.95 * CELL
    tip = (x + move.d_col * reach, y + move.d_row * reach)
    # The head: a triangle at the tip, 6 px long and 8 px wide.
    back = (tip[0] - move.d_col * 6, tip[1] - move.d_row * 6)
    side = (move.d_row * 4, -move.d_col * 4)
    head = [tip, (back[0] + side[0], back[1] + side[1]), (back[0] - side[0], back[1] - side[1])]
    arrow: dict[str, Any] = {
        "x1": x,
        "y1": y,
        "x2": tip[0],
        "y2": tip[1],
        "head": " ".join(f"{px:.1f},{py:.1f}" for px, py in head),
        "effective": move.effective,
        "colour": _MOVE if move.effective else _NO_OP,
        "count": count,
        "cross": None,
    }
    if not move.effective:
        hit, half = (x + move.d_col * CELL * 0.5, y + move.d_row * CELL * 0.5), CELL * 0.18
        arrow["cross"] = (
            f"M{hit[0] - half:.1f},{hit[1] - half:.1f} L{hit[0] + half:.1f},{hit[1] + half:.1f} "
            f"M{hit[0] - half:.1f},{hit[1] + half:.1f} L{hit[0] + half:.1f},{hit[1] - half:.1f}"
        )
    return arrow
