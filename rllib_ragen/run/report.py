"""What a tuned example reports: the starting policy's evaluation, a line per iteration,
success before and after RL with intervals (and, for two-player games, win and loss rates against each
fixed opponent), and the `--as-test` verdict."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

from rllib_ragen.intervals import format_rate, paired_difference_interval

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm import Algorithm

    from rllib_ragen.rollout.game_evaluation import GameScore
    from rllib_ragen.run.callbacks import MLflowCallback


class StartingEvaluation(NamedTuple):
    """The starting policy's evaluation: its statistics, the 0/1 success of each trajectory keyed as
    `Evaluation.outcomes` and, for two-player games, its `GameScore` against each fixed opponent (empty otherwise)."""

    stats: dict[str, float]
    outcomes: dict[str, float]
    game_scores: dict[str, GameScore]


def evaluate_before_training(algo: Algorithm, callback: MLflowCallback) -> StartingEvaluation:
    """Evaluates the starting (e.g. warm-started) policy on the fixed evaluation seeds, logged as step 0."""
    from ray.rllib.utils.metrics import EVALUATION_RESULTS

    # One batched rollout with no progress of its own: minutes on a CPU without bf16 units.
    print(
        f"[0] evaluating the starting policy on the {algo.config.starpo_eval.eval_size} evaluation seeds...", flush=True
    )
    stats = algo.evaluate_fixed_seeds()
    # Logged as step 0 here, so not also into iteration 1's result (as if iteration 1 had evaluated).
    algo.metrics.delete(EVALUATION_RESULTS, key_error=False)
    outcomes = dict(algo.last_evaluation_outcomes)
    successes = list(outcomes.values())
    callback.log_initial_evaluation(algo, stats)
    size = algo.config.starpo_eval.eval_size
    print(
        f"[0] before RL, on the {size} evaluation seeds: success {format_rate(successes)} | "
        f"return {stats['episode_return_mean']:.3f} | valid {stats['valid_action_ratio']:.2f}",
        flush=True,
    )
    return StartingEvaluation(stats, outcomes, dict(algo.last_game_scores))


def change_verdict(low: float, high: float, *, up: str = "learned", down: str = "got worse") -> str:
    """The verdict of a paired change's 95% interval, (low, high) of after - before: `up` when it excludes
    zero from above, `down` when from below."""
    return up if low > 0 else (down if high < 0 else "no change beyond chance")


def summarize(before: list[float], after: list[float], *, iterations: int, minutes: float) -> dict[str, Any]:
    """Prints success before and after RL on the same seeds with 95% intervals; returns them."""
    difference, low, high = paired_difference_interval(before, after)
    print(
        f"success on {len(before)} evaluation seeds (95% intervals): before RL {format_rate(before)} -> "
        f"after {iterations} iterations ({minutes:.1f} min) {format_rate(after)}; "
        f"change {difference:+.3f} [{low:+.3f}, {high:+.3f}]: {change_verdict(low, high)}",
        flush=True,
    )
    return {
        "before": before,
        "after": after,
        "iterations": iterations,
        "minutes": minutes,
        "difference": difference,
        "difference_interval": [low, high],
    }


GAME_VERBS = {"win": "wins", "loss": "loses"}


def summarize_games(before: dict[str, GameScore], after: dict[str, GameScore]) -> dict[str, Any]:
    """Prints, per fixed opponent, the win and loss rates before and after RL on the same games (same seeds,
    same seats) with 95% intervals and the paired change of each; returns them by opponent."""
    summary: dict[str, Any] = {}
    for opponent, score in after.items():
        start = before[opponent]
        parts, rows = [], {}
        for outcome in ("win", "loss"):
            was, now = start.indicators(outcome), score.indicators(outcome)
            difference, low, high = paired_difference_interval(was, now)
            verb = GAME_VERBS[outcome]
            better = change_verdict(low, high, up=f"{verb} more", down=f"{verb} less")
            parts.append(
                f"{outcome} {format_rate(was)} -> {format_rate(now)}, change {difference:+.3f} "
                f"[{low:+.3f}, {high:+.3f}]: {better}"
            )
            rows[outcome] = {"before": was, "after": now, "difference": difference, "interval": [low, high]}
        # A loss by the policy's own invalid move is a different failure from a loss on the board.
        parts.append(f"lost by its own invalid move {start.forfeit_count} -> {score.forfeit_count}")
        rows["forfeits"] = {"before": start.forfeit_count, "after": score.forfeit_count}
        print(f"vs {opponent}, {score.games} games, seats alternating (95% intervals): {'; '.join(parts)}", flush=True)
        summary[opponent] = rows
    return summary


@dataclasses.dataclass
class BudgetSpent:
    """What a run's training budget bought: one row per iteration of this process (the minutes of RL
    at its end, the trajectories it trained, its training success and, when it evaluated, the
    evaluation's), i.e. the learning curve against minutes."""

    rows: list[dict[str, float]] = dataclasses.field(default_factory=list)

    def add(self, *, iteration: int, minutes: float, result: dict[str, Any]) -> None:
        learner = result.get("learners", {}).get("default_policy", {})
        row = {
            "iteration": float(iteration),
            "minutes": minutes,
            "trajectories_trained": float(learner.get("num_trained_trajectories", 0.0)),
            "success": float(result.get("env_runners", {}).get("success_rate", math.nan)),
        }
        eval_success = float(result.get("evaluation", {}).get("success_rate", math.nan))
        if not math.isnan(eval_success):  # NaN in an iteration that did not evaluate
            row["eval_success"] = eval_success
        self.rows.append(row)

    @property
    def trajectories_trained(self) -> int:
        return int(sum(row["trajectories_trained"] for row in self.rows))

    def line(self, *, job_minutes: float) -> str:
        """One line: iterations, trajectories trained and minutes of RL, within the job's minutes."""
        minutes = self.rows[-1]["minutes"] if self.rows else 0.0
        iterations = f"{len(self.rows)} iteration{'s' * (len(self.rows) != 1)}"
        return (
            f"the budget bought {iterations}, {self.trajectories_trained} trajectories trained "
            f"and {minutes:.1f} min of RL, in a job of {job_minutes:.1f} min (the rest: model, warm start, "
            "Ray and engines, the evaluation before RL)"
        )


