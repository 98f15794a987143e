"""StarPO-S group filter checked against hand-computed group spreads."""

from __future__ import annotations

import math

import pytest
import torch

from rllib_ragen.filtering import group_reward_std, select_groups_by_variance

# Four groups of two trajectories, listed out of order in the batch.
# group 0: [1, 1] std 0 ; group 1: [0, 2] std sqrt(2) ; group 2: [0, 1] std sqrt(0.5) ; group 3: [3, 3] std 0
SCORES = torch.tensor([1.0, 0.0, 3.0, 0.0, 1.0, 2.0, 3.0, 1.0])
GROUPS = torch.tensor([0, 1, 3, 2, 0, 1, 3, 2])


def test_group_reward_std_by_hand():
    ids, std = group_reward_std(SCORES, GROUPS)
    assert ids.tolist() == [0, 1, 2, 3]
    torch.testing.assert_close(std, torch.tensor([0.0, math.sqrt(2), math.sqrt(0.5), 0.0]))


def test_keeps_top_quarter():
    # ceil(0.25 * 4) = 1 group: group 1 (std sqrt(2)), trajectories 1 and 5.
    selection = select_groups_by_variance(SCORES, GROUPS, keep_ratio=0.25)
    assert selection.kept_group_ids.tolist() == [1]
    assert selection.indices.tolist() == [1, 5]
    assert selection.keep.tolist() == [False, True, False, False, False, True, False, False]
    # mean std before: (0 + sqrt(2) + sqrt(0.5) + 0) / 4 ; after: sqrt(2)
    assert selection.stats["in_group_reward_std_before"] == pytest.approx((math.sqrt(2) + math.sqrt(0.5)) / 4)
    assert selection.stats["in_group_reward_std_after"] == pytest.approx(math.sqrt(2))
    assert selection.stats["groups_before"] == 4 and selection.stats["groups_after"] == 1


def test_keeps_top_half_and_rounds_up():
    half = select_groups_by_variance(SCORES, GROUPS, keep_ratio=0.5)
    assert half.kept_group_ids.tolist() == [1, 2]
    assert half.indices.tolist() == [1, 3, 5, 7]
    # ceil(0.3 * 4) = ceil(1.2) = 2 groups.
    assert select_groups_by_variance(SCORES, GROUPS, keep_ratio=0.3).kept_group_ids.tolist() == [1, 2]
    # at least one group even when ratio * groups < 1
    assert select_groups_by_variance(SCORES, GROUPS, keep_ratio=0.01).kept_group_ids.tolist() == [1]


def test_ties_break_by_smaller_group_id():
    # Groups 0 and 3 both have std 0: keeping 3 of 4 takes group 0, not 3.
    three = select_groups_by_variance(SCORES, GROUPS, keep_ratio=0.75)
    assert three.kept_group_ids.tolist() == [1, 2, 0]
    # Same spread from mirrored rewards ([1, 0] vs [0, 1]): group 5 wins over 8 in any batch order.
    scores = torch.tensor([0.0, 1.0, 1.0, 0.0])
    for groups in (torch.tensor([8, 8, 5, 5]), torch.tensor([5, 5, 8, 8])):
        assert select_groups_by_variance(scores, groups, keep_ratio=0.5).kept_group_ids.tolist() == [5]


def test_keep_ratio_one_keeps_everything():
    selection = select_groups_by_variance(SCORES, GROUPS, keep_ratio=1.0)
    assert bool(selection.keep.all())
    assert selection.stats["in_group_reward_std_after"] == pytest.approx(
        selection.stats["in_group_reward_std_before"]
    )


def test_range_metric_ranks_differently_from_std():
    # group 0: [0, 0, 0, 0, 0, 3]: range 3; mean 0.5, unbiased var (5*0.25 + 6.25) / 5 = 1.5, std 1.225
    # group 1: [0, 2.5, 0, 2.5]:   range 2.5; mean 1.25, unbiased var 4*1.5625 / 3 = 2.083, std 1.443
    scores = torch.tensor([0.0, 0, 0, 0, 0, 3, 0, 2.5, 0, 2.5])
    groups = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    assert select_groups_by_variance(scores, groups, keep_ratio=0.5, metric="std").kept_group_ids.tolist() == [1]
    assert select_groups_by_variance(scores, groups, keep_ratio=0.5, metric="range").kept_group_ids.tolist() == [0]


@pytest.mark.parametrize("ratio", [0.0, -0.1, 1.5])
def test_rejects_bad_keep_ratio(ratio):
    with pytest.raises(ValueError, match="keep_ratio must be in \\(0, 1\\]"):
        select_groups_by_variance(SCORES, GROUPS, keep_ratio=ratio)


def test_rejects_unknown_metric():
    with pytest.raises(ValueError, match="unknown filter metric 'variance'"):
        select_groups_by_variance(SCORES, GROUPS, metric="variance")
