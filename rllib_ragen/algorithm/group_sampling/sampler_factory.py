"""`make_group_sampler`: the `GroupSampler` an algorithm's configuration asks for."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ray.rllib.env.env_runner_group import EnvRunnerGroup
from ray.rllib.offline.offline_data import OfflineData
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ragen.algorithm.group_sampling.async_sampler import AsyncSampler
from rllib_ragen.algorithm.group_sampling.group_sampler import GroupSampler
from rllib_ragen.algorithm.group_sampling.offline_sampler import OfflineSampler
from rllib_ragen.algorithm.group_sampling.online_sampler import LocalSampler
from rllib_ragen.algorithm.group_sampling.remote_sampler import RemoteSampler
from rllib_ragen.rollout.env_runner import LLMEnvRunner

if TYPE_CHECKING:
    from rllib_ragen.algorithm.starpo_settings import StarPOSettings


def make_group_sampler(
    config: StarPOSettings,
    metrics: MetricsLogger,
    *,
    offline_data: OfflineData | None,
    env_runner: LLMEnvRunner | None,
    env_runner_group: EnvRunnerGroup,
    policy_version: Callable[[], int],
) -> GroupSampler:
    """An offline dataset if one is configured, else the local runner if there is one, else the
    remote runners: sampling ahead with `async_rollouts`, one iteration at a time otherwise.

    Args:
        config: The algorithm's `StarPOConfig`.
        metrics: The algorithm's metrics logger.
        offline_data: The algorithm's `OfflineData`, or None.
        env_runner: The local `LLMEnvRunner`, or None (remote runners).
        env_runner_group: The algorithm's `EnvRunnerGroup`.
        policy_version: The learner's current policy version (for the staleness of async groups).
    """
    if offline_data is not None:
        return OfflineSampler(offline_data, metrics, n_groups=config.rollout.n_groups)
    online = dict(rollout=config.rollout, recording=config.recording, env=config.env, env_config=config.env_config)
    if env_runner is not None:
        return LocalSampler(metrics, env_runner=env_runner, **online)
    if config.async_rollout.async_rollouts:
        return AsyncSampler(
            metrics,
            env_runner_group=env_runner_group,
            policy_version=policy_version,
            settings=config.async_rollout,
            correct_stale=config.off_policy.off_policy_correction != "none",
            # A shard makes one engine call per turn.
            shard_timeout_s=config.rollout_engine.call_timeout_s * config.turn_budget.max_turns,
            **online,
        )
    return RemoteSampler(metrics, env_runner_group=env_runner_group, **online)
