"""A Nash equilibrium strategy of Kuhn Poker (ante 1, bet 1), for TextArena's `KuhnPoker-v0`.

Kuhn (1950) found the equilibria of the game in closed form, one family with a parameter a in [0, 1/3]. Here
a = 1/3. The player who opens the hand:
- bets a jack with probability a and a king with 3a, and checks a queen;
- after a check and a bet: folds a jack, calls with a queen with probability a + 1/3, calls with a king.

The other player:
- after a check: bets a king, bets a jack with probability 1/3, checks a queen;
- after a bet: calls with a king, calls with a queen with probability 1/3, folds a jack.

Whatever the opponent plays, this strategy wins on average at least the game's value: -1/18 chip a hand when
it opens, +1/18 when it does not. Against an opponent that strays from every equilibrium, random play
included, it wins more.

TextArena's game state holds each player's card (0 = J, 1 = Q, 2 = K), who opened the hand
(`starting_player`) and the moves still legal (`current_legal_action_tree`: check and bet before any bet, call
and fold after one); that is the whole history of a hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

ALPHA = 1 / 3
CARDS = "JQK"
# (opens the hand, the aggressive move legal now) -> that move's probability with a J, a Q, a K.
_AGGRESSION = {
    (True, "bet"): (ALPHA, 0.0, 3 * ALPHA),
    (True, "call"): (0.0, ALPHA + 1 / 3, 1.0),
    (False, "bet"): (1 / 3, 0.0, 1.0),
    (False, "call"): (0.0, 1 / 3, 1.0),
}


def equilibrium_move(game_state: Mapping[str, Any], player: int, rng: np.random.Generator) -> str:
    """The move of `player` (0 or 1), the player to act, drawn from the equilibrium (module docstring).

    Args:
        game_state: TextArena's KuhnPoker `state.game_state`.
        player: The id of the player to act.
        rng: Draws the mixed moves.

    Returns:
        The move as TextArena takes it: "[check]", "[bet]", "[call]" or "[fold]".
    """
    legal = set(game_state["current_legal_action_tree"])
    if legal not in ({"check", "bet"}, {"call", "fold"}):
        raise ValueError(f"a Kuhn Poker hand has no move to make here: the legal moves are {sorted(legal)}")
    aggressive, passive = ("bet", "check") if "bet" in legal else ("call", "fold")
    probability = aggression(
        opens=int(game_state["starting_player"]) == player,
        move=aggressive,
        card=int(game_state["player_cards"][player]),
    )
    return f"[{aggressive if rng.random() < probability else passive}]"


def aggression(*, opens: bool, move: str, card: int) -> float:
    """The equilibrium's probability of the aggressive `move` ("bet" before any bet, "call" after one).

    Args:
        opens: Whether the player to act opened the hand.
        move: "bet" or "call".
        card: The player's card: 0 = J, 1 = Q, 2 = K.
    """
    return _AGGRESSION[(opens, move)][card]


def card_name(game_state: Mapping[str, Any], player: int) -> str:
    """The card `player` holds, as TextArena names it: "J", "Q" or "K"."""
    return CARDS[int(game_state["player_cards"][player])]
