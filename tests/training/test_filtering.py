"""StarPO-S and RAGEN-2 top-p group filters checked against hand-computed group spreads."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from rllib_ragen.training.filtering import (
    FilterSettings,
    kept_group_count,
    select_groups_by_variance,
    top_p_groups,
)

# Four groups of two trajectories, listed out of order in the batch.
# group 0: [1, 1] std 0 ; group 1: [0, 2] std sqrt(2) ; group 2: [0, 1] std sqrt(0.5) ; group 3: [3, 3] std 0
SCORES = torch.tensor([1.0, 0.0, 3.0, 0.0, 1.0, 2.0, 3.0, 1.0])
GROUPS = torch.tensor([0, 1, 3, 2, 0, 1, 3, 2])


def top_k(ratio: float) -> FilterSettings:
    return FilterSettings(rollout_filter_strategy="top_k_ratio", rollout_filter_ratio=ratio)


def top_p(share: float) -> FilterSettings:
    return FilterSettings(rollout_filter_strategy="top_p", rollout_filter_top_p=share)


def test_keeps_top_quarter():
    # max(1, floor(0.25 * 4)) = 1 group: group 1 (std sqrt(2)), trajectories 1 and 5.
    selection = select_groups_by_variance(SCORES, GROUPS, top_k(0.25))
    assert selection.kept_group_ids.tolist() == [1]
    assert selection.indices.tolist() == [1, 5]
    assert selection.keep.tolist() == [False, True, False, False, False, True, False, False]
    # mean std before: (0 + sqrt(2) + sqrt(0.5) + 0) / 4 ; after: sqrt(2)
    assert selection.stats["in_group_reward_std_before"] == pytest.approx((math.sqrt(2) + math.sqrt(0.5)) / 4)
    assert selection.stats["in_group_reward_std_after"] == pytest.approx(math.sqrt(2))
    assert selection.stats["groups_before"] == 4 and selection.stats["groups_after"] == 1


def test_keeps_top_half_and_rounds_down_like_ragen():
    half = select_groups_by_variance(SCORES, GROUPS, top_k(0.5))
    assert half.kept_group_ids.tolist() == [1, 2]
    assert half.indices.tolist() == [1, 3, 5, 7]
    # floor(0.3 * 4) = floor(1.2) = 1 group (RAGEN's int(); ceil would keep 2).
    assert select_groups_by_variance(SCORES, GROUPS, top_k(0.3)).kept_group_ids.tolist() == [1]
    # at least one group even when ratio * groups < 1
    assert select_groups_by_variance(SCORES, GROUPS, top_k(0.01)).kept_group_ids.tolist() == [1]


def test_keep_count_is_seven_of_fifty_at_014():
    # 0.14 * 50 is 7.000000000000001 in floats: ceil kept 8.
    assert kept_group_count(0.14, 50) == 7
    assert kept_group_count(0.29, 100) == 29  # int(0.29 * 100) = int(28.999999999999996) = 28 in floats
    assert kept_group_count(Fraction(1, 3), 9) == 3 and kept_group_count(1, 8) == 8
    assert kept_group_count(0.01, 8) == 1  # at least one


def test_keep_count_never_overshoots_the_exact_floor():
    for k in range(1, 101):
        for n_groups in range(1, 257):
            assert kept_group_count(k / 100, n_groups) == max(1, k * n_groups // 100), (k, n_groups)


@pytest.mark.parametrize("ratio", [0.0, -0.1, 1.5, "a lot"])
def test_keep_count_rejects_bad_ratios(ratio):
    with pytest.raises(ValueError, match="rollout_filter_ratio must be"):
        kept_group_count(ratio, 8)


def test_selection_under_a_float64_default_dtype():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        for settings in (top_k(0.5), top_p(0.9)):
            selection = select_groups_by_variance(SCORES.float(), GROUPS, settings)
            assert selection.kept_group_ids.tolist() == [1, 2]
        std = select_groups_by_variance(SCORES.double(), GROUPS, top_k(0.25)).stats["in_group_reward_std_after"]
        assert std == pytest.approx(math.sqrt(2))
    finally:
        torch.set_default_dtype(previous)
    assert torch.get_default_dtype() == previous


def test_ties_break_by_smaller_group_id():
    # Groups 0 and 3 both have std 0: keeping 3 of 4 takes group 0, not 3.
    three = select_groups_by_variance(SCORES, GROUPS, top_k(0.75))
    assert three.kept_group_ids.tolist() == [1, 2, 0]
    # Same spread from mirrored rewards ([1, 0] vs [0, 1]): group 5 wins over 8 in any batch order.
    scores = torch.tensor([0.0, 1.0, 1.0, 0.0])
    for groups in (torch.tensor([8, 8, 5, 5]), torch.tensor([5, 5, 8, 8])):
        assert select_groups_by_variance(scores, groups, top_k(0.5)).kept_group_ids.tolist() == [5]


def test_keep_ratio_one_keeps_everything():
    selection = select_groups_by_variance(SCORES, GROUPS, top_k(1.0))
    assert bool(selection.keep.all())
    assert selection.stats["in_group_reward_std_after"] == pytest.approx(selection.stats["in_group_reward_std_before"])


def test_range_metric_ranks_differently_from_std():
    # group 0: [0, 0, 0, 0, 0, 3]: range 3; mean 0.5, unbiased var (5*0.25 + 6.25) / 5 = 1.5, std 1.225
    # group 1: [0, 2.5, 0, 2.5]:   range 2.5; mean 1.25, unbiased var 4*1.5625 / 3 = 2.083, std 1.443
    scores = torch.tensor([0.0, 0, 0, 0, 0, 3, 0, 2.5, 0, 2.5])
    groups = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    by_std = FilterSettings(rollout_filter_ratio=0.5, rollout_filter_metric="std")
    by_range = FilterSettings(rollout_filter_ratio=0.5, rollout_filter_metric="range")
    assert select_groups_by_variance(scores, groups, by_std).kept_group_ids.tolist() == [1]
    assert select_groups_by_variance(scores, groups, by_range).kept_group_ids.tolist() == [0]


# ------------------------------------------------------------------ RAGEN-2 top-p

SPREAD = torch.tensor([0.5, 0.0, 0.3, 0.2])  # total 1.0; by size: positions 0 (0.5), 2 (0.3), 3 (0.2)


@pytest.mark.parametrize(
    "share,kept",
    [
        (0.5, [0]),  # target 0.5 - 0.01 = 0.49: 0.5 reaches it
        (0.7, [0, 2]),  # target 0.69: 0.5 short, 0.5 + 0.3 = 0.8 reaches it
        (0.8, [0, 2]),  # target 0.79: 0.8 reaches it (the slack eps absorbs float rounding of 0.5 + 0.3)
        (0.9, [0, 2, 3]),  # target 0.89: needs all three groups with spread
        (1.0, [0, 2, 3]),  # p = 1: every group with any spread; the zero-spread group 1 never
    ],
)
def test_top_p_by_hand(share, kept):
    assert top_p_groups(SPREAD, share).tolist() == kept


def test_top_p_ties_take_the_smaller_position_first():
    # total 1.0, p = 0.6: target 0.59; 0.4 (position 1) then the first 0.2 (position 0) gives 0.6.
    assert top_p_groups(torch.tensor([0.2, 0.4, 0.2, 0.2]), 0.6).tolist() == [1, 0]


def test_top_p_keeps_nothing_without_spread():
    assert top_p_groups(torch.zeros(4), 0.9).tolist() == []
    assert top_p_groups(torch.zeros(4), 1.0).tolist() == []
    # 0.9 x (0.005 + 0.004) = 0.0081 <= eps 0.01: too little spread to keep any group.
    assert top_p_groups(torch.tensor([0.005, 0.004]), 0.9).tolist() == []
    assert top_p_groups(torch.tensor([0.005, 0.004]), 0.9, eps=0.0).tolist() == [0, 1]


def test_top_p_selection_on_the_batch():
    # Group stds [0, sqrt(2), sqrt(0.5), 0], total 2.121. p = 0.6: target 1.263 <= sqrt(2): group 1 only.
    assert select_groups_by_variance(SCORES, GROUPS, top_p(0.6)).kept_group_ids.tolist() == [1]
    # p = 0.9: target 1.899 > sqrt(2): groups 1 and 2; the zero-spread groups 0 and 3 stay out even at p = 1.
    assert select_groups_by_variance(SCORES, GROUPS, top_p(0.9)).kept_group_ids.tolist() == [1, 2]
    assert select_groups_by_variance(SCORES, GROUPS, top_p(1.0)).kept_group_ids.tolist() == [1, 2]
    flat = select_groups_by_variance(torch.ones(4), torch.tensor([0, 0, 1, 1]), top_p(0.9))
    assert flat.kept_group_ids.tolist() == [] and not bool(flat.keep.any())
    assert flat.stats["groups_after"] == 0 and flat.stats["in_group_reward_std_after"] == 0.0


@pytest.mark.parametrize(
    "change,message",
    [
        ({"rollout_filter_ratio": 0.0}, r"rollout_filter_ratio must be in \(0, 1\]"),
        ({"rollout_filter_ratio": 1.5}, r"rollout_filter_ratio must be in \(0, 1\]"),
        ({"rollout_filter_top_p": 0.0}, r"rollout_filter_top_p must be in \(0, 1\]"),
        ({"rollout_filter_strategy": "top_k"}, "rollout_filter_strategy must be one of"),
        ({"rollout_filter_metric": "variance"}, "rollout_filter_metric must be one of"),
    ],
)
def test_bad_settings_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        FilterSettings(**change)


def test_max_kept_groups():
    assert top_k(0.14).max_kept_groups(50) == 7
    assert top_p(0.5).max_kept_groups(50) == 50