def report_learning(
    algo: Algorithm,
    before: StartingEvaluation,
    result: dict[str, Any],
    *,
    minutes: float,
    budget: BudgetSpent,
    job_minutes: float,
    path: str | None,
) -> None:
    """Prints success before and after RL (`summarize`), the games' changes against each fixed opponent
    (`summarize_games`) and what the budget bought; with `path`, also writes them there as JSON, with both
    evaluations' statistics, the starting model and the learning curve."""
    from rllib_ragen.rollout.evaluation import paired_outcomes
    from rllib_ragen.run.atomic_files import write_text_atomic

    paired = paired_outcomes(before.outcomes, algo.last_evaluation_outcomes)
    summary = summarize(*paired, iterations=algo.iteration, minutes=minutes)
    if algo.last_game_scores:
        summary["games"] = summarize_games(before.game_scores, algo.last_game_scores)
    print(budget.line(job_minutes=job_minutes), flush=True)
    if path:
        summary.update(
            stats_before=before.stats,
            stats_after=result["evaluation"],
            starting_model=algo.config.llm_module.model,
            job_minutes=job_minutes,
            trajectories_trained=budget.trajectories_trained,
            curve=budget.rows,
        )
        write_text_atomic(path, json.dumps(summary, default=float))


def progress_line(iteration: int, total: int, result: dict[str, Any], seconds: float) -> str:
    runners = result.get("env_runners", {})
    learner = result.get("learners", {}).get("default_policy", {})
    evaluation = result.get("evaluation", {})
    parts = [
        f"[{iteration}/{total}]",
        f"success {runners.get('success_rate', float('nan')):.3f}",
        f"return {runners.get('episode_return_mean', float('nan')):.3f}",
        f"in-group std {runners.get('in_group_reward_std', float('nan')):.3f}",
        f"entropy {learner.get('entropy', float('nan')):.3f}",
        f"valid {runners.get('valid_action_ratio', float('nan')):.2f}",
    ]
    eval_success = evaluation.get("success_rate", math.nan)
    if not math.isnan(eval_success):  # NaN in an iteration that did not evaluate
        parts.append(f"eval success {eval_success:.3f}")
    parts.append(f"{seconds:.1f}s")
    return " | ".join(parts)


def check_success(result: dict[str, Any], threshold: float) -> None:
    """`--as-test`: exits 1 unless the success rate reached the threshold."""
    evaluation = result.get("evaluation", {})
    source = evaluation if "success_rate" in evaluation else result.get("env_runners", {})
    success = float(source.get("success_rate", math.nan))
    if not success >= threshold:  # a NaN or missing success fails too: nothing was shown to be learned
        print(f"--as-test FAILED: success {success:.3f} < {threshold}", file=sys.stderr)
        sys.exit(1)
    print(f"--as-test passed: success {success:.3f} >= {threshold}")
