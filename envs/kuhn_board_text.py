"""Kuhn Poker's state as a few short lines: the `board` render of the two-player env for `KuhnPoker-v0`.

TextArena's messages repeat who moved twice, quote the legal moves and send the rules with the first state:
about 150 tokens a turn for SmolLM2's tokenizer (260 at most), over 6 turns a game. What a seat needs to
play is the hand's state, all of it in TextArena's game state (the card it holds, who opened the hand, the
moves still legal) and the chips, so a turn's state here is a few short lines:

    Hand 2 of 3. Chips: you -1, opponent -3.
    Your card: K. You opened; you checked, the opponent bet.
    Your moves: fold call

The chips are each stack as TextArena keeps it, the antes and bets of the hand being played already paid.
The rules move to the seat's system prompt (`kuhn_instructions`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envs.kuhn_equilibrium import card_name

# What was played in the hand so far, from the moves still legal and whether the seat opened the hand.
_HAND_SO_FAR = {
    (True, "bet"): "You open.",
    (False, "bet"): "The opponent opened and checked.",
    (False, "call"): "The opponent opened and bet.",
    (True, "call"): "You opened; you checked, the opponent bet.",
}


def kuhn_text(game_state: Mapping[str, Any], player: int, max_rounds: int, *, over: bool = False) -> str:
    """The state of the hand being played, as seat `player` (TextArena's player id) sees it.

    Args:
        game_state: TextArena's KuhnPoker `state.game_state`.
        player: The seat's player id, 0 or 1.
        max_rounds: Hands a game (the game's `max_rounds`).
        over: The game has ended: no hand (TextArena has dealt one that is not played); the env adds the end.
    """
    if over:
        return "The game is over."
    chips = game_state["player_chips"]
    stacks = f"Chips: you {chips[player]}, opponent {chips[1 - player]}."
    legal = list(game_state["current_legal_action_tree"])
    so_far = _HAND_SO_FAR[(int(game_state["starting_player"]) == player, "bet" if "bet" in legal else "call")]
    return "\n".join(
        [
            f"Hand {game_state['current_round']} of {max_rounds}. {stacks}",
            f"Your card: {card_name(game_state, player)}. {so_far}",
            f"Your moves: {' '.join(legal)}",
        ]
    )


def kuhn_instructions(player: int, max_rounds: int) -> str:
    """The rules for the seat of TextArena player id `player`, as the `board` render shows the game."""
    # TextArena's hand r (from 1) is opened by player r % 2: a one-hand game by Player 1.
    hands, openers = (
        ("one hand a game", "Player 1 opens")
        if max_rounds == 1
        else (f"{max_rounds} hands a game", "the players take turns opening hands")
    )
    return (
        f"You play Kuhn Poker as Player {player} against one opponent, {hands}. The deck is J, Q, "
        f"K (J lowest). Each hand both players ante 1 chip and get one card; {openers}. "
        "Before any bet you may check or bet 1 chip; after a bet you may call (add 1 chip) or fold (the opponent "
        "takes the pot). Two checks or a call end the hand: the higher card takes the pot. Whoever has more chips "
        "after the last hand wins. The state is the hand so far. Your action is one of your moves."
    )
