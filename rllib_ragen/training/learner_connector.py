"""Learner connector pieces: StarPO group episodes -> the token batch `StarPOTorchLearner` trains on.

RLlib runs the pipeline once per `learner_group.update(...)` call, before any
mini-batch; each piece is a `ConnectorV2`:
1. `TokenRows`: rebuild every trajectory's exact token rows from its episode
   (the module's input columns and the engine's sampling log-probs);
2. `OldLogProbsAndValues`: score the rows with the current weights (no grad): the
   old log-probs of the PPO ratio (unless the update is a single on-policy step)
   and, with a critic, the old values;
3. `GroupAdvantages`: advantages and value targets per trajectory, estimated, whitened
   and length-weighted in one sequence (`rllib_ragen.training.advantages.advantage_estimation`), on
   tokens of the advantage mask (`rllib_ragen.training.token_batch`), with the loss
   mask and the advantage mask beside the generated-token mask.
Behaviour cloning uses piece 1 only; offline StarPO the whole pipeline. The pieces
share the `TokenBatch` (rows <-> trajectories) through RLlib's `shared_data`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import gymnasium as gym
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ragen.columns import (
    ADVANTAGE_MASK,
    ATTENTION_MASK,
    GENERATED_MASK,
    INPUT_IDS,
    OLD_LOGP,
    SAMPLING_LOGP,
    TOKEN_LOGP,
)
from rllib_ragen.logits import masked_mean
from rllib_ragen.rollout.reward_shaping import RewardShapingSettings
from rllib_ragen.training.advantages import AdvantageInputs, AdvantageSettings, estimate_advantages
from rllib_ragen.training.advantages.estimators import RAE, RoleBaselines, zero_advantage_trajectories
from rllib_ragen.training.token_batch import (
    ALL_TOKENS,
    ResponseSpanLabeller,
    TokenBatch,
    TokenSpans,
    build_token_mask,
    token_batch_of_episodes,
)

if TYPE_CHECKING:
    from rllib_ragen.training.module import LLMRLModule

# The `shared_data` keys the pieces pass on: the token batch and the old values [R, L] (None without critic).
TOKEN_BATCH = "token_batch"
OLD_VALUES = "old_values"


def _module_batch(batch: dict[str, Any], rl_module: MultiRLModule) -> tuple[dict[str, torch.Tensor], torch.device]:
    module = rl_module[DEFAULT_MODULE_ID].unwrapped()
    return batch.setdefault(DEFAULT_MODULE_ID, {}), module.policy.device


def _pipeline_data(shared_data: dict[str, Any] | None) -> dict[str, Any]:
    """The data the pipeline's pieces share: `TokenRows` puts the token batch there for the pieces after it."""
    if shared_data is None:
        raise ValueError(
            "the StarPO learner connectors run inside a learner connector pipeline, which passes shared_data"
        )
    return shared_data


