"""Several learners (`num_learners >= 2`, DDP over gloo/NCCL) computing the single-learner update.

Each learner gets whole groups (`shard_groups`) and scores its own rows. To make
the optimiser step the one a single learner would take on the union of the
shards, every quantity that is a mean over the batch is taken over ALL learners:

- the loss: each learner weights its micro-batch losses by their share of the
  GLOBAL token (or row) count (`global_share`), and the gradients are summed
  over the learners (`all_reduce_gradients`), so they add up to the gradient of
  the global token-mean / seq-mean;
- the whitening of critic advantages (`rllib_ragen.training.advantages.advantage_estimation`, on `all_reduce_sum`).

Group-normalised advantages (GRPO) need no exchange: a group never spans two
learners. Outside a process group every function is the single-learner one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TypeVar

import torch
import torch.distributed as dist

from rllib_ragen.rollout.prompt.token_history import rows_per_trajectory
from rllib_ragen.sharding import split_contiguous

T = TypeVar("T")


def is_distributed() -> bool:
    """True inside a torch.distributed process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def shard_groups(episodes: Sequence[T], num_learners: int) -> list[list[T]]:
    """Whole group episodes per learner (contiguous runs); every learner needs at least one."""
    if len(episodes) < num_learners:
        raise ValueError(
            f"{len(episodes)} groups were kept for the update but there are num_learners={num_learners}: "
            "every learner needs at least one whole group; keep more groups (.rollouts(n_groups=...), "
            ".training(rollout_filter_ratio=...)) or use fewer learners"
        )
    return split_contiguous(episodes, num_learners)


def learner_minibatch_sizes(rows: Sequence[int], minibatch_size: int, num_epochs: int) -> tuple[list[int], int]:
    """Per-learner mini-batch rows and the common number of optimiser steps.

    A single learner on all R rows takes ceil(num_epochs * R / minibatch_size)
    steps of `minibatch_size` rows. Learner k (R_k rows) takes as many steps of
    about minibatch_size * R_k / R rows, so every step covers the same share of
    each shard, and a mini-batch as large as the batch is each learner's whole
    shard: the single learner's step exactly.

    Args:
        rows: [K] training rows of each learner's shard (each >= 1).
        minibatch_size: Rows of one optimiser step over all learners.
        num_epochs: Passes over the batch.

    Returns:
        ([K] mini-batch rows per learner, number of steps).
    """
    total = sum(rows)
    steps = max(1, math.ceil(num_epochs * total / minibatch_size))
    sizes = [max(1, round(minibatch_size * r / total)) if minibatch_size < total else r for r in rows]
    return sizes, steps


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    """`value` summed over all learners (a copy; `value` itself when not distributed)."""
    if not is_distributed():
        return value
    total = value.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def global_share(mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """This learner's share of the mini-batch over all learners, in the loss's unit.

    Tokens for "token-mean", rows with a token otherwise (the seq-mean
    aggregations). Multiplying a learner's (locally averaged) loss by it and
    summing the gradients over learners gives the gradient of the global mean.

    Args:
        mask: [R, L] this learner's loss mask.
        loss_agg_mode: The loss aggregation (`rllib_ragen.training.losses.LOSS_AGGREGATIONS`).

    Returns:
        0-d float tensor; 1 when not distributed.
    """
    mask = mask.bool()
    local = (mask.sum() if loss_agg_mode == "token-mean" else mask.any(dim=1).sum()).float()
    return local / all_reduce_sum(local).clamp(min=1)


def all_reduce_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """Sums the gradients over all learners in place, in one flat all-reduce (no-op when not distributed)."""
    if not is_distributed():
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def count_training_rows(episodes: Iterable, *, history_window: int | None) -> int:
    """Rows the learner connector makes of group episodes (`rows_per_trajectory`; trajectories
    without a turn make no row)."""
    return sum(
        rows_per_trajectory(len(agent), history_window)
        for episode in episodes
        for agent in episode.agent_episodes.values()
        if len(agent) > 0
    )
