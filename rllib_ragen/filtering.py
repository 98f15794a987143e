"""StarPO-S variance-based trajectory filtering.

Groups whose trajectories all earn about the same reward carry little learning
signal (their GRPO advantages are ~0) and, per RAGEN, a falling in-group reward
spread is an early sign of the Echo Trap. StarPO-S ranks the groups of a
rollout batch by the spread of trajectory reward inside each group and keeps
only the top fraction (RAGEN: 25%).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from rllib_ragen.advantages import group_statistics

Tensor = torch.Tensor

FILTER_METRICS = ("std", "range")


@dataclasses.dataclass(frozen=True)
class GroupSelection:
    """Result of :func:`select_groups_by_variance`.

    Attributes:
        keep: [B] bool, True for trajectories of kept groups.
        kept_group_ids: [K] ids of the kept groups, highest spread first.
        stats: Scalars for logging: group counts and the mean in-group reward
            std over all groups and over the kept groups.
    """

    keep: Tensor
    kept_group_ids: Tensor
    stats: dict[str, float]

    @property
    def indices(self) -> Tensor:
        """[N_kept] batch indices of the kept trajectories, in batch order."""
        return torch.nonzero(self.keep).squeeze(1)


def group_reward_std(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """In-group standard deviation of trajectory reward.

    Args:
        scores: [B] trajectory rewards.
        group_ids: [B] int group of each trajectory.

    Returns:
        ids [G] sorted distinct group ids, std [G] unbiased std per group
        (0 for a group of one trajectory).
    """
    stats = group_statistics(scores, group_ids)
    return stats.ids, stats.std


def select_groups_by_variance(
    scores: Tensor, group_ids: Tensor, *, keep_ratio: float = 0.25, metric: str = "std"
) -> GroupSelection:
    """Keeps the groups whose trajectory rewards vary most (StarPO-S filter).

    Groups are ranked by ``metric`` of their trajectory rewards, descending;
    ``ceil(keep_ratio * G)`` groups are kept (at least one). Ties are broken by
    group id, smaller first, so the selection is deterministic.

    Args:
        scores: [B] trajectory rewards.
        group_ids: [B] int group of each trajectory.
        keep_ratio: Fraction of groups to keep, in (0, 1]; 1.0 keeps all.
        metric: "std" (unbiased in-group std; a variance ranking is the same)
            or "range" (max - min).

    Returns:
        A :class:`GroupSelection`.
    """
    if not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio}")
    if metric not in FILTER_METRICS:
        raise ValueError(f"unknown filter metric {metric!r}; choose one of {list(FILTER_METRICS)}")
    stats = group_statistics(scores, group_ids)
    spread = stats.std if metric == "std" else stats.max - stats.min
    n_groups = stats.ids.numel()
    n_keep = max(1, math.ceil(keep_ratio * n_groups))
    # ids are sorted ascending, so a stable sort breaks ties by smaller group id.
    order = torch.sort(spread, descending=True, stable=True).indices[:n_keep]
    kept_groups = torch.zeros(n_groups, dtype=torch.bool, device=scores.device)
    kept_groups[order] = True
    return GroupSelection(
        keep=kept_groups[stats.index],
        kept_group_ids=stats.ids[order],
        stats={
            "groups_before": float(n_groups),
            "groups_after": float(n_keep),
            "in_group_reward_std_before": float(stats.std.mean()),
            "in_group_reward_std_after": float(stats.std[order].mean()),
        },
    )
