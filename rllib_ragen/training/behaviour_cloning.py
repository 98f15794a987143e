"""Behaviour cloning as a plain supervised loop: the answer tokens' NLL, one optimiser step a mini-batch.

The warm start's update. It is the learner's own arithmetic (the same
scoring of generated tokens, token-mean aggregation, micro-batches by token
budget, AdamW with the learner's betas, weight decay and global-norm clip),
without an RLlib iteration around each step: no Ray Data pass, no learner
connector, no weight sync to an engine that never samples. Every position
the rows of a micro-batch share (the chat template and instructions) runs
once (`trunk_hidden`'s token tree).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

from rllib_ragen.columns import GENERATED_MASK, TOKEN_LOGP
from rllib_ragen.rollout.trajectory_record import Trajectory
from rllib_ragen.training.learner import micro_batch_weights
from rllib_ragen.training.learner_connector import token_columns
from rllib_ragen.training.module import AUTOCAST_DTYPES, score_generated_tokens, trunk_hidden
from rllib_ragen.training.token_batch import PAD_TOKEN_ID, build_token_batch


@dataclasses.dataclass(frozen=True)
class SupervisedSettings:
    """How the answer NLL is minimised.

    Args:
        lr: AdamW learning rate.
        rows_per_step: Token rows (one per turn, or per trajectory with the
            whole history) per optimiser step.
        weight_decay: AdamW weight decay (the learner's default).
        adam_betas: AdamW betas (the learner's default).
        grad_clip: Global gradient-norm clip (the learner's default).
        micro_batch_tokens: Distinct token positions per forward/backward; bounds the activations' memory.
        autocast_dtype: None, or "bfloat16"/"float16" for the trunk (`ScoringSettings`).
    """

    lr: float
    rows_per_step: int = 8
    weight_decay: float = 0.01
    adam_betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    micro_batch_tokens: int = 4096
    autocast_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for name in ("rows_per_step", "micro_batch_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.autocast_dtype is not None and self.autocast_dtype not in AUTOCAST_DTYPES:
            raise ValueError(f"autocast_dtype must be None or one of {AUTOCAST_DTYPES}, got {self.autocast_dtype!r}")

    def optimizer(self, policy: nn.Module) -> torch.optim.Optimizer:
        params = [p for p in policy.parameters() if p.requires_grad]
        # Fused: one kernel over all parameters instead of a few per tensor (on CPU as on GPU).
        return torch.optim.AdamW(params, lr=self.lr, betas=self.adam_betas, weight_decay=self.weight_decay, fused=True)

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=getattr(torch, self.autocast_dtype))


def answer_nll(policy: PreTrainedModel, batch: dict[str, torch.Tensor], settings: SupervisedSettings) -> torch.Tensor:
    """Mean NLL per generated token of `batch` (rows [R, L]) under a Hugging Face causal LM, a scalar."""
    with settings.autocast(batch[GENERATED_MASK].device):
        hidden = trunk_hidden(policy.base_model, batch)
    logp = score_generated_tokens(policy.get_output_embeddings(), hidden, batch, 1.0, with_entropy=False)[TOKEN_LOGP]
    mask = batch[GENERATED_MASK]
    return -(logp * mask).sum() / mask.sum().clamp(min=1)


def supervised_step(
    policy: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    rows: dict[str, torch.Tensor],
    settings: SupervisedSettings,
) -> float:
    """One optimiser step on the token-mean answer NLL of `rows` ([R, L] columns); returns that NLL.

    Micro-batch losses are weighted by their share of the generated tokens,
    so the accumulated gradient is the whole mini-batch's for any split.
    """
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for micro, weight in micro_batch_weights(rows, 0, "token-mean", token_budget=settings.micro_batch_tokens):
        loss = answer_nll(policy, micro, settings) * weight
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_([p for p in policy.parameters() if p.grad is not None], settings.grad_clip)
    optimizer.step()
    return total


def cloning_passes(
    trajectories: list[Trajectory], *, trajectories_per_pass: int, rows_per_step: int, epochs: int
) -> Iterator[list[dict[str, torch.Tensor]]]:
    """Per pass over `trajectories_per_pass` trajectories (in order, `epochs` times over all):
    the module columns of its rows in runs of `rows_per_step`, one optimiser step each."""
    for _ in range(epochs):
        for start in range(0, len(trajectories), trajectories_per_pass):
            chunk = trajectories[start : start + trajectories_per_pass]
            columns = token_columns(build_token_batch(chunk, pad_token_id=PAD_TOKEN_ID))
            n_rows = columns[GENERATED_MASK].shape[0]
            yield [
                {name: column[first : first + rows_per_step] for name, column in columns.items()}
                for first in range(0, n_rows, rows_per_step)
            ]
