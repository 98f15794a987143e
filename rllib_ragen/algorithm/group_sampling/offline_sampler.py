"""`OfflineSampler`: one iteration's groups drawn from an offline dataset (`TrajectoryOfflineData`)."""

from __future__ import annotations

from typing import Any

from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.offline.offline_data import OfflineData
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ragen.rollout.trajectory_record import rollout_statistics

OFFLINE_DATA_RESULTS = "offline_data"


class OfflineSampler:
    """Draws `n_groups` group episodes per iteration, epoch after epoch; logs their statistics
    under `offline_data/`. It keeps no seeds: a dataset has its own order.

    Args:
        offline_data: The algorithm's `OfflineData` (`rllib_ragen.algorithm.offline_training.TrajectoryOfflineData`).
        metrics: The algorithm's metrics logger.
        n_groups: Groups per iteration.
    """

    def __init__(self, offline_data: OfflineData, metrics: MetricsLogger, *, n_groups: int) -> None:
        self.offline_data = offline_data
        self.metrics = metrics
        self.n_groups = n_groups

    def sample(self, *, iteration: int) -> list[MultiAgentEpisode]:
        episodes = self.offline_data.sample(num_samples=self.n_groups)
        for key, value in rollout_statistics(episodes).items():
            self.metrics.log_value((OFFLINE_DATA_RESULTS, key), value, window=1)
        return episodes

    def drain(self) -> None:
        """No rollout runs: the dataset does not change with the weights."""

    def get_state(self) -> dict[str, Any]:
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""

    def close(self) -> None:
        """Releases the dataset's Ray Data iterator (before Ray shuts down)."""
        self.offline_data.close()
