"""`OnlineSampler`: what the samplers of fresh rollouts share (local, remote and async runners), and
`LocalSampler`, the one that samples in this process.

Each owns the run's training-seed cursor (`TrainSeedCursor`): its state goes into
the algorithm's checkpoint, so a resumed run samples the seeds after the last ones
trained. Every `write_rollouts_every` iterations the sampled groups are written to
Parquet when `rollout_parquet_dir` is set (`.rollout_recording()`).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ragen.data.parquet import RecordingSettings, write_rollouts
from rllib_ragen.rollout.env_group import RolloutSettings, training_env_config
from rllib_ragen.rollout.env_runner import LLMEnvRunner

# The cursor's entry in the algorithm's state (and so in every checkpoint's `state.pkl`).
TRAIN_SEED_CURSOR = "next_train_seed"


class TrainSeedCursor:
    """Hands out training seeds in order, `n_groups` per iteration, so no initial state repeats: the
    one place the run keeps its next training seed.

    Args:
        start: The first training seed (`train_seed_start`).
        n_groups: Seeds per iteration, one per group.
    """

    def __init__(self, *, start: int, n_groups: int) -> None:
        self.next_seed = start
        self.n_groups = n_groups

    def take(self) -> list[int]:
        """The next iteration's seeds; the cursor moves past them."""
        seeds = list(range(self.next_seed, self.next_seed + self.n_groups))
        self.next_seed += self.n_groups
        return seeds


class OnlineSampler(abc.ABC):
    """A `GroupSampler` of fresh rollouts; subclasses say how one iteration's groups are sampled.

    Args:
        metrics: The algorithm's metrics logger (the rollout metrics go to `env_runners/`).
        rollout: The rollout settings (the training seeds, the training env's overrides).
        recording: Where and how often the sampled groups are written to Parquet.
        env: The env's name (recorded with the groups).
        env_config: The env's config, before the training overrides.
    """

    def __init__(
        self,
        metrics: MetricsLogger,
        *,
        rollout: RolloutSettings,
        recording: RecordingSettings,
        env: str,
        env_config: Mapping[str, Any],
    ) -> None:
        self.metrics = metrics
        self.recording = recording
        self.env, self.train_env_config = env, training_env_config(env_config, rollout)
        self.seeds = TrainSeedCursor(start=rollout.train_seed_start, n_groups=rollout.n_groups)

    @abc.abstractmethod
    def sample_groups(self) -> list[MultiAgentEpisode]:
        """One iteration's groups (taking their seeds from `self.seeds`), with their metrics logged."""

    def sample(self, *, iteration: int) -> list[MultiAgentEpisode]:
        episodes = self.sample_groups()
        recording = self.recording
        if recording.rollout_parquet_dir and iteration % recording.write_rollouts_every == 0:
            write_rollouts(
                episodes,
                recording.rollout_parquet_dir,
                iteration=iteration,
                env=self.env,
                env_config=self.train_env_config,
            )
        return episodes

    def drain(self) -> None:  # noqa: B027 (a no-op by default, not abstract: only the async sampler has work to drain)
        """Nothing is left running once `sample` returns (the async sampler overrides this)."""

    def get_state(self) -> dict[str, Any]:
        return {TRAIN_SEED_CURSOR: self.seeds.next_seed}

    def set_state(self, state: dict[str, Any]) -> None:
        self.seeds.next_seed = state.get(TRAIN_SEED_CURSOR, self.seeds.next_seed)

    def close(self) -> None:  # noqa: B027 (a no-op by default: the runners belong to the algorithm)
        """The runners belong to the algorithm, which stops them."""


class LocalSampler(OnlineSampler):
    """Samples on the algorithm's local `LLMEnvRunner`, in this process (num_env_runners=0); its metrics
    go to `env_runners/`."""

    def __init__(self, metrics: MetricsLogger, *, env_runner: LLMEnvRunner, **online: Any) -> None:
        """`online`: `OnlineSampler`'s arguments."""
        super().__init__(metrics, **online)
        self.env_runner = env_runner

    def sample_groups(self) -> list[MultiAgentEpisode]:
        episodes = self.env_runner.sample(seeds=self.seeds.take())
        self.metrics.aggregate([self.env_runner.get_metrics()], key=ENV_RUNNER_RESULTS)
        return episodes
