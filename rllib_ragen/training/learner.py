"""`StarPOTorchLearner`: the trajectory-level StarPO update on token rows.

Loss per mini-batch (all [rows, L]; policy terms masked to M_loss (`Columns.LOSS_MASK`), the
value loss to M_adv (`ADVANTAGE_MASK`), see `rllib_ragen.training.token_batch`; both default to
every generated token, `GENERATED_MASK`):
    policy  PPO with decoupled clip (low/high) and dual clip     losses.policy_loss
            per token weighted by the off-policy correction      losses (TIS / MIS, or none)
    value   clipped value loss (critic-based estimators only)    losses.value_loss
    entropy bonus  - entropy_coeff * mean entropy
    KL      kl_coeff * KL(policy || frozen reference), only when kl_coeff > 0
Mini-batches are split into micro-batches whose gradients are accumulated
before one optimiser step, so memory is bounded by `micro_batch_size` rows or,
with `micro_batch_tokens`, by the distinct token positions the trunk runs (rows
that share a prompt share its positions: `rllib_ragen.training.token_tree`).
Each micro-batch's loss is weighted by its share of the mini-batch (of its
M_loss tokens or rows), so the accumulated gradient is the whole mini-batch's
whatever the split (for the value loss only approximately when M_adv differs).

The learner's process hands freed host memory back between phases and measures each phase's peak
(`release_freed_memory`, `phase_peak`).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import ctypes.util
import dataclasses
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.utils.annotations import override
from ray.rllib.utils.typing import ModuleID

from rllib_ragen.checks import check_at_least_one
from rllib_ragen.columns import (
    ADVANTAGE_MASK,
    ATTENTION_MASK,
    GENERATED_MASK,
    INPUT_IDS,
    OLD_LOGP,
    SAMPLING_LOGP,
    TOKEN_ENTROPY,
    TOKEN_LOGP,
)
from rllib_ragen.logits import masked_mean
from rllib_ragen.rllib_private import (
    MiniBatchStepLearner,
    learner_connector,
    learner_optimizers,
    learner_parameters,
    named_optimizers,
    optimizer_module_id,
)
from rllib_ragen.training.distributed import (
    all_reduce_gradients,
    all_reduce_sum,
    global_share,
)
from rllib_ragen.training.losses import (
    LossSettings,
    OffPolicyCorrectionSettings,
    aggregate_loss,
    kl_penalty,
    policy_loss,
    value_loss,
)
from rllib_ragen.training.module import computed_positions, host_copy
from rllib_ragen.training.token_tree import tree_budget_groups

POLICY_OPTIMIZER = "policy"
CRITIC_OPTIMIZER = "critic"
# The learner-state key of the learner connector's own state (advantage baselines), saved with checkpoints.
CONNECTOR_STATE = "learner_connector"


@dataclasses.dataclass(frozen=True)
class UpdateSettings:
    """How one rollout batch is cut into optimiser steps (set with `StarPOConfig.training()`; the
    threads with `.inference()`).

    Each field is documented where `StarPOConfig.training()` sets it (`torch_threads`: `.inference()`).
    """

    rollout_frequency: int = 1
    mini_batch_size: int | None = None
    micro_batch_size: int = 4
    micro_batch_tokens: int | None = None
    torch_threads: int | None = None

    def __post_init__(self) -> None:
        check_at_least_one(self, "rollout_frequency", "micro_batch_size")
        if self.mini_batch_size is not None and int(self.mini_batch_size) < 1:
            raise ValueError(f"mini_batch_size must be >= 1 or None, got {self.mini_batch_size}")
        if self.micro_batch_tokens is not None and int(self.micro_batch_tokens) < 1:
            raise ValueError(f"micro_batch_tokens must be >= 1 or None, got {self.micro_batch_tokens}")
        if self.torch_threads is not None and int(self.torch_threads) < 1:
            raise ValueError(f"torch_threads must be >= 1 or None, got {self.torch_threads}")
        if self.mini_batch_size is not None and self.micro_batch_size > self.mini_batch_size:
            raise ValueError(
                f"micro_batch_size={self.micro_batch_size} is larger than mini_batch_size={self.mini_batch_size}"
            )

    def rows_per_step(self, rows: int) -> int:
        """Rows of one optimiser step of an update on `rows` rows: the mini-batch size, never more than
        the rows (RLlib would fill the rest by repeating rows); all of them when it is None."""
        return rows if self.mini_batch_size is None else max(1, min(self.mini_batch_size, rows))


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """AdamW for the policy and the critic (set with `StarPOConfig.training()`).

    Each field is documented where `StarPOConfig.training()` sets it.
    """

    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    adam_betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01

    def __post_init__(self) -> None:
        if self.actor_lr < 0 or self.critic_lr < 0:
            raise ValueError(f"actor_lr and critic_lr must be >= 0, got {self.actor_lr}, {self.critic_lr}")


class StarPOTorchLearner(MiniBatchStepLearner):
    """PPO-style StarPO update for an `LLMRLModule`."""

    @override(MiniBatchStepLearner)
    def build(self) -> None:
        super().build()
        # Set before any forward, so the connector's old log-probs and the
        # update's new ones are computed the same way (PPO ratio 1 at start).
        self.module[DEFAULT_MODULE_ID].unwrapped().scoring = self.config.scoring
        # The config's groups the update reads, typed (RLlib types `self.config` as its own base class).
        self.update_settings: UpdateSettings = self.config.update
        self.loss_settings: LossSettings = self.config.loss
        self._reference = None
        if self.loss_settings.kl_coeff > 0:
            # A frozen copy of the initial policy, the anchor of the KL term.
            self._reference = copy.deepcopy(self.module[DEFAULT_MODULE_ID].unwrapped().policy).eval()
            self._reference.requires_grad_(False)

    @override(MiniBatchStepLearner)
    def configure_optimizers_for_module(self, module_id: ModuleID, config: AlgorithmConfig | None = None) -> None:
        config = self.config.get_config_for_module(module_id) if config is None else config
        module = self.module[module_id]
        critic_names = set(module.get_non_inference_attributes())
        policy_params: list[torch.nn.Parameter] = []
        critic_params: list[torch.nn.Parameter] = []
        for name, param in module.named_parameters():
            if not param.requires_grad:  # LoRA's frozen base: no gradients, no optimiser state
                continue
            (critic_params if name.split(".")[0] in critic_names else policy_params).append(param)
        settings: OptimizerSettings = config.optim
        groups = {
            POLICY_OPTIMIZER: (policy_params, settings.actor_lr),
            CRITIC_OPTIMIZER: (critic_params, settings.critic_lr),
        }
        for name, (params, lr) in groups.items():
            if params:
                self.register_optimizer(
                    module_id=module_id,
                    optimizer_name=name,
                    optimizer=torch.optim.AdamW(params, betas=settings.adam_betas, weight_decay=settings.weight_decay),
                    params=params,
                    lr_or_lr_schedule=lr,
                )

    @override(MiniBatchStepLearner)
    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        # The update's activations are freed but kept by the allocator; the rollout and
        # evaluation that follow need none of them (`rllib_ragen.training.learner`).
        release_freed_memory()

    @override(MiniBatchStepLearner)
    def get_state(self, components: Any = None, *, not_components: Any = None, **kwargs: Any) -> dict[str, Any]:
        """RLlib's learner state and, unless left out by name, its connector's (RAE's role baselines)."""
        state = super().get_state(components, not_components=not_components, **kwargs)
        connector = learner_connector(self)
        if connector is not None and _selected(CONNECTOR_STATE, components, not_components):
            state[CONNECTOR_STATE] = connector.get_state()
        return state

    @override(MiniBatchStepLearner)
    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        connector = learner_connector(self)
        if connector is not None and CONNECTOR_STATE in state:
            connector.set_state(state[CONNECTOR_STATE])

    @override(MiniBatchStepLearner)
    def optimizer_state(self) -> dict:
        # RLlib's numpy conversion fails on bfloat16, the dtype of AdamW's moments for a bf16 policy.
        return {
            name: {"module_id": optimizer_module_id(self, name), "state": host_copy(optimizer.state_dict())}
            for name, optimizer in named_optimizers(self).items()
        }

    @override(MiniBatchStepLearner)
    def update_minibatch(self, batch: dict) -> tuple[Any, Any, Any]:
        """One optimiser step on a mini-batch, accumulating micro-batch gradients."""
        module_batch = batch[DEFAULT_MODULE_ID]
        for optimizer in learner_optimizers(self):
            optimizer.zero_grad(set_to_none=True)
        weights = micro_batch_weights(
            module_batch,
            self.update_settings.micro_batch_size,
            self.loss_settings.loss_agg_mode,
            token_budget=self.update_settings.micro_batch_tokens,
        )
        # With several learners (num_learners >= 2) the module runs unwrapped (DDP's hooks
        # would need equal micro-batch counts on every learner): each loss is weighted by
        # its share of the global mini-batch and the gradients are summed over learners once.
        module = self.module[DEFAULT_MODULE_ID].unwrapped()
        share = global_share(mask_or_generated(module_batch, Columns.LOSS_MASK), self.loss_settings.loss_agg_mode)
        total_loss: Any = 0.0  # a Tensor after the first micro-batch
        fwd_out = None
        # The token positions this optimiser step runs (logged once a step: the last step's with several).
        computed = sum(computed_positions(module.policy.base_model, micro) for micro, _ in weights)
        self.metrics.log_value((DEFAULT_MODULE_ID, "num_computed_tokens"), computed, window=1)
        for micro, weight in weights:
            fwd_out = {DEFAULT_MODULE_ID: module.forward_train(micro)}
            loss = self.compute_losses(fwd_out=fwd_out, batch={DEFAULT_MODULE_ID: micro})[DEFAULT_MODULE_ID]
            (loss * weight * share).backward()
            total_loss += loss.detach() * weight * share
        params = learner_parameters(self)
        all_reduce_gradients(params.values())
        total_loss = all_reduce_sum(total_loss)
        grads = {pid: p.grad for pid, p in params.items()}
        self.apply_gradients(self.postprocess_gradients(grads))
        return fwd_out, {DEFAULT_MODULE_ID: total_loss}, {}

    @override(MiniBatchStepLearner)
    def compute_loss_for_module(
        self, *, module_id: ModuleID, config: AlgorithmConfig, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        mask = mask_or_generated(batch, Columns.LOSS_MASK)
        settings: LossSettings = config.loss
        off_policy: OffPolicyCorrectionSettings = config.off_policy
        loss_agg_mode = settings.loss_agg_mode
        # No scored old log-probs: the update is one on-policy step, so the old policy is this one.
        old_logp = batch[OLD_LOGP] if OLD_LOGP in batch else fwd_out[TOKEN_LOGP].detach()
        correction, correction_stats = off_policy.weights(old_logp, batch[SAMPLING_LOGP], mask)
        pg_loss, pg_stats = policy_loss(
            fwd_out[TOKEN_LOGP],
            old_logp,
            batch[Columns.ADVANTAGES],
            mask,
            clip_ratio_low=settings.clip_ratio_low,
            clip_ratio_high=settings.clip_ratio_high,
            clip_ratio_dual=settings.clip_ratio_dual,
            loss_agg_mode=loss_agg_mode,
            weights=correction,
        )
        entropy = aggregate_loss(fwd_out[TOKEN_ENTROPY], mask, loss_agg_mode=loss_agg_mode)
        # Without an entropy bonus the entropy is a metric only: no gradient flows through it.
        total = pg_loss - settings.entropy_coeff * entropy if settings.entropy_coeff else pg_loss
        ratio_max = correction_stats.pop("is_ratio_max", None)
        stats = {"policy_loss": pg_loss, "entropy": entropy, **pg_stats, **correction_stats}
        if Columns.VALUE_TARGETS in batch:
            vf_loss, vf_stats = value_loss(
                fwd_out[Columns.VF_PREDS],
                batch[Columns.VF_PREDS],
                batch[Columns.VALUE_TARGETS],
                mask_or_generated(batch, ADVANTAGE_MASK),
                value_clip=settings.value_clip,
                loss_agg_mode=loss_agg_mode,
            )
            total = total + settings.vf_loss_coeff * vf_loss
            stats.update(vf_loss=vf_loss, **vf_stats)
        if self._reference is not None:
            kl = aggregate_loss(
                kl_penalty(fwd_out[TOKEN_LOGP], self._reference_logp(batch), kl_type=settings.kl_type),
                mask,
                loss_agg_mode=loss_agg_mode,
            )
            total = total + settings.kl_coeff * kl
            stats["kl"] = kl
        # Train/inference mismatch: the learner's log-probs vs the engine's sampling ones, on every generated token.
        generated = batch[GENERATED_MASK]
        gap = (old_logp.detach() - batch[SAMPLING_LOGP]).abs()
        stats["ratio_to_sampling_mean"] = masked_mean(torch.exp(fwd_out[TOKEN_LOGP] - batch[SAMPLING_LOGP]), generated)
        stats["train_inference_logp_gap_mean"] = masked_mean(gap, generated)
        for key, value in stats.items():
            self.metrics.log_value((module_id, key), float(value.detach()), reduce="mean")
        gap_max = gap[generated.bool()].max() if generated.any() else gap.new_zeros(())
        self.metrics.log_value((module_id, "train_inference_logp_gap_max"), float(gap_max), reduce="max")
        if ratio_max is not None:
            self.metrics.log_value((module_id, "is_ratio_max"), float(ratio_max), reduce="max")
        return total

    @torch.no_grad()
    def _reference_logp(self, batch: dict[str, Any]) -> torch.Tensor:
        """Log-probs of the generated tokens under the frozen reference policy, [rows, L]."""
        module = self.module[DEFAULT_MODULE_ID].unwrapped()
        return module.score_with(self._reference, batch, with_entropy=False)[TOKEN_LOGP]


def _selected(name: str, components: Any, not_components: Any) -> bool:
    """Whether a `get_state` call with these (RLlib's) `components` and `not_components` asks for `name`."""

    def names(given: Any) -> set[str]:
        return set() if given is None else {given} if isinstance(given, str) else set(given)

    return (components is None or name in names(components)) and name not in names(not_components)


def mask_or_generated(batch: dict[str, torch.Tensor], column: str) -> torch.Tensor:
    """The [rows, L] mask ``column``, or every generated token (`GENERATED_MASK`) when the
    batch has no such column (batches without `GroupAdvantages`' masks, e.g. behaviour cloning)."""
    return batch[column] if column in batch else batch[GENERATED_MASK]


def micro_batch_weights(
    batch: dict[str, torch.Tensor], micro_batch_size: int, loss_agg_mode: str, *, token_budget: int | None = None
) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """Splits a mini-batch into micro-batches with the weight of each one's loss.

    Without a `token_budget`, consecutive runs of `micro_batch_size` rows;
    with one, micro-batches of at most that many distinct token positions
    (`tree_budget_groups`). With "token-mean" a micro-batch's mean counts
    by its share of generated tokens, otherwise by its share of rows, so the
    accumulated gradient equals that of the whole mini-batch for any split. Each micro-batch is cut to its longest row.
    """
    mask = mask_or_generated(batch, Columns.LOSS_MASK)
    n_rows = mask.shape[0]
    lengths = batch[ATTENTION_MASK].sum(dim=1)
    if token_budget is None:
        groups = [torch.arange(s, min(s + micro_batch_size, n_rows)) for s in range(0, n_rows, micro_batch_size)]
    else:
        groups = tree_budget_groups(batch[INPUT_IDS], lengths, token_budget)
    total_tokens = mask.sum().clamp(min=1)
    total_rows = max(int(mask.any(dim=1).sum()), 1)
    out = []
    for rows in groups:
        length = int(lengths[rows].max())
        micro = {k: v[rows, :length] if v.dim() == 2 else v[rows] for k, v in batch.items()}
        micro_mask = mask_or_generated(micro, Columns.LOSS_MASK)
        weight = (
            micro_mask.sum() / total_tokens
            if loss_agg_mode == "token-mean"
            else micro_mask.any(dim=1).sum() / total_rows
        )
        out.append((micro, weight))
    return out


_PROC = Path("/proc/self")


@functools.lru_cache(maxsize=1)
def _glibc() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    return libc if hasattr(libc, "malloc_trim") else None


def release_freed_memory() -> bool:
    """Returns the heap's free pages to the OS; True when some were released (False without glibc)."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))


def peak_resident_bytes() -> int | None:
    """The process's resident-set high-water mark since start or the last reset (None off Linux)."""
    try:
        status = (_PROC / "status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # reported in kB
    return None


def reset_peak_resident() -> bool:
    """Starts a new high-water mark at the current resident set; False where Linux does not allow it."""
    try:
        (_PROC / "clear_refs").write_text("5")  # 5: reset the peak resident set size (proc(5))
    except OSError:
        return False
    return True


@contextlib.contextmanager
def phase_peak() -> Iterator[dict[str, int]]:
    """Measures the peak resident set of the block: `{"bytes": peak}` once it ends (empty off Linux)."""
    out: dict[str, int] = {}
    measurable = reset_peak_resident()
    try:
        yield out
    finally:
        peak = peak_resident_bytes() if measurable else None
        if peak is not None:
            out["bytes"] = peak
