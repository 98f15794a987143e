"""The remote runners' metrics of one iteration, merged into the numbers one runner would report."""

from __future__ import annotations

from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ragen.rollout.trajectory_record import rollout_statistics

# Per-runner metrics that add up over parallel runners, and the one that is a wall time.
_SUMMED_RUNNER_METRICS = (
    "env_errors",
    "truncated_prompt_trajectories",
    "rollout_tokens_per_s",
    "rollout_prefill_tokens_per_s",
)
_WALL_TIME_METRIC = "rollout_time_s"


def merge_runner_metrics(per_runner: list[dict], episodes: list[MultiAgentEpisode]) -> list[dict]:
    """The remote runners' reduced metrics, with the rollout's own numbers made exact.

    RLlib averages the runners' window-1 values, right for e.g. the engine overhead
    but not for statistics of all groups (recomputed here from `episodes`), counts and
    throughputs (summed) or the rollout's wall time (the slowest runner's).
    """
    exact = dict(rollout_statistics(episodes))
    for key in _SUMMED_RUNNER_METRICS:
        exact[key] = sum(float(m[key].peek()) for m in per_runner if key in m)
    exact[_WALL_TIME_METRIC] = max(
        (float(m[_WALL_TIME_METRIC].peek()) for m in per_runner if _WALL_TIME_METRIC in m), default=0.0
    )
    merged = MetricsLogger()
    for key, value in exact.items():
        merged.log_value(key, value, window=1)
    rest = [{k: v for k, v in m.items() if k not in exact} for m in per_runner]
    return [*rest, merged.reduce()]
