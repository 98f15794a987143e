"""StarPO-S and RAGEN-2 group filters: keep the groups whose rewards disagree most.

Groups whose trajectories all earn about the same reward carry little learning
signal (their GRPO advantages are ~0) and, per RAGEN, a falling in-group reward
spread is an early sign of the Echo Trap. Two strategies rank the groups of a
rollout batch by the spread of trajectory reward inside each group:

- "top_k_ratio" (StarPO-S, RAGEN v1): keep a fixed fraction of the groups,
  ``max(1, floor(ratio * G))`` of them (RAGEN's rounding, computed exactly);
- "top_p" (RAGEN-2's SNR-adaptive filter, linear mode): keep the groups of
  largest spread until their share of the summed spread reaches p. How many
  groups that is depends on the batch, possibly none: a batch without spread
  is skipped rather than trained on.

RAGEN-2 calls its ranking metric "reward_variance" but ranks by the in-group
standard deviation; "std" here is the same.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import torch
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ragen.training.advantages import group_statistics

Tensor = torch.Tensor

# Where `filter_groups` logs the selection's statistics.
FILTER_RESULTS = "starpo_filter"
IN_GROUP_STD_BEFORE = "in_group_reward_std_before"
FILTER_METRICS = ("std", "range")
TOP_K_RATIO = "top_k_ratio"
TOP_P = "top_p"
FILTER_STRATEGIES = (TOP_K_RATIO, TOP_P)
# RAGEN-2's `rollout_filter_selection_eps`: the share is reached once the kept spread is within
# this much (in reward units) of p x the total, so p x total <= eps keeps nothing.
TOP_P_SELECTION_EPS = 0.01
# Spreads at or below this count as zero (float rounding of identical rewards); top_p never keeps them.
_ZERO_SPREAD = 1e-6


@dataclasses.dataclass(frozen=True)
class FilterSettings:
    """Which groups an update trains on (set with `StarPOConfig.training()`).

    Each field is documented where `StarPOConfig.training()` sets it.
    """

    rollout_filter_strategy: str = TOP_K_RATIO
    rollout_filter_ratio: float = 0.25
    rollout_filter_top_p: float = 0.9
    rollout_filter_metric: str = "std"

    def __post_init__(self) -> None:
        if self.rollout_filter_strategy not in FILTER_STRATEGIES:
            raise ValueError(
                f"rollout_filter_strategy must be one of {list(FILTER_STRATEGIES)}, "
                f"got {self.rollout_filter_strategy!r}"
            )
        if self.rollout_filter_metric not in FILTER_METRICS:
            raise ValueError(
                f"rollout_filter_metric must be one of {list(FILTER_METRICS)}, got {self.rollout_filter_metric!r}"
            )
        _exact_ratio(self.rollout_filter_ratio)
        if not 0 < self.rollout_filter_top_p <= 1:
            raise ValueError(f"rollout_filter_top_p must be in (0, 1], got {self.rollout_filter_top_p}")

    def max_kept_groups(self, n_groups: int) -> int:
        """The most groups an update of `n_groups` sampled groups can keep (top_p: all of them)."""
        if self.rollout_filter_strategy == TOP_P:
            return n_groups
        return kept_group_count(self.rollout_filter_ratio, n_groups)


def kept_group_count(ratio: float | Fraction, n_groups: int) -> int:
    """Groups the top-k ratio filter keeps: RAGEN's ``max(1, int(ratio * G))``, in exact arithmetic.

    The ratio is read as the decimal it prints as (0.14 is 7/50, not the binary
    float just above it), so 0.14 x 50 keeps 7 groups where float products
    give 7.000000000000001 (``ceil``: 8) or, for 0.29 x 100, 28.999999999999996
    (``int``: 28).

    Args:
        ratio: Fraction of groups kept, in (0, 1] (a float, int, Fraction or Decimal).
        n_groups: Groups sampled, >= 1.
    """
    if n_groups < 1:
        raise ValueError(f"n_groups must be >= 1, got {n_groups}")
    return max(1, int(_exact_ratio(ratio) * n_groups))


def _exact_ratio(ratio: float | Fraction) -> Fraction:
    """The keep ratio as the exact fraction of the decimal it prints as, checked to be in (0, 1]."""
    try:
        exact = Fraction(str(ratio))
    except ValueError:
        raise ValueError(f"rollout_filter_ratio must be a number in (0, 1], got {ratio!r}") from None
    if not 0 < exact <= 1:
        raise ValueError(f"rollout_filter_ratio must be in (0, 1], got {ratio}")
    return exact


def top_p_groups(spread: Tensor, top_p: float, *, eps: float = TOP_P_SELECTION_EPS) -> Tensor:
    """RAGEN-2's linear top-p: the largest-spread groups that hold a share `top_p` of the total spread.

    Groups are taken in order of spread, largest first (ties: smaller position
    first), until their summed spread reaches ``top_p * total - eps``. Groups
    of zero spread are never kept, so ``top_p=1`` keeps every group with any
    spread, and a batch whose ``top_p * total <= eps`` keeps none.

    Args:
        spread: [G] spread (>= 0) of each group.
        top_p: Share of the total spread to keep, in (0, 1].
        eps: Slack on the target share, in spread units.

    Returns:
        [K] long positions into `spread` of the kept groups, in the order taken (K may be 0).
    """
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    order = torch.sort(spread, descending=True, stable=True).indices
    order = order[spread[order] > _ZERO_SPREAD]
    if top_p == 1:
        return order
    target = top_p * float(spread.sum()) - eps
    if target <= 0:
        return order[:0]
    reached = torch.nonzero(torch.cumsum(spread[order].double(), dim=0) >= target)
    # Always reached up to float rounding (the positive spreads sum to the total): else keep them all.
    return order[: int(reached[0]) + 1] if reached.numel() else order


@dataclasses.dataclass(frozen=True)
class GroupSelection:
    """Result of :func:`select_groups_by_variance`.

    Attributes:
        keep: [B] bool, True for trajectories of kept groups.
        kept_group_ids: [K] ids of the kept groups, highest spread first (K may be 0 with top_p).
        stats: Scalars for logging: group counts and the mean in-group reward
            std over all groups and over the kept groups (0 when none is kept).
    """

    keep: Tensor
    kept_group_ids: Tensor
    stats: dict[str, float]

    @property
    def indices(self) -> Tensor:
        """[N_kept] batch indices of the kept trajectories, in batch order."""
        return torch.nonzero(self.keep).squeeze(1)


def select_groups_by_variance(
    scores: Tensor, group_ids: Tensor, settings: FilterSettings = FilterSettings()
) -> GroupSelection:
    """Keeps the groups whose trajectory rewards vary most (StarPO-S or RAGEN-2 top-p).

    Groups are ranked by the settings' metric of their trajectory rewards,
    descending, ties broken by group id (smaller first), so the selection is
    deterministic; the strategy decides how many of the ranked groups stay.

    Args:
        scores: [B] trajectory rewards.
        group_ids: [B] int group of each trajectory.
        settings: Strategy, ratio or share, and metric ("std": unbiased in-group
            std, a variance ranking is the same; "range": max - min).

    Returns:
        A :class:`GroupSelection`.
    """
    stats = group_statistics(scores, group_ids)
    spread = stats.std if settings.rollout_filter_metric == "std" else stats.max - stats.min
    n_groups = stats.ids.numel()
    if settings.rollout_filter_strategy == TOP_P:
        order = top_p_groups(spread, settings.rollout_filter_top_p)
    else:
        # ids are sorted ascending, so a stable sort breaks ties by smaller group id.
        n_keep = kept_group_count(settings.rollout_filter_ratio, n_groups)
        order = torch.sort(spread, descending=True, stable=True).indices[:n_keep]
    kept_groups = torch.zeros(n_groups, dtype=torch.bool, device=scores.device)
    kept_groups[order] = True
    return GroupSelection(
        keep=kept_groups[stats.index],
        kept_group_ids=stats.ids[order],
        stats={
            "groups_before": float(n_groups),
            "groups_after": float(order.numel()),
            IN_GROUP_STD_BEFORE: float(stats.std.mean()),
            "in_group_reward_std_after": float(stats.std[order].mean()) if order.numel() else 0.0,
        },
    )


@dataclasses.dataclass(frozen=True)
class FilteredGroups:
    """What `filter_groups` returns.

    Attributes:
        kept: The group episodes kept, in batch order (possibly none with top_p).
        in_group_reward_std: The mean in-group reward std over all groups, before the filter
            (the signal the echo-trap monitor watches).
    """

    kept: list[MultiAgentEpisode]
    in_group_reward_std: float


def filter_groups(
    episodes: list[MultiAgentEpisode], settings: FilterSettings, metrics: MetricsLogger
) -> FilteredGroups:
    """Step 3 of an iteration: the group episodes whose trajectories disagree most in reward, and the
    batch's in-group reward spread; the selection's statistics go to `starpo_filter/`."""
    returns = [[float(sum(a.get_rewards())) for a in e.agent_episodes.values()] for e in episodes]
    scores = torch.tensor([r for group in returns for r in group])
    group_ids = torch.tensor([g for g, group in enumerate(returns) for _ in group])
    selection = select_groups_by_variance(scores, group_ids, settings)
    for key, value in selection.stats.items():
        metrics.log_value((FILTER_RESULTS, key), float(value), window=1)
    return FilteredGroups(
        kept=[episodes[g] for g in sorted(int(g) for g in selection.kept_group_ids)],
        in_group_reward_std=selection.stats[IN_GROUP_STD_BEFORE],
    )
