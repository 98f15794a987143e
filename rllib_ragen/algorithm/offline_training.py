"""Offline StarPO and behaviour cloning from a Parquet dataset of trajectories, via RLlib's offline API.

    config = offline_config(
        StarPOConfig().environment("sokoban").llm(model=...).rollouts(n_groups=8),
        OfflineSettings(input_path="demos/", objective="bc"),
    )
    algo = config.build_algo()   # RLlib builds TrajectoryOfflineData from config.input_
    algo.train()                 # n_groups groups from the dataset -> learner update -> weight sync

How this uses RLlib's offline API (Ray 2.60):
- `config.offline_data(input_=..., offline_data_class=TrajectoryOfflineData)`:
  `Algorithm.setup` builds the `OfflineData`, which reads the Parquet files
  with `ray.data.read_parquet`.
- `TrajectoryOfflineData.sample(n)` maps the rows with `map_batches` (rows ->
  trajectory episodes), assembles the group episodes and returns `n` of
  them, epoch after epoch.
- `StarPO.training_step` feeds them to `learner_group.update(episodes=...)`
  exactly like fresh rollouts, so the learner connector turns them into token
  batches on the learner.

What is deliberately not used: RLlib's `OfflinePreLearner` (`prelearner_class`)
runs the learner connector inside the data pipeline on a module copy that is
synced once. StarPO's connector scores every row with the *current* weights
(old log-probs for the PPO ratio, critic values for GAE), which that copy no
longer has after the first update, and its [rows, L] padded tensors would be
re-batched row by row across different paddings. `input_read_episodes`
stores msgpacked `SingleAgentEpisode` states; a documented Arrow schema
(`rllib_ragen.data.schema`) is readable by any tool instead. So episodes,
which carry no weights, are what flows through Ray Data, and the row mapping
is a plain function (tasks on pooled workers, no model in the data workers).

Behaviour cloning is the same learner with another loss (`BCTorchLearner`):
the negative log-likelihood of the dataset's response tokens, aggregated like
the StarPO loss (`loss_agg_mode`). Its connector is the first piece of StarPO's,
the token rows (`TokenRows`): no scoring pass, no advantages, no critic.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.connectors.learner.learner_connector_pipeline import (
    LearnerConnectorPipeline,
)
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.offline.offline_data import OfflineData
from ray.rllib.utils.annotations import override
from ray.rllib.utils.typing import ModuleID

from rllib_ragen.algorithm.starpo import StarPO, StarPOConfig
from rllib_ragen.columns import GENERATED_MASK, TOKEN_ENTROPY, TOKEN_LOGP
from rllib_ragen.data.parquet import iter_group_episodes, map_to_trajectories
from rllib_ragen.logits import masked_mean
from rllib_ragen.rllib_private import set_learner_connector
from rllib_ragen.training.learner import StarPOTorchLearner
from rllib_ragen.training.learner_connector import TokenRows, micro_batches
from rllib_ragen.training.losses import aggregate_loss
from rllib_ragen.training.module import score_generated_tokens, trunk_hidden
from rllib_ragen.training.token_batch import token_batch_of_episodes

if TYPE_CHECKING:
    from transformers import PreTrainedModel

OBJECTIVES = ("bc", "starpo")


@dataclasses.dataclass(frozen=True)
class OfflineSettings:
    """What to train on offline, and how.

    Args:
        input_path: A Parquet file, a directory of them, or a tuple of files,
            in `rllib_ragen.data.schema.TRAJECTORY_SCHEMA` (local paths are
            checked to exist).
        objective: "bc": maximise the log-likelihood of the dataset's response
            tokens (behaviour cloning, e.g. from solver demonstrations);
            "starpo": the configured StarPO update (estimator, clipping,
            critic, group filter) on the stored trajectories as if they were
            fresh rollouts, e.g. a run's own rollouts.
    """

    input_path: str | Path | tuple[str, ...]
    objective: str = "bc"

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {list(OBJECTIVES)}, got {self.objective!r}")
        paths = (self.input_path,) if isinstance(self.input_path, (str, Path)) else tuple(self.input_path)
        if not paths:
            raise ValueError("input_path must name at least one Parquet file or directory")
        for path in paths:
            if "://" not in str(path) and not Path(path).exists():
                raise FileNotFoundError(f"offline input {path} does not exist")
        object.__setattr__(self, "input_path", str(paths[0]) if len(paths) == 1 else tuple(str(p) for p in paths))

    @property
    def rllib_input(self) -> str | list[str]:
        """`input_` as RLlib takes it: one path or a list of paths."""
        # __post_init__ leaves a str or a tuple of str.
        return list(self.input_path) if isinstance(self.input_path, tuple) else str(self.input_path)


def offline_config(config: StarPOConfig, settings: OfflineSettings) -> StarPOConfig:
    """Sets `config` up to train from `settings.input_path` through RLlib's offline API.

    The env runner stays: it evaluates the policy in the real env. With the
    "bc" objective every group is kept (top-k ratio 1.0): a
    demonstration group has no in-group reward spread to rank by. The data is
    read in its stored order; to shuffle, add RLlib's
    `config.offline_data(iter_batches_kwargs={"batch_size": 64, "local_shuffle_buffer_size": 256})`.
    """
    config.offline_data(
        input_=settings.rllib_input,
        offline_data_class=TrajectoryOfflineData,
        input_read_method_kwargs={"include_paths": True},
    )
    if settings.objective == "bc":
        config.learners(learner_class=BCTorchLearner)
        config.training(rollout_filter_strategy="top_k_ratio", rollout_filter_ratio=1.0)
    return config


class TrajectoryOfflineData(OfflineData):
    """RLlib `OfflineData` over trajectory Parquet files that samples whole group episodes.

    Rows become trajectory episodes in `map_batches` with a stateless function
    (`rllib_ragen.data.parquet.map_to_trajectories`), run as Ray tasks.
    """

    # Set by RLlib's OfflineData.__init__ (Ray is read as untyped).
    data: Any
    data_is_mapped: bool

    def __init__(self, config: StarPOConfig) -> None:
        if config.prelearner_class is not None:
            raise ValueError(
                "TrajectoryOfflineData maps rows to episodes itself and runs the learner connector on the "
                f"learner; unset prelearner_class (got {config.prelearner_class.__name__})"
            )
        super().__init__(config)
        self._groups: Generator[MultiAgentEpisode, None, None] | None = None

    @override(OfflineData)
    def sample(
        self,
        num_samples: int,
        return_iterator: bool = False,
        num_shards: int = 1,
        module_state: dict | None = None,
    ) -> list[MultiAgentEpisode]:
        """The next `num_samples` group episodes (not timesteps); restarts at the end of the data.

        The learner group shards episodes over learners itself, so only one
        driver-side stream exists (`return_iterator` and `num_shards` > 1 are refused).
        """
        if return_iterator or num_shards > 1:
            raise ValueError(
                "TrajectoryOfflineData returns episodes to the driver; iterators and shards are not supported"
            )
        if not self.data_is_mapped:
            self.data = map_to_trajectories(self.data, **self.config.map_batches_kwargs)
            if self.materialize_mapped_data:
                self.data = self.data.materialize()
            self.data_is_mapped = True
        if self._groups is None:
            self._groups = self._endless_groups()
        return list(itertools.islice(self._groups, num_samples))

    def close(self) -> None:
        """Ends the current pass over the data (call before `ray.shutdown()` to release its Ray Data iterator)."""
        if self._groups is not None:
            self._groups.close()
            self._groups = None

    def _endless_groups(self) -> Generator[MultiAgentEpisode, None, None]:
        while True:
            count = 0
            for group in iter_group_episodes(self.data, **self.iter_batches_kwargs):
                count += 1
                yield group
            if count == 0:
                raise ValueError(f"offline dataset {self.path} holds no trajectories")


class BCTorchLearner(StarPOTorchLearner):
    """Behaviour cloning: minimises the NLL of the response tokens (same module, optimiser, micro-batching)."""

    @override(StarPOTorchLearner)
    def build(self) -> None:
        super().build()
        set_learner_connector(
            self,
            LearnerConnectorPipeline(
                connectors=[TokenRows(history_window=self.config.protocol.history_window, log_trained_tokens=True)]
            ),
        )

    @override(StarPOTorchLearner)
    def compute_loss_for_module(
        self, *, module_id: ModuleID, config: AlgorithmConfig, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        mask = batch[GENERATED_MASK]  # a likelihood loss trains on every generated token
        loss_agg_mode = self.loss_settings.loss_agg_mode
        nll = aggregate_loss(-fwd_out[TOKEN_LOGP], mask, loss_agg_mode=loss_agg_mode)
        entropy = aggregate_loss(fwd_out[TOKEN_ENTROPY], mask, loss_agg_mode=loss_agg_mode)
        self.metrics.log_value((module_id, "bc_nll"), float(nll.detach()), reduce="mean")
        self.metrics.log_value((module_id, "entropy"), float(entropy.detach()), reduce="mean")
        return nll


def learner_nll(algo: StarPO, episodes: Sequence[MultiAgentEpisode]) -> float:
    """Mean NLL per response token of `episodes` under the (first) learner's current policy."""
    window = algo.config.protocol.history_window

    def nll(learner: StarPOTorchLearner) -> float:
        return response_token_nll(learner.module[DEFAULT_MODULE_ID].policy, episodes, history_window=window)

    return float(next(iter(algo.learner_group.foreach_learner(nll))).get())


@torch.no_grad()
def response_token_nll(
    policy: PreTrainedModel,
    episodes: Sequence[MultiAgentEpisode],
    *,
    history_window: int | None,
    micro_batch_size: int = 4,
) -> float:
    """Mean NLL per response token of `episodes` under an HF causal LM (e.g. demonstrations).

    Args:
        policy: The causal LM (e.g. `LLMRLModule.policy`).
        episodes: Group episodes.
        history_window: The protocol's history window (decides the rows).
        micro_batch_size: Rows per forward pass.
    """
    tokens = token_batch_of_episodes(episodes, history_window=history_window)
    total, count = 0.0, 0
    for micro in micro_batches(tokens, micro_batch_size, policy.device):
        n = int(micro[GENERATED_MASK].sum())
        total += float(response_nll(policy, micro)) * n
        count += n
    return total / max(count, 1)


def response_nll(model: PreTrainedModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean negative log-likelihood of the response tokens of `batch` (rows [R, L]) under an HF causal LM."""
    hidden = trunk_hidden(model.base_model, batch)
    logp = score_generated_tokens(model.get_output_embeddings(), hidden, batch, 1.0, with_entropy=False)[TOKEN_LOGP]
    return -masked_mean(logp, batch[GENERATED_MASK])
