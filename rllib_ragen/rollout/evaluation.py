"""Evaluation on fixed seeds: one trajectory per initial-state seed, summarised
with 95% Wilson intervals, and its trajectory page.

Every evaluation goes through `evaluate_on_seeds`: the periodic one in training
(`StarPO.evaluate_fixed_seeds`, which the tuned examples also run before RL and
`benchmarks/cpu_learning.py` reads back), and that of any saved policy
(`python -m rllib_ragen.run.evaluate`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from envs import make_env
from rllib_ragen.intervals import format_rate, wilson_interval
from rllib_ragen.rollout.env_runner import rollout_statistics, succeeded
from rllib_ragen.run.trajectory_page import grid_legend, trajectories_html

TABLE_HEADER = (
    "| env | episodes | success [95% interval] | mean return | valid answers | mean turns | mean response tokens |\n"
    "|---|---|---|---|---|---|---|"
)


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One evaluation on fixed seeds.

    Args:
        episodes: One finished group episode (group size 1) per seed that could start, in seed order.
        stats: Their `rollout_statistics`.
        successes: 0/1 success of each trajectory, in seed order (for intervals).
    """

    episodes: list
    stats: dict[str, float]
    successes: list[float]


def evaluate_on_seeds(
    sample: Callable[..., list], *, seeds: Sequence[int], temperature: float
) -> Evaluation:
    """Samples one trajectory per seed with `sample` (an `LLMEnvRunner.sample`-like
    callable taking seeds, group_size, temperature and evaluation) and summarises them."""
    episodes = sample(
        seeds=list(seeds), group_size=1, temperature=temperature, evaluation=True
    )
    successes = [
        float(succeeded(t))
        for episode in episodes
        for t in episode.agent_episodes.values()
    ]
    stats = rollout_statistics(episodes)
    # The success rate's 95% Wilson interval: the evaluation seeds are a sample of the task.
    stats["success_rate_low"], stats["success_rate_high"] = wilson_interval(sum(successes), len(successes))
    return Evaluation(episodes=episodes, stats=stats, successes=successes)


def table_row(
    label: str, stats: Mapping[str, float], successes: Sequence[float]
) -> str:
    """One `TABLE_HEADER` row: success with its Wilson interval, then the means.

    "valid answers" is the share of turns whose answer held at least one valid
    action (`valid_action_ratio`); response tokens are per turn.
    """
    return (
        f"| {label} | {len(successes)} | {format_rate(successes)} | {stats['episode_return_mean']:.3f} | "
        f"{stats['valid_action_ratio']:.2f} | {stats['num_turns_mean']:.2f} | {stats['response_length_mean']:.1f} |"
    )


def evaluation_table(evaluations: Mapping[str, Evaluation]) -> str:
    """A markdown table, one row per label (e.g. env name)."""
    rows = [table_row(label, e.stats, e.successes) for label, e in evaluations.items()]
    return "\n".join([TABLE_HEADER, *rows])


def evaluation_page(
    config: Any, episodes: Iterable[Any], *, title: str, limit: int, **settings: Any
) -> str:
    """The trajectory page of an evaluation under `config` (a `StarPOConfig`), with
    the run's settings on top (the config's that shape a rollout, plus `settings`)."""
    shown = {
        "env": config.env,
        "model": config.llm_model,
        "temperature": config.eval_temperature,
        "max turns": config.max_turns,
        "actions per turn / trajectory": f"{config.max_actions_per_turn} / {config.max_actions_per_traj}",
        "response length": config.response_length,
        "think": config.think,
        **settings,
    }
    legend = grid_legend(make_env(config.env, **config.env_config).instructions)
    return trajectories_html(
        episodes, title=title, settings=shown, legend=legend, limit=limit
    )
