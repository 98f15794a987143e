"""`LocalSampler`: one iteration's groups from the algorithm's local `LLMEnvRunner` (num_env_runners=0)."""

from __future__ import annotations

from typing import Any

from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ragen.algorithm.group_sampling.online_sampler import OnlineSampler
from rllib_ragen.rollout.env_runner import LLMEnvRunner


class LocalSampler(OnlineSampler):
    """Samples on the local runner, in this process; its metrics go to `env_runners/`."""

    def __init__(self, metrics: MetricsLogger, *, env_runner: LLMEnvRunner, **online: Any) -> None:
        """`online`: `OnlineSampler`'s arguments."""
        super().__init__(metrics, **online)
        self.env_runner = env_runner

    def sample_groups(self) -> list[MultiAgentEpisode]:
        episodes = self.env_runner.sample(seeds=self.seeds.take())
        self.metrics.aggregate([self.env_runner.get_metrics()], key=ENV_RUNNER_RESULTS)
        return episodes
