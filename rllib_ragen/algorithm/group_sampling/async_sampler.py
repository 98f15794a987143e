"""`AsyncSampler`: remote runners sample the next iterations' groups while the learner updates.

The run-ahead itself (shards issued ahead, collected as they finish, a failed
runner's shard issued again) is `rllib_ragen.rollout.async_rollouts.RunAheadShards`;
this sampler hands it the seeds and decides what a stale group becomes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ray.rllib.env.env_runner_group import EnvRunnerGroup
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, TIMERS
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ragen.algorithm.group_sampling.online_sampler import OnlineSampler
from rllib_ragen.algorithm.group_sampling.remote_sampler import episodes_of, sample_shard
from rllib_ragen.algorithm.group_sampling.runner_metrics import merge_runner_metrics
from rllib_ragen.rollout.async_rollouts import (
    AsyncRolloutSettings,
    RunAheadShards,
    policy_version_of,
    staleness_counts,
)

ASYNC_ROLLOUT_RESULTS = "async_rollouts"
# The wait, after the update, for the shards still sampling before the weight sync.
ROLLOUT_DRAIN_TIMER = "rollout_drain"


class AsyncSampler(OnlineSampler):
    """The oldest batch sampled ahead, its groups past `max_staleness` dropped or kept.

    With off_policy_correction="none" a group more than `max_staleness` policy
    versions old is dropped; with "tis"/"mis" the loss corrects it. Logs
    `async_rollouts/`: the staleness histogram, stale groups dropped and
    corrected, and shards sampled again after a runner failed.

    Args:
        metrics: The algorithm's metrics logger.
        env_runner_group: The remote `LLMEnvRunner`s (num_env_runners >= 1).
        policy_version: The learner's current policy version (a group's staleness is
            this minus the version that sampled it).
        settings: How far the rollouts run ahead (`max_staleness`).
        correct_stale: The loss corrects stale groups (an off-policy correction is set): keep them.
        shard_timeout_s: Seconds one runner may take to sample its shard.
        **online: `OnlineSampler`'s arguments.
    """

    def __init__(
        self,
        metrics: MetricsLogger,
        *,
        env_runner_group: EnvRunnerGroup,
        policy_version: Callable[[], int],
        settings: AsyncRolloutSettings,
        correct_stale: bool,
        shard_timeout_s: float,
        **online: Any,
    ) -> None:
        super().__init__(metrics, **online)
        self.policy_version = policy_version
        self.max_staleness, self.correct_stale = settings.max_staleness, correct_stale
        self.shards = RunAheadShards(
            env_runner_group,
            sample_call=lambda seeds: functools.partial(sample_shard, seeds=seeds),
            shard_timeout_s=shard_timeout_s,
        )

    def sample_groups(self) -> list[MultiAgentEpisode]:
        results = self.shards.next_batch(self.seeds.take, run_ahead=self.max_staleness)
        episodes = episodes_of(results)
        self.metrics.aggregate(
            merge_runner_metrics([metrics for _, _, metrics in results], episodes), key=ENV_RUNNER_RESULTS
        )
        staleness = [self.policy_version() - policy_version_of(episode) for episode in episodes]
        stale = [s > self.max_staleness for s in staleness]
        correct = self.correct_stale
        stats = {
            **staleness_counts(staleness, max_staleness=self.max_staleness),
            "stale_groups_dropped": 0.0 if correct else float(sum(stale)),
            "stale_groups_corrected": float(sum(stale)) if correct else 0.0,
            "reissued_shards": float(self.shards.reissued_shards),
        }
        for key, value in stats.items():
            self.metrics.log_value((ASYNC_ROLLOUT_RESULTS, key), value, window=1)
        kept = episodes if correct else [e for e, too_old in zip(episodes, stale) if not too_old]
        if not kept:
            raise RuntimeError(
                f"every group of this iteration is more than max_staleness={self.max_staleness} policy versions "
                f"old (staleness {staleness}): the env runners are not receiving the weights"
            )
        return kept

    def drain(self) -> None:
        """Waits for the shards in flight: a runner's calls run in order, so it loads weights between shards."""
        with self.metrics.log_time((TIMERS, ROLLOUT_DRAIN_TIMER)):
            self.shards.drain()