class TokenRows(ConnectorV2):
    """Episodes -> padded token rows: `input_ids`, `attention_mask`, `generated_mask` and `sampling_logp`, [R, L].

    Args:
        history_window: The rollout's history window (decides the row layout).
        log_trained_tokens: Log `num_trained_tokens` as every generated token
            (a likelihood loss trains on all of them).
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        history_window: int | None,
        log_trained_tokens: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.history_window = history_window
        self.log_trained_tokens = log_trained_tokens

    @override(ConnectorV2)
    def __call__(
        self,
        *,
        rl_module: MultiRLModule,
        batch: dict[str, Any],
        episodes: list[MultiAgentEpisode],
        shared_data: dict[str, Any] | None = None,
        metrics: MetricsLogger | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        tokens = token_batch_of_episodes(episodes, history_window=self.history_window)
        if shared_data is not None:
            shared_data[TOKEN_BATCH] = tokens
        columns, device = _module_batch(batch, rl_module)
        columns.update({k: v.to(device) for k, v in token_columns(tokens).items()})
        columns[SAMPLING_LOGP] = tokens.sampling_logp.to(device)
        if metrics is not None and self.log_trained_tokens:
            metrics.log_value((DEFAULT_MODULE_ID, "num_trained_tokens"), float(tokens.generated_mask.sum()), window=1)
        return batch


class OldLogProbsAndValues(ConnectorV2):
    """Scores the token rows under the current weights: old log-probs (`OLD_LOGP`) and
    old values (`Columns.VF_PREDS`), [R, L] each, without gradient.

    Args:
        micro_batch_size: Rows scored per forward pass (bounds memory).
        score_old_logp: Score the old log-probs of the PPO ratio. False when
            each update is one optimiser step on fresh samples: the old policy
            is then the current one, and the loss uses its own log-probs, detached.
        with_values: Score the critic's values (critic-based estimators).
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        micro_batch_size: int,
        score_old_logp: bool = True,
        with_values: bool,
        **kwargs: Any,
    ) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.micro_batch_size = micro_batch_size
        self.score_old_logp = score_old_logp
        self.with_values = with_values

    @override(ConnectorV2)
    def __call__(
        self,
        *,
        rl_module: MultiRLModule,
        batch: dict[str, Any],
        episodes: list[MultiAgentEpisode],
        shared_data: dict[str, Any] | None = None,
        metrics: MetricsLogger | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        # The module itself, not its DDP wrapper (num_learners >= 2): scoring is no training
        # step, so it must not run DDP's collective forward hooks.
        module = rl_module[DEFAULT_MODULE_ID].unwrapped()
        shared_data = _pipeline_data(shared_data)
        old_logp, old_values = score_rows(
            module,
            shared_data[TOKEN_BATCH],
            self.micro_batch_size,
            with_logp=self.score_old_logp,
            with_values=self.with_values,
        )
        shared_data[OLD_VALUES] = old_values
        columns, device = _module_batch(batch, rl_module)
        if old_logp is not None:  # else the update is one on-policy step: the loss takes its own, detached
            columns[OLD_LOGP] = old_logp.to(device)
        if old_values is not None:
            columns[Columns.VF_PREDS] = old_values.to(device)
        return batch


class GroupAdvantages(ConnectorV2):
    """Advantages (`Columns.ADVANTAGES`), value targets, the loss mask and the advantage mask of the token rows.

    Args:
        advantages: Estimator and its hyper-parameters.
        loss_token_mask: Token mask policy of the policy loss (M_loss).
        advantage_token_mask: Token mask policy of advantage estimation (M_adv).
        span_labeller: Labels tokens with protocol spans; needed by every
            mask policy but "all".
        advantage_length_weight: Exponent of the length weighting of advantages
            (`rllib_ragen.training.advantages.advantage_estimation`); 0 = off.

    State (its checkpoint, within the learner's): RAE's role baselines (`estimators.py`).
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        advantages: AdvantageSettings,
        loss_token_mask: str = ALL_TOKENS,
        advantage_token_mask: str = ALL_TOKENS,
        span_labeller: ResponseSpanLabeller | None = None,
        advantage_length_weight: float = RewardShapingSettings.advantage_length_weight,
        **kwargs: Any,
    ) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.advantages = advantages
        self.loss_token_mask = loss_token_mask
        self.advantage_token_mask = advantage_token_mask
        self.span_labeller = span_labeller
        self.advantage_length_weight = advantage_length_weight
        self.role_baselines = RoleBaselines()

    @override(ConnectorV2)
    def get_state(self, components: Any = None, *, not_components: Any = None, **kwargs: Any) -> dict[str, Any]:
        return {"role_baselines": self.role_baselines.get_state()}

    @override(ConnectorV2)
    def set_state(self, state: dict[str, Any]) -> None:
        self.role_baselines.set_state(state.get("role_baselines", {}))

    @override(ConnectorV2)
    def __call__(
        self,
        *,
        rl_module: MultiRLModule,
        batch: dict[str, Any],
        episodes: list[MultiAgentEpisode],
        shared_data: dict[str, Any] | None = None,
        metrics: MetricsLogger | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        shared_data = _pipeline_data(shared_data)
        tokens, old_values = shared_data[TOKEN_BATCH], shared_data.get(OLD_VALUES)
        spans, layout = self.token_spans(tokens), tokens.trajectories
        advantage_mask = self.advantage_token_mask
        inputs = AdvantageInputs(
            rewards=layout.turn_rewards,
            generated_mask=layout.generated_mask,
            values=tokens.to_trajectories(old_values) if old_values is not None else None,
            turn_ends=layout.turn_ends,
            group_ids=layout.group_ids,
            advantage_mask=None if advantage_mask == ALL_TOKENS else build_token_mask(advantage_mask, spans),
            roles=layout.roles,
            role_baselines=self.role_baselines,
        )
        estimated = estimate_advantages(inputs, self.advantages, length_weight=self.advantage_length_weight)
        advantages, returns = estimated.advantages, estimated.returns
        loss_mask = build_token_mask(self.loss_token_mask, spans)
        if self.advantages.advantage_estimator == RAE:  # SPIRAL drops the samples RAE gives no advantage
            loss_mask = loss_mask & ~zero_advantage_trajectories(advantages, layout.generated_mask)[:, None]
        columns = {
            Columns.LOSS_MASK: _row_mask(tokens, loss_mask),
            Columns.ADVANTAGES: tokens.to_rows(advantages),
        }
        if old_values is not None:
            columns[Columns.VALUE_TARGETS] = tokens.to_rows(returns)
            columns[ADVANTAGE_MASK] = _row_mask(tokens, inputs.advantage_tokens)
        if metrics is not None:
            _log_batch_metrics(metrics, tokens, advantages, columns[Columns.LOSS_MASK])
            if estimated.length_weights is not None:
                _log_length_weights(metrics, estimated.length_weights)
        module_columns, device = _module_batch(batch, rl_module)
        module_columns.update({k: v.to(device) for k, v in columns.items()})
        return batch

    def token_spans(self, tokens: TokenBatch) -> TokenSpans:
        """What the mask policies select by; span labels only with a labeller (a policy other than "all")."""
        spans = TokenSpans(generated_mask=tokens.trajectories.generated_mask, turn_ends=tokens.trajectories.turn_ends)
        if self.span_labeller is None:
            return spans
        return self.span_labeller(tokens.to_trajectories(tokens.input_ids), spans.generated_mask, spans.turn_ends)


class PaddedRows(Protocol):
    """Right-padded token rows ([R, L] each): a `TokenBatch`, or any rows with these three."""

    @property
    def input_ids(self) -> torch.Tensor: ...
    @property
    def attention_mask(self) -> torch.Tensor: ...
    @property
    def generated_mask(self) -> torch.Tensor: ...


def token_columns(tokens: PaddedRows) -> dict[str, torch.Tensor]:
    """The module's input columns of a token batch, each [R, L]."""
    return {
        INPUT_IDS: tokens.input_ids,
        ATTENTION_MASK: tokens.attention_mask,
        GENERATED_MASK: tokens.generated_mask,
    }


def micro_batches(tokens: PaddedRows, micro_batch_size: int, device: torch.device) -> Iterator[dict[str, torch.Tensor]]:
    """The module's input columns of consecutive runs of `micro_batch_size` rows, on `device`.

    `tokens` is a `TokenBatch` or any rows with its `input_ids`, `attention_mask` and `generated_mask` [R, L].
    """
    columns = token_columns(tokens)
    for start in range(0, tokens.input_ids.shape[0], micro_batch_size):
        yield {k: v[start : start + micro_batch_size].to(device) for k, v in columns.items()}


@torch.no_grad()
def score_rows(
    module: LLMRLModule, tokens: PaddedRows, micro_batch_size: int, *, with_logp: bool = True, with_values: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Log-probs and/or critic values of every row under the current weights, [R, L] each (None if not asked)."""
    logps, values = [], []
    if not (with_logp or with_values):
        return None, None
    for micro in micro_batches(tokens, micro_batch_size, module.policy.device):
        out = module.score(micro, with_logp=with_logp, with_entropy=False, with_values=with_values)
        if with_logp:
            logps.append(out[TOKEN_LOGP].float().cpu())
        if with_values:
            values.append(out[Columns.VF_PREDS].float().cpu())
    return (torch.cat(logps) if with_logp else None), (torch.cat(values) if with_values else None)


def _row_mask(tokens: TokenBatch, mask: torch.Tensor) -> torch.Tensor:
    """A [B, T] mask of generated tokens as [R, L] rows, in the dtype of the generated-token mask."""
    return tokens.to_rows(mask).to(tokens.generated_mask.dtype)


def _log_batch_metrics(
    metrics: MetricsLogger, tokens: TokenBatch, advantages: torch.Tensor, loss_mask: torch.Tensor
) -> None:
    generated_mask = tokens.trajectories.generated_mask
    values = {
        "advantage_mean": masked_mean(advantages, generated_mask).item(),
        "num_trained_tokens": float(loss_mask.bool().sum()),
        "num_trained_trajectories": float(generated_mask.shape[0]),
        # Every token of every row, prompt included: what 6 x parameters x tokens counts as the update's FLOPs.
        "num_row_tokens": float(tokens.attention_mask.sum()),
    }
    for key, value in values.items():
        metrics.log_value((DEFAULT_MODULE_ID, key), value, window=1)


def _log_length_weights(metrics: MetricsLogger, weights: torch.Tensor) -> None:
    for key, value in (("advantage_length_weight_min", weights.min()), ("advantage_length_weight_max", weights.max())):
        metrics.log_value((DEFAULT_MODULE_ID, key), float(value), window=1)
