"""How far a win rate can rise against Kuhn Poker's equilibrium in a game of one hand.

Exact, by enumeration of the six deals, no sampling: the probability that a player wins one hand against
`envs.kuhn_equilibrium`'s strategy, for that strategy itself and for the best pure strategy in win rate (a
win counts 1 whatever the pot), on each seat and over alternating seats. A seat makes six decisions (its
card, times check-or-bet before a bet and call-or-fold after one); the search tries all 2^6 pure choices.

It bounds what RL on one-hand games can show against a start that plays the equilibrium: the win rate's
rise is at most the best response's lead over the equilibrium's own (docs/results/self_play_kuhn.md).

    python benchmarks/kuhn_win_ceiling.py
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

from envs.kuhn_equilibrium import CARDS, aggression
from envs.user_errors import CLIParser, front_door

# A strategy: the probability of the aggressive move ("bet" before any bet, "call" after one) of the player
# that does (`opens`) or does not open the hand, holding `card` (0 = J, 1 = Q, 2 = K).
Strategy = Callable[..., float]
DEALS = [(hero, villain) for hero in range(3) for villain in range(3) if hero != villain]


def win_probability(hero: Strategy, *, hero_opens: bool) -> float:
    """The hero's probability of winning one hand against the equilibrium, over the six deals."""
    return sum(_hand_won(hero, hero_opens, hero_card, villain_card) for hero_card, villain_card in DEALS) / len(DEALS)


def _hand_won(hero: Strategy, hero_opens: bool, hero_card: int, villain_card: int) -> float:
    """The hero's probability of winning the hand of one deal (the game tree: bet-call, bet-fold, check-check,
    check-bet-call, check-bet-fold)."""

    def act(is_hero: bool, move: str) -> float:
        strategy = hero if is_hero else aggression
        return strategy(opens=hero_opens == is_hero, move=move, card=hero_card if is_hero else villain_card)

    opener, other = hero_opens, not hero_opens  # whether the opener, and the other player, is the hero
    showdown = float(hero_card > villain_card)
    bet, call = act(opener, "bet"), act(other, "call")
    won = bet * (call * showdown + (1 - call) * float(opener))
    check_bet, call_back = act(other, "bet"), act(opener, "call")
    won += (1 - bet) * (1 - check_bet) * showdown
    return won + (1 - bet) * check_bet * (call_back * showdown + (1 - call_back) * float(other))


def _pure(table: dict[tuple[str, int], float], *, opens: bool, move: str, card: int) -> float:
    return table[(move, card)]


def best_pure_response(*, hero_opens: bool) -> tuple[float, dict[str, str]]:
    """(win probability, the moves) of the best pure strategy of the seat that does or does not open."""
    best: tuple[float, dict[str, str]] = (-1.0, {})
    for choice in itertools.product((0.0, 1.0), repeat=6):
        table = {("bet", card): choice[card] for card in range(3)} | {("call", c): choice[3 + c] for c in range(3)}
        value = win_probability(functools.partial(_pure, table), hero_opens=hero_opens)
        if value > best[0] + 1e-12:
            moves = {
                f"{CARDS[card]} {situation}": (aggressive if table[(move, card)] else passive)
                for (move, situation, aggressive, passive) in (
                    ("bet", "before a bet", "bet", "check"),
                    ("call", "after a bet", "call", "fold"),
                )
                for card in range(3)
            }
            best = (value, moves)
    return best


@front_door
def main() -> None:
    CLIParser(description=__doc__.split("\n\n")[0]).parse_args()
    equilibrium = {opens: win_probability(aggression, hero_opens=opens) for opens in (True, False)}
    best = {opens: best_pure_response(hero_opens=opens) for opens in (True, False)}
    for opens in (True, False):
        seat = "opens the hand" if opens else "does not open"
        print(f"the seat that {seat}: equilibrium {equilibrium[opens]:.4f}, best pure response {best[opens][0]:.4f}")
        print("  best response: " + "; ".join(f"{key}: {move}" for key, move in best[opens][1].items()))
    both = sum(equilibrium.values()) / 2
    best_both = sum(value for value, _ in best.values()) / 2
    print(
        f"seats alternating: equilibrium {both:.4f}, best pure response {best_both:.4f}: "
        f"a win rate can rise by at most {best_both - both:+.4f} against the equilibrium"
    )


if __name__ == "__main__":
    main()
