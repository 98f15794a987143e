"""Game evaluation on scripted-vs-scripted play: seats alternate, rates and Wilson intervals are right,
the exact TicTacToe expert never loses to random play, and Kuhn Poker's chips per hand sit beside the
equilibrium's value for the same seats."""

from __future__ import annotations

import math

import pytest
from conftest import require_extra

from rllib_ragen.rollout.game_evaluation import KUHN_FIRST_PLAYER_VALUE, score_games
from rllib_ragen.rollout.game_rollout import GameResult, play_games
from rllib_ragen.rollout.self_play_settings import alternating_seats

require_extra("textarena", "cpu,test,textarena")

from envs.textarena_two_player import TwoPlayerGame  # noqa: E402


def _scripted_games(game: str, n: int, evaluated: str, opponent: str) -> list[GameResult]:
    seeds = list(range(100, 100 + n))
    games = [TwoPlayerGame(game=game) for _ in seeds]
    episodes, results = play_games(
        games, seeds, alternating_seats(opponent, evaluated=evaluated), None, group_ids=list(range(n))
    )
    assert all(not episode.agent_episodes or len(episode) == 0 for episode in episodes)  # no LLM seat: no agent
    return results


def _wilson(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_minimax_against_random_alternates_seats_never_loses_and_its_rates_are_counted() -> None:
    results = _scripted_games("TicTacToe-v0", 24, "minimax", "random")
    score = score_games(results, "minimax")
    assert score.seats == ("player_0", "player_1") * 12  # the seats alternate game by game
    assert [r.modules for r in results[:2]] == [
        {"player_0": "minimax", "player_1": "random"},
        {"player_0": "random", "player_1": "minimax"},
    ]
    wins = sum(1 for r, seat in zip(results, score.seats) if r.rewards[seat] > 0)
    draws = sum(1 for r, seat in zip(results, score.seats) if r.rewards[seat] == 0)
    assert score.counts == {"win": wins, "draw": draws, "loss": 0} and wins + draws == 24
    assert wins > 12  # random play blunders: the expert wins most games
    metrics = score.metrics("vs_random/")
    assert metrics["vs_random/win_rate"] == wins / 24 and metrics["vs_random/loss_rate"] == 0.0
    assert (metrics["vs_random/win_rate_low"], metrics["vs_random/win_rate_high"]) == pytest.approx(_wilson(wins, 24))
    assert metrics["vs_random/loss_rate_high"] == pytest.approx(_wilson(0, 24)[1])
    # From the other side: random never wins against the expert.
    assert score_games(results, "random").counts["win"] == 0


def test_kuhn_poker_chips_per_hand_and_the_equilibrium_for_the_same_seats() -> None:
    results = _scripted_games("KuhnPoker-v0", 3, "random", "random")
    # Both seats are "random" here, so score a relabelled copy with the evaluated seat alternating.
    relabelled = [
        GameResult(r.seed, {seat: ("evaluated" if seat == f"player_{i % 2}" else "other") for seat in r.modules},
                   r.rewards, r.chips, r.hands_opened)
        for i, r in enumerate(results)
    ]
    score = score_games(relabelled, "evaluated")
    seats = ["player_0", "player_1", "player_0"]
    assert score.chips_per_hand == pytest.approx(sum(r.chips[s] for r, s in zip(results, seats)) / 9)
    # player_0 opens one hand of three (hand 2), player_1 two (hands 1 and 3): +1/18 and -1/18 a game.
    assert results[0].hands_opened == {"player_0": (1, 3), "player_1": (2, 3)}
    value = -KUHN_FIRST_PLAYER_VALUE
    assert score.equilibrium_chips_per_hand == pytest.approx((value - value + value) / 9)
    assert "x/chips_per_hand" in score.metrics("x/")


def test_a_game_without_the_evaluated_module_is_refused() -> None:
    result = GameResult(1, {"player_0": "random", "player_1": "random"}, {"player_0": 1.0, "player_1": -1.0})
    with pytest.raises(ValueError, match="one seat"):
        score_games([result], "minimax")


def test_a_loss_by_the_evaluated_modules_own_invalid_move_is_a_forfeit_and_other_losses_are_not() -> None:
    game = TwoPlayerGame(game="TicTacToe-v0", max_game_turns=9)
    game.reset(seed=0)
    game.step({"player_0": "[4]"})
    _, rewards, terminateds, *_ = game.step({"player_1": "[4]"})  # an occupied cell: player_1 forfeits
    assert terminateds["__all__"] and game.forfeited_by == "player_1" and rewards["player_1"] == -1.5
    game.reset(seed=0)
    assert game.forfeited_by is None  # a new game forgets it
    board_loss = GameResult(2, {"player_0": "random", "player_1": "policy"}, {"player_0": 1.0, "player_1": -1.0})
    forfeit = GameResult(3, {"player_0": "policy", "player_1": "random"}, {"player_0": -1.5, "player_1": 0.5},
                         forfeited_by="player_0")
    opponent_forfeit = GameResult(4, {"player_0": "random", "player_1": "policy"}, {"player_0": -1.5, "player_1": 0.5},
                                  forfeited_by="player_0")
    score = score_games([board_loss, forfeit, opponent_forfeit], "policy")
    assert score.outcomes == ("loss", "loss", "win") and score.forfeits == (False, True, False)
    assert score.forfeit_count == 1 and score.metrics("vs_random/")["vs_random/forfeit_rate"] == pytest.approx(1 / 3)
