"""The fixed opponent a two-player TextArena game is played against.

`"random"`: a uniformly random move among the bracketed moves the game has
shown this player so far, newest message first (TextArena's board games list
them, e.g. "Available Moves: '[0]', '[4]'"; others give examples in their
rules, e.g. "[col 4]"). An invalid pick is retried with another candidate; a
player with no valid candidate left cannot move, which ends the episode with
an error naming the game (the env group then ends that trajectory).

The opponent draws from the game's own random state (it runs inside the
game's sandbox, `envs.textarena_isolation`), so its play is a function of the
seed and the agent's moves.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

OPPONENTS = ("random",)
_BRACKETED = re.compile(r"\[[^\[\]\n]{1,40}\]")


class OpponentStuck(RuntimeError):
    """The opponent found no valid move in what the game showed it."""


def candidate_moves(messages: Sequence[str]) -> list[str]:
    """Distinct bracketed moves in `messages`, those of the newest message first."""
    moves: list[str] = []
    for text in reversed(messages):
        for move in _BRACKETED.findall(text):
            if move not in moves:
                moves.append(move)
    return moves


def play_random_move(*, messages: Sequence[str], try_move: Callable[[str], bool], game: str) -> str:
    """Plays a random valid move; returns it.

    Args:
        messages: Everything the game has shown the opponent, oldest first.
        try_move: Steps the game with a move; returns False when the game refused it as invalid.
        game: The game id, for the error message.
    """
    newest = candidate_moves(messages[-1:])
    others = [m for m in candidate_moves(messages) if m not in newest]
    # The newest message's moves first (a current "available moves" list), then older examples.
    for pool in (newest, others):
        for move in random.sample(pool, len(pool)):
            if try_move(move):
                return move
    raise OpponentStuck(
        f"the random opponent of TextArena game {game!r} found no valid move among the bracketed moves the "
        f"game showed it ({len(newest) + len(others)} tried): this game cannot be played against it"
    )
