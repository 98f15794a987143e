"""Per-group statistics of trajectory scores: what GRPO normalises by and the StarPO-S filter ranks by."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

Tensor = torch.Tensor


@dataclasses.dataclass(frozen=True)
class GroupStatistics:
    """Per-group statistics of trajectory scores.

    Attributes:
        ids: [G] sorted distinct group ids.
        index: [B] position in ``ids`` of each trajectory's group.
        count, mean, std, min, max: [G] per group. ``std`` is unbiased
            (``torch.std``'s default, as in veRL/RAGEN); it is 0 for a group of
            one trajectory, which has no spread.
    """

    ids: Tensor
    index: Tensor
    count: Tensor
    mean: Tensor
    std: Tensor
    min: Tensor
    max: Tensor


def group_statistics(scores: Tensor, group_ids: Tensor) -> GroupStatistics:
    """Computes :class:`GroupStatistics` of ``scores`` [B] grouped by ``group_ids`` [B]."""
    _check_scores_and_groups(scores, group_ids)
    ids, index = torch.unique(group_ids, sorted=True, return_inverse=True)
    n_groups = ids.numel()
    # At least float32, and every buffer in the scores' dtype: never the default dtype, which
    # `torch.set_default_dtype` may have made float64 while the scores are float32.
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    like: dict[str, Any] = {"dtype": scores.dtype, "device": scores.device}
    count = torch.zeros(n_groups, **like).index_add_(0, index, torch.ones_like(scores))
    total = torch.zeros(n_groups, **like).index_add_(0, index, scores)
    mean = total / count
    sq_dev = torch.zeros(n_groups, **like).index_add_(0, index, (scores - mean[index]).square())
    std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))
    low = torch.full((n_groups,), torch.inf, **like).scatter_reduce(0, index, scores, "amin")
    high = torch.full((n_groups,), -torch.inf, **like).scatter_reduce(0, index, scores, "amax")
    return GroupStatistics(ids=ids, index=index, count=count, mean=mean, std=std, min=low, max=high)


def _check_scores_and_groups(scores: Tensor, group_ids: Tensor) -> None:
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [B], got shape {tuple(scores.shape)}")
    if group_ids.shape != scores.shape:
        raise ValueError(f"group_ids must have shape {tuple(scores.shape)} like scores, got {tuple(group_ids.shape)}")
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    if scores.numel() == 0:
        raise ValueError("scores is empty: need at least one trajectory")
