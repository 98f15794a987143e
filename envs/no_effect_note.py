"""The line a grid env's state gains after a move that changed nothing (the `note_no_effect` option).

A move into a wall leaves the state as it was. With a Markov prompt (the current state only) the
policy then reads the very text it just answered, so it tends to give the same answer again until its
moves run out. With `note_no_effect=True` the state after such a move ends in a line saying so, and why:

    Your last move, Left, changed nothing: a wall is there.

Which move changed nothing is the env's own record of its moves (`Board.moves`, whose `effective`
flag also counts the repeated no-ops among the failure kinds). The line is on the state right after a
move that changed nothing, and gone after a move that changed something (an invalid answer is no move,
so the state it leaves keeps the line). The rules, the rooms and the rewards are the env's as ever:
only the text gains the line.
"""

from __future__ import annotations

from collections.abc import Sequence

from envs.board import Move, trailing_no_ops


def check_note_no_effect(value: object) -> None:
    """Raises ValueError unless `value` is True or False."""
    if not isinstance(value, bool):
        raise ValueError(f"note_no_effect must be True or False, got {value!r} ({type(value).__name__})")


def last_no_op(moves: Sequence[Move]) -> Move | None:
    """The last move when it changed nothing (the state shown is the one it left as it was), else None."""
    return moves[-1] if trailing_no_ops(moves) else None


def with_note(state: str, action: str, reason: str) -> str:
    """`state` with the line saying that the move `action` changed nothing because of `reason`."""
    return f"{state}\nYour last move, {action}, changed nothing: {reason}."
