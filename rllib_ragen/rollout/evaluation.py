"""Evaluation on fixed seeds: one trajectory per initial-state seed, summarised
with 95% Wilson intervals and failures counted by kind, and the results table.

Every evaluation goes through `evaluate_on_seeds`: the periodic one in training
(`StarPO.evaluate_fixed_seeds`, which the tuned examples also run before RL and
`benchmarks/cpu_learning.py` reads back), and that of any saved policy
(`rllib_ragen.run.evaluate`, the `rllib-ragen evaluate` command). Its trajectory
page is `rllib_ragen.run.trajectory_page.evaluation_page`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from rllib_ragen.checks import check_at_least_one
from rllib_ragen.intervals import format_rate, wilson_interval
from rllib_ragen.rollout.trajectory_record import FAILURES_PREFIX, failure_counts, rollout_statistics, succeeded

TABLE_HEADER = (
    "| env | episodes | success [95% interval] | mean return | valid answers | mean turns | mean response tokens |\n"
    "|---|---|---|---|---|---|---|"
)


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """Periodic evaluation on fixed initial states, group size 1 (set with `StarPOConfig.starpo_evaluation()`).

    Each field is documented where `StarPOConfig.starpo_evaluation()` sets it.
    """

    eval_interval: int = 10
    eval_size: int = 256
    eval_temperature: float = 0.5
    eval_seed: int = 123

    def __post_init__(self) -> None:
        check_at_least_one(self, "eval_size")
        if self.eval_interval < 0 or self.eval_temperature < 0:
            raise ValueError(
                f"eval_interval and eval_temperature must be >= 0, got {self.eval_interval}, {self.eval_temperature}"
            )

    @property
    def seeds(self) -> range:
        """The evaluation seeds, `eval_seed` .. `eval_seed + eval_size - 1`."""
        return range(self.eval_seed, self.eval_seed + self.eval_size)


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One evaluation on fixed seeds.

    Args:
        episodes: One finished group episode (group size 1) per seed that could start, in seed order.
        stats: Their `rollout_statistics`, the success rate's 95% interval and, as
            `failures/<kind>`, the failed trajectories of each kind (`failure_counts`).
        outcomes: 0/1 success of each trajectory, in seed order, keyed "<episode index>/<agent id>": a
            two-player game holds one trajectory per seat that moved, so two evaluations pair on their common
            keys (`paired_outcomes`), not on list positions.
    """

    episodes: list
    stats: dict[str, float]
    outcomes: dict[str, float]

    @property
    def successes(self) -> list[float]:
        """0/1 success of each trajectory, in seed order (for intervals)."""
        return list(self.outcomes.values())

    @property
    def failures(self) -> dict[str, int]:
        """Failed trajectories per kind (every kind the env can name, zeros included)."""
        return {
            key[len(FAILURES_PREFIX) :]: int(value)
            for key, value in self.stats.items()
            if key.startswith(FAILURES_PREFIX)
        }


def evaluate_on_seeds(sample: Callable[..., list], *, seeds: Sequence[int], temperature: float) -> Evaluation:
    """Samples one trajectory per seed with `sample` (an `LLMEnvRunner.sample`-like
    callable taking seeds, group_size, temperature and evaluation) and summarises them."""
    episodes = sample(seeds=list(seeds), group_size=1, temperature=temperature, evaluation=True)
    outcomes = {
        f"{index}/{agent}": float(succeeded(trajectory))
        for index, episode in enumerate(episodes)
        for agent, trajectory in episode.agent_episodes.items()
    }
    successes = list(outcomes.values())
    stats = rollout_statistics(episodes)
    # The success rate's 95% Wilson interval: the evaluation seeds are a sample of the task.
    stats["success_rate_low"], stats["success_rate_high"] = wilson_interval(sum(successes), len(successes))
    stats.update({f"{FAILURES_PREFIX}{kind}": float(n) for kind, n in failure_counts(episodes).items()})
    return Evaluation(episodes=episodes, stats=stats, outcomes=outcomes)


def paired_outcomes(before: Mapping[str, float], after: Mapping[str, float]) -> tuple[list[float], list[float]]:
    """The outcomes of the trajectories both evaluations hold (`Evaluation.outcomes`), in `before`'s order: in a
    two-player game a seat moves in one evaluation and not in the other when the game ended first."""
    common = [key for key in before if key in after]
    return [before[key] for key in common], [after[key] for key in common]


def table_row(label: str, stats: Mapping[str, float], successes: Sequence[float]) -> str:
    """One `TABLE_HEADER` row: success with its Wilson interval, then the means.

    "valid answers" is the share of turns whose answer held at least one valid
    action (`valid_action_ratio`); response tokens are per turn.
    """
    return (
        f"| {label} | {len(successes)} | {format_rate(successes)} | {stats['episode_return_mean']:.3f} | "
        f"{stats['valid_action_ratio']:.2f} | {stats['num_turns_mean']:.2f} | {stats['response_length_mean']:.1f} |"
    )


def failures_table(evaluation: Evaluation) -> str:
    """A markdown table of the failed trajectories per kind, with their share of all trajectories."""
    total = max(len(evaluation.successes), 1)
    rows = [f"| {kind} | {n} | {n / total:.3f} |" for kind, n in evaluation.failures.items()]
    return "\n".join(["| failure kind | trajectories | share |", "|---|---|---|", *rows])


def evaluation_table(evaluations: Mapping[str, Evaluation]) -> str:
    """A markdown table, one row per label (e.g. env name)."""
    rows = [table_row(label, e.stats, e.successes) for label, e in evaluations.items()]
    return "\n".join([TABLE_HEADER, *rows])
