"""Kuhn Poker's equilibrium: exact best responses to it are worth the game's value and no more; it plays
TextArena's game legally on either seat and wins chips from random play."""

from __future__ import annotations

import itertools
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from conftest import require_extra
from run_helpers import load_script

from envs.kuhn_equilibrium import aggression, equilibrium_move

DEALS = list(itertools.permutations(range(3), 2))  # (opener's card, responder's card): 6 deals, equally likely


def _p(*, opens: bool, move: str, card: int) -> Fraction:
    return Fraction(aggression(opens=opens, move=move, card=card)).limit_denominator(100)


def _showdown(opener: int, responder: int, stake: int) -> int:
    return stake if opener > responder else -stake


def _responder_best_value() -> Fraction:
    """The opener's chips a hand when the responder answers the equilibrium's opener with a best response.

    The responder sees its card and the opener's first move: after a bet it calls or folds, after a check it
    checks or bets (and then the opener calls or folds by the equilibrium)."""
    total = Fraction(0)
    for card in range(3):
        others = [c for c in range(3) if c != card]
        after_bet = {"fold": Fraction(0), "call": Fraction(0)}
        after_check = {"check": Fraction(0), "bet": Fraction(0)}
        for opener in others:
            bet = _p(opens=True, move="bet", card=opener)
            call = _p(opens=True, move="call", card=opener)
            after_bet["fold"] += bet * 1
            after_bet["call"] += bet * _showdown(opener, card, 2)
            after_check["check"] += (1 - bet) * _showdown(opener, card, 1)
            after_check["bet"] += (1 - bet) * (call * _showdown(opener, card, 2) - (1 - call) * 1)
        # The responder picks, at each of its two decisions, what leaves the opener least.
        total += min(after_bet.values()) + min(after_check.values())
    return total / len(DEALS)


def _opener_best_value() -> Fraction:
    """The opener's chips a hand when it answers the equilibrium's responder with a best response: per card, bet
    or check, and after check-bet call or fold (one choice per card, whatever the responder holds)."""
    total = Fraction(0)
    for card in range(3):
        others = [c for c in range(3) if c != card]
        bet = sum(
            (
                (1 - _p(opens=False, move="call", card=other)) * 1
                + _p(opens=False, move="call", card=other) * _showdown(card, other, 2)
                for other in others
            ),
            Fraction(0),
        )
        check_then = {
            reply: sum(
                (
                    (1 - _p(opens=False, move="bet", card=other)) * _showdown(card, other, 1)
                    + _p(opens=False, move="bet", card=other) * (_showdown(card, other, 2) if reply == "call" else -1)
                    for other in others
                ),
                Fraction(0),
            )
            for reply in ("call", "fold")
        }
        total += max(bet, max(check_then.values()))
    return total / len(DEALS)


def test_best_responses_to_the_equilibrium_get_exactly_the_games_value() -> None:
    # Kuhn's value: -1/18 chip a hand to the player who opens. Neither side's best response does better.
    assert _responder_best_value() == Fraction(-1, 18)
    assert _opener_best_value() == Fraction(-1, 18)


def test_the_pure_moves_by_hand() -> None:
    # A king is always called and (as responder) always bet; a jack facing a bet always folds; a queen that
    # opens never bets.
    assert aggression(opens=False, move="call", card=2) == aggression(opens=False, move="bet", card=2) == 1.0
    assert aggression(opens=True, move="call", card=0) == aggression(opens=False, move="call", card=0) == 0.0
    assert aggression(opens=True, move="bet", card=1) == 0.0


def test_the_move_is_drawn_from_the_state_and_names_a_legal_action() -> None:
    rng = np.random.default_rng(0)
    queen_opens = {
        "current_legal_action_tree": {"check": {}, "bet": {}},
        "starting_player": 1,
        "player_cards": {0: 2, 1: 1},
    }
    assert {equilibrium_move(queen_opens, 1, rng) for _ in range(20)} == {"[check]"}
    jack_facing_bet = {
        "current_legal_action_tree": {"fold": "loser", "call": "showdown"},
        "starting_player": 1,
        "player_cards": {0: 0, 1: 2},
    }
    assert equilibrium_move(jack_facing_bet, 0, rng) == "[fold]"
    responder_jack_after_check = dict(jack_facing_bet, current_legal_action_tree={"check": "showdown", "bet": {}})
    bluffs = np.mean([equilibrium_move(responder_jack_after_check, 0, rng) == "[bet]" for _ in range(3000)])
    assert bluffs == pytest.approx(1 / 3, abs=0.03)
    with pytest.raises(ValueError, match="no move"):
        equilibrium_move(dict(queen_opens, current_legal_action_tree="showdown"), 1, rng)


def test_on_textarena_it_plays_legally_on_both_seats_and_wins_chips_from_random_play() -> None:
    require_extra("textarena", "cpu,test,textarena")
    from envs.textarena_two_player import SEATS, TwoPlayerGame

    game = TwoPlayerGame(game="KuhnPoker-v0")
    chips = []
    for seed in range(200):
        expert = SEATS[seed % 2]
        game.reset(seed=seed)
        while not game.done:
            seat = game.current_seat
            game.step({seat: game.scripted_move("equilibrium" if seat == expert else "random")})
        assert game.forfeited_by is None, seed
        chips.append(game.chips(expert) / 3)  # 3 hands a game
    # Random play (each listed move at even odds) loses to the equilibrium; its mean is about +0.3 a hand.
    mean, half_width = np.mean(chips), 1.96 * np.std(chips) / np.sqrt(len(chips))
    assert mean - half_width > 0.0, (mean, half_width)


def test_the_win_ceiling_of_one_hand_against_the_equilibrium_by_hand() -> None:
    """`benchmarks/kuhn_win_ceiling.py`: betting and calling with every card wins 11/18 of the hands it opens
    against the equilibrium and 5/9 of the others (by hand, over the six deals: opening, it loses only a jack
    called by a queen, 1/3, or by a king, and a queen called by a king; answering, it loses a jack to a queen
    that calls, 2/3, and to a king, and a queen to a king); no pure strategy wins more, and the equilibrium
    against itself wins the hands it opens as often as the other seat loses them."""
    ceiling = load_script(Path(__file__).parents[2] / "benchmarks" / "kuhn_win_ceiling.py")

    def always_aggressive(*, opens: bool, move: str, card: int) -> float:
        return 1.0

    assert ceiling.win_probability(always_aggressive, hero_opens=True) == pytest.approx(11 / 18)
    assert ceiling.win_probability(always_aggressive, hero_opens=False) == pytest.approx(5 / 9)
    assert ceiling.best_pure_response(hero_opens=True)[0] == pytest.approx(11 / 18)
    assert ceiling.best_pure_response(hero_opens=False)[0] == pytest.approx(5 / 9)
    opens, answers = (ceiling.win_probability(aggression, hero_opens=seat) for seat in (True, False))
    assert opens + answers == pytest.approx(1.0) and opens > 0.5
