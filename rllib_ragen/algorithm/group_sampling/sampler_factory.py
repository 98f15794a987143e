"""`make_group_sampler`: the `GroupSampler` an algorithm's configuration asks for."""

from __future__ import annotations

from collections.abc import Callable

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.env.env_runner_group import EnvRunnerGroup
from ray.rllib.offline.offline_data import OfflineData
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ragen.algorithm.group_sampling.async_sampler import AsyncSampler
from rllib_ragen.algorithm.group_sampling.group_sampler import GroupSampler
from rllib_ragen.algorithm.group_sampling.local_sampler import LocalSampler
from rllib_ragen.algorithm.group_sampling.offline_sampler import OfflineSampler
from rllib_ragen.algorithm.group_sampling.remote_sampler import RemoteSampler
from rllib_ragen.rollout.env_runner import LLMEnvRunner


def make_group_sampler(
    config: AlgorithmConfig,
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
        return OfflineSampler(offline_data, metrics, n_groups=config.n_groups)
    if env_runner is not None:
        return LocalSampler(config, metrics, env_runner=env_runner)
    if config.async_rollouts:
        return AsyncSampler(config, metrics, env_runner_group=env_runner_group, policy_version=policy_version)
    return RemoteSampler(config, metrics, env_runner_group=env_runner_group)
