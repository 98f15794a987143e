"""What a tuned example reports: what its budget bought, row by row."""

import math

from rllib_ragen.rollout.evaluation import paired_outcomes
from rllib_ragen.rollout.game_evaluation import GameScore
from rllib_ragen.run.report import BudgetSpent, change_verdict, summarize, summarize_games


def _result(trained, success, eval_success=None):
    result = {
        "learners": {"default_policy": {"num_trained_trajectories": trained}},
        "env_runners": {"success_rate": success},
    }
    if eval_success is not None:
        result["evaluation"] = {"success_rate": eval_success}
    return result


def test_budget_spent_sums_trajectories_and_keeps_the_curve():
    budget = BudgetSpent()
    budget.add(iteration=1, minutes=0.5, result=_result(48.0, 0.25))
    budget.add(iteration=2, minutes=1.25, result=_result(16.0, 0.5, eval_success=0.625))
    budget.add(iteration=3, minutes=2.0, result={})  # an iteration that trained nothing logs no count
    budget.add(iteration=4, minutes=2.5, result={"evaluation": {"success_rate": math.nan}})  # did not evaluate
    assert budget.trajectories_trained == 64
    assert budget.rows[1] == {
        "iteration": 2.0,
        "minutes": 1.25,
        "trajectories_trained": 16.0,
        "success": 0.5,
        "eval_success": 0.625,
    }
    assert "eval_success" not in budget.rows[0] and "eval_success" not in budget.rows[3]
    assert math.isnan(budget.rows[2]["success"])
    assert budget.line(job_minutes=3.0).startswith(
        "the budget bought 4 iterations, 64 trajectories trained and 2.5 min of RL, in a job of 3.0 min"
    )


def test_an_empty_budget_says_so():
    assert (
        BudgetSpent()
        .line(job_minutes=1.0)
        .startswith("the budget bought 0 iterations, 0 trajectories trained and 0.0 min")
    )


def _score(outcomes, forfeits=()):
    return GameScore(tuple(outcomes), ("player_0", "player_1") * (len(outcomes) // 2), forfeits=tuple(forfeits))


def test_games_report_the_paired_change_of_wins_and_losses_per_opponent(capsys):
    # vs random: every game lost before RL and won after. Agresti-Min by hand: 20 gained, 0 lost of 20,
    # (20.5 - 0.5) / 22 = 0.909 -/+ 1.96 * sqrt(21 - 20**2 / 22) / 22 = 0.1496, so [+0.760, +1.000].
    # vs minimax: 4 games, losses [1, 1, 0, 0] -> [0, 1, 0, 0]: -0.25; (0.5 - 1.5) / 6 = -0.1667 -/+
    # 1.96 * sqrt(2 - 1 / 6) / 6 = 0.4423, so [-0.609, +0.276].
    before = {"random": _score(["loss"] * 20), "minimax": _score(["loss", "loss", "draw", "draw"])}
    after = {"random": _score(["win"] * 20), "minimax": _score(["draw", "loss", "draw", "draw"], [0, 1, 0, 0])}
    summary = summarize_games(before, after)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("vs random, 20 games, seats alternating (95% intervals): win 0.000 [")
    assert "change +1.000 [+0.760, +1.000]: wins more" in lines[0]
    assert "loss 1.000 [0.839, 1.000] -> 0.000 [0.000, 0.161], change -1.000 [-1.000, -0.760]: loses less" in lines[0]
    assert "loss 0.500 [0.150, 0.850] -> 0.250 [0.046, 0.699], change -0.250 [-0.609, +0.276]: no change beyond chance" in lines[1]
    # The one loss after RL against minimax was the policy's own invalid move; none before.
    assert lines[1].endswith("; lost by its own invalid move 0 -> 1")
    assert summary["minimax"]["forfeits"] == {"before": 0, "after": 1}
    assert summary["minimax"]["loss"]["before"] == [1.0, 1.0, 0.0, 0.0]
    assert summary["random"]["win"]["difference"] == 1.0


def test_the_verdict_reads_the_side_of_zero_the_interval_is_on():
    assert change_verdict(0.01, 0.3) == "learned" and change_verdict(-0.3, -0.01) == "got worse"
    assert change_verdict(-0.01, 0.3) == "no change beyond chance"
    assert change_verdict(-0.3, -0.01, up="loses more", down="loses less") == "loses less"


def test_a_self_play_evaluation_pairs_the_seats_that_moved_in_both(capsys):
    # Before RL each game ended at player 0's invalid first move; after RL both seats moved in game 0. The two
    # evaluations hold 2 and 3 trajectories: they pair on the 2 they share, not on list positions (the first
    # Kuhn Poker run ended with "need two equally long ... outcome lists, got 8 and 12").
    before = {"0/player_0": 0.0, "1/player_0": 1.0}
    after = {"0/player_0": 1.0, "0/player_1": 0.0, "1/player_0": 1.0}
    assert paired_outcomes(before, after) == ([0.0, 1.0], [1.0, 1.0])
    summary = summarize(*paired_outcomes(before, after), iterations=3, minutes=1.0)
    assert summary["difference"] == 0.5 and summary["before"] == [0.0, 1.0]
    assert "success on 2 evaluation seeds" in capsys.readouterr().out
