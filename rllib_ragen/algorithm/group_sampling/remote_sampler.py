"""`RemoteSampler`: one iteration's groups from N remote `LLMEnvRunner`s, each a contiguous run of the seeds."""

from __future__ import annotations

import functools
import logging
from typing import Any

from ray.rllib.env.env_runner_group import EnvRunnerGroup
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ragen.algorithm.group_sampling.online_sampler import OnlineSampler
from rllib_ragen.algorithm.group_sampling.runner_metrics import merge_runner_metrics
from rllib_ragen.rollout.async_rollouts import ShardResult
from rllib_ragen.rollout.env_runner import LLMEnvRunner
from rllib_ragen.sharding import split_contiguous

logger = logging.getLogger(__name__)


def sample_shard(runner: LLMEnvRunner, *, seeds: list[int], **sample_kwargs: Any) -> ShardResult:
    """Runs on a remote runner: (first seed, its groups, its metrics)."""
    episodes = runner.sample(seeds=seeds, **sample_kwargs)
    return seeds[0], episodes, runner.get_metrics()


def sample_on_remote_runners(
    env_runner_group: EnvRunnerGroup, seeds: list[int], **sample_kwargs: Any
) -> list[ShardResult]:
    """The shards of `seeds`, in seed order, sampled in parallel on the healthy remote runners.

    Each runner rolls out a contiguous run of the seeds, so every group is whole and
    the union is what one runner would return for `seeds`. A runner that fails the
    call loses its groups (logged).

    Args:
        env_runner_group: The algorithm's `EnvRunnerGroup` of remote `LLMEnvRunner`s.
        seeds: One group each.
        **sample_kwargs: Passed on to `LLMEnvRunner.sample` (group_size, temperature, evaluation).
    """
    runner_ids = env_runner_group.healthy_env_runner_ids()
    if not runner_ids:
        raise RuntimeError("no healthy remote env runner is left to sample on")
    shards = [s for s in split_contiguous(seeds, len(runner_ids)) if s]
    results = env_runner_group.foreach_env_runner(
        [functools.partial(sample_shard, seeds=shard, **sample_kwargs) for shard in shards],
        kwargs=[{} for _ in shards],
        local_env_runner=False,
        remote_worker_ids=runner_ids[: len(shards)],
    )
    results.sort(key=lambda result: result[0])  # runners answer in any order
    if len(results) < len(shards):
        logger.warning(
            "%d of %d env runners failed this call; their groups are missing", len(shards) - len(results), len(shards)
        )
    return results


def episodes_of(results: list[ShardResult]) -> list[MultiAgentEpisode]:
    """The groups of shard results, in their order."""
    return [episode for _, shard, _ in results for episode in shard]


class RemoteSampler(OnlineSampler):
    """Samples each iteration's groups on the remote runners, then waits for all of them.

    The runners' metrics, merged (`merge_runner_metrics`), go to `env_runners/`.
    """

    def __init__(self, metrics: MetricsLogger, *, env_runner_group: EnvRunnerGroup, **online: Any) -> None:
        """`online`: `OnlineSampler`'s arguments."""
        super().__init__(metrics, **online)
        self.env_runner_group = env_runner_group

    def sample_groups(self) -> list[MultiAgentEpisode]:
        results = sample_on_remote_runners(self.env_runner_group, self.seeds.take())
        episodes = episodes_of(results)
        self.metrics.aggregate(
            merge_runner_metrics([metrics for _, _, metrics in results], episodes), key=ENV_RUNNER_RESULTS
        )
        return episodes
