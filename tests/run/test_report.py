"""What a tuned example reports: what its budget bought, row by row."""

import math

from rllib_ragen.run.report import BudgetSpent


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
