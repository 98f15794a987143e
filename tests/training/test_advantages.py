"""Advantage estimators checked against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rllib_ragen.training.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    arpo,
    bi_level_gae,
    brpo,
    compute_advantages,
    gae,
    get_advantage_estimator,
    group_statistics,
    grpo,
)


def t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- GAE


def test_gae_discounted_by_hand():
    # gamma = lambda_ = 0.5, so gamma * lambda_ = 0.25; r = [0, 0, 1], v = [1, 2, 4]
    # t=2: delta = 1 + 0.5*0 - 4 = -3              A2 = -3
    # t=1: delta = 0 + 0.5*4 - 2 = 0               A1 = 0 + 0.25*(-3)    = -0.75
    # t=0: delta = 0 + 0.5*2 - 1 = 0               A0 = 0 + 0.25*(-0.75) = -0.1875
    # returns = A + v = [0.8125, 1.25, 1.0]
    adv, ret = gae(t([0, 0, 1]), t([1, 2, 4]), t([1, 1, 1]), gamma=0.5, lambda_=0.5)
    assert_close(adv, t([-0.1875, -0.75, -3.0]))
    assert_close(ret, t([0.8125, 1.25, 1.0]))


def test_gae_undiscounted_is_return_to_go_minus_value():
    # gamma = lambda_ = 1: A_i = (sum of rewards from i on) - v_i
    # r = [0, 1, 0, 2] -> returns-to-go [3, 3, 2, 2]; v = [1, 2, 3, 4] -> A = [2, 1, -1, -2]
    adv, ret = gae(t([0, 1, 0, 2]), t([1, 2, 3, 4]), t([1, 1, 1, 1]), gamma=1.0, lambda_=1.0)
    assert_close(adv, t([2, 1, -1, -2]))
    assert_close(ret, t([3, 3, 2, 2]))


def test_gae_skips_padding_and_right_padding():
    # Row 0 is the hand example above with padding inserted at positions 1 and 4
    # whose values (100) must not be bootstrapped from. Row 1 is right-padded:
    # r = [0, 2], v = [1, 1], gamma = lambda_ = 0.5:
    # t=1: A = 2 - 1 = 1 ; t=0: delta = 0 + 0.5*1 - 1 = -0.5, A = -0.5 + 0.25*1 = -0.25
    rewards = t([0, 0, 0, 1, 0], [0, 2, 0, 0, 0])
    values = t([1, 100, 2, 4, 100], [1, 1, 100, 100, 100])
    mask = t([1, 0, 1, 1, 0], [1, 1, 0, 0, 0])
    adv, ret = gae(rewards, values, mask, gamma=0.5, lambda_=0.5)
    assert_close(adv, t([-0.1875, 0, -0.75, -3.0, 0], [-0.25, 1, 0, 0, 0]))
    assert_close(ret, t([0.8125, 0, 1.25, 1.0, 0], [0.75, 2, 0, 0, 0]))


def test_gae_rejects_rewards_on_padding_and_bad_shapes():
    with pytest.raises(ValueError, match="rewards must be 0 outside"):
        gae(t([0, 1]), t([0, 0]), t([1, 0]), gamma=1.0, lambda_=1.0)
    with pytest.raises(ValueError, match="values must have shape"):
        gae(t([0, 1]), t([0, 0, 0]), t([1, 1]), gamma=1.0, lambda_=1.0)
    with pytest.raises(ValueError, match="only 0 and 1"):
        gae(t([0, 1]), t([0, 0]), t([1, 0.5]), gamma=1.0, lambda_=1.0)


# -------------------------------------------------------------------- bi-level GAE

# Two turns of two tokens: [a0, a1 | b0, b1]; turn rewards 1 (turn 1) and 2 (turn 2).
BI_REWARDS = t([0, 1, 0, 2])
BI_VALUES = t([1, 2, 3, 4])
BI_ENDS = t([0, 1, 0, 1])
BI_MASK = t([1, 1, 1, 1])


def test_bi_level_gae_by_hand():
    # gamma = lambda_ = high_level_gamma = 0.5 (high_level_lambda defaults to lambda_ = 0.5).
    # Turn level, V_1 = v[a1] = 2, V_2 = v[b1] = 4:
    #   turn 2: delta = 2 + 0.5*0 - 4 = -2                A_2 = -2
    #   turn 1: delta = 1 + 0.5*4 - 2 = 1                 A_1 = 1 + 0.5*0.5*(-2) = 0.5
    # Token level, seeded with A at each turn end:
    #   b0: (0.5*v[b1] - v[b0]) + 0.25*A_2 = (2 - 3) - 0.5 = -1.5
    #   a0: (0.5*v[a1] - v[a0]) + 0.25*A_1 = (1 - 1) + 0.125 = 0.125
    # returns = A + v = [1.125, 2.5, 1.5, 2.0]
    adv, ret = bi_level_gae(BI_REWARDS, BI_VALUES, BI_MASK, BI_ENDS, gamma=0.5, lambda_=0.5, high_level_gamma=0.5)
    assert_close(adv, t([0.125, 0.5, -1.5, -2.0]))
    assert_close(ret, t([1.125, 2.5, 1.5, 2.0]))


def test_bi_level_gae_separate_high_level_lambda():
    # high_level_lambda = 1: A_1 = 1 + 0.5*1*(-2) = 0, so a0 = (1 - 1) + 0.25*0 = 0;
    # turn 2 is unchanged: b1 = -2, b0 = -1.5.
    adv, _ = bi_level_gae(
        BI_REWARDS, BI_VALUES, BI_MASK, BI_ENDS, gamma=0.5, lambda_=0.5, high_level_gamma=0.5, high_level_lambda=1.0
    )
    assert_close(adv, t([0.0, 0.0, -1.5, -2.0]))


def test_bi_level_gae_undiscounted_token_advantage_is_turn_return_minus_value():
    # All gammas/lambdas 1: A_2 = 2 - 4 = -2, A_1 = 1 + 4 - 2 + (-2) = 1.
    # Turn returns: A_1 + V_1 = 3, A_2 + V_2 = 2; token advantage = turn return - v:
    # [3 - 1, 3 - 2, 2 - 3, 2 - 4] = [2, 1, -1, -2] (here equal to plain GAE, see below).
    adv, ret = bi_level_gae(BI_REWARDS, BI_VALUES, BI_MASK, BI_ENDS, gamma=1.0, lambda_=1.0, high_level_gamma=1.0)
    assert_close(adv, t([2, 1, -1, -2]))
    assert_close(ret, t([3, 3, 2, 2]))
    plain, _ = gae(BI_REWARDS, BI_VALUES, BI_MASK, gamma=1.0, lambda_=1.0)
    assert_close(adv, plain)


def test_bi_level_gae_padding_rows_are_independent():
    # Row 0 = the hand example with padding holes (value 9, never bootstrapped from)
    # inside turn 1, between the turns and at the end;
    # row 1 is a single turn [c0, c1] with r = 1, v = [1, 1], gammas 0.5:
    #   turn: A = 1 - 1 = 0 ; c0 = (0.5*1 - 1) + 0.25*0 = -0.5
    rewards = t([0, 0, 1, 0, 0, 2, 0], [0, 1, 0, 0, 0, 0, 0])
    values = t([1, 9, 2, 9, 3, 4, 9], [1, 1, 9, 9, 9, 9, 9])
    mask = t([1, 0, 1, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0])
    ends = t([0, 0, 1, 0, 0, 1, 0], [0, 1, 0, 0, 0, 0, 0])
    adv, _ = bi_level_gae(rewards, values, mask, ends, gamma=0.5, lambda_=0.5, high_level_gamma=0.5)
    assert_close(adv, t([0.125, 0, 0.5, 0, -1.5, -2.0, 0], [-0.5, 0, 0, 0, 0, 0, 0]))


def test_bi_level_gae_turn_discount_differs_from_token_discount():
    # gamma = lambda_ = 1 inside turns, high_level_gamma = 0.5 (high_level_lambda = lambda_ = 1):
    #   turn 2: A_2 = 2 - 4 = -2 ; turn 1: delta = 1 + 0.5*4 - 2 = 1, A_1 = 1 + 0.5*1*(-2) = 0
    #   b0 = (4 - 3) + (-2) = -1 ; a0 = (2 - 1) + 0 = 1
    adv, _ = bi_level_gae(BI_REWARDS, BI_VALUES, BI_MASK, BI_ENDS, gamma=1.0, lambda_=1.0, high_level_gamma=0.5)
    assert_close(adv, t([1, 0, -1, -2]))


def test_bi_level_gae_rejects_inconsistent_turns():
    kwargs = dict(gamma=1.0, lambda_=1.0, high_level_gamma=0.95)
    with pytest.raises(ValueError, match="padding token"):
        bi_level_gae(t([0, 1, 0]), t([0, 0, 0]), t([1, 1, 0]), t([0, 1, 1]), **kwargs)
    with pytest.raises(ValueError, match="last response token must be a turn end"):
        bi_level_gae(t([1, 0, 0]), t([0, 0, 0]), t([1, 1, 1]), t([1, 0, 0]), **kwargs)
    with pytest.raises(ValueError, match="rewards must be 0 outside turn ends"):
        bi_level_gae(t([1, 0, 1]), t([0, 0, 0]), t([1, 1, 1]), t([0, 0, 1]), **kwargs)


# ----------------------------------------------------------- critic-free estimators

# Groups 7 and 3 interleaved, plus a lone trajectory in group 9.
SCORES = torch.tensor([1.0, 0.0, 3.0, 0.0, 3.0, 5.0])
GROUPS = torch.tensor([7, 3, 7, 3, 3, 9])
MASK = t([1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1])


def test_grpo_normalises_within_groups():
    # group 7: [1, 3], mean 2, unbiased std = sqrt((1 + 1) / 1) = sqrt(2)
    # group 3: [0, 0, 3], mean 1, unbiased std = sqrt((1 + 1 + 4) / 2) = sqrt(3)
    # group 9: one trajectory -> 0
    eps = 1e-6
    s2, s3 = math.sqrt(2) + eps, math.sqrt(3) + eps
    per_traj = torch.tensor([-1 / s2, -1 / s3, 1 / s2, -1 / s3, 2 / s3, 0.0])
    adv, ret = grpo(SCORES, GROUPS, MASK, eps=eps)
    assert_close(adv, per_traj[:, None] * MASK)
    assert_close(ret, adv)


@pytest.mark.parametrize("scores_dtype", [torch.float32, torch.float64])
def test_grpo_under_a_float64_default_dtype(scores_dtype):
    # The same hand-computed advantages as above, with float64 as torch's default dtype
    # (index_add_ crashed on float32 scores into float64 buffers); the default is restored after.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        eps = 1e-6
        s2, s3 = math.sqrt(2) + eps, math.sqrt(3) + eps
        adv, _ = grpo(SCORES.to(scores_dtype), GROUPS, MASK, eps=eps)
        assert adv.dtype == scores_dtype
        expected = torch.tensor([-1 / s2, -1 / s3, 1 / s2, -1 / s3, 2 / s3, 0.0], dtype=scores_dtype)
        assert_close(adv[:, 0], expected)
    finally:
        torch.set_default_dtype(previous)
    assert torch.get_default_dtype() == previous


def test_grpo_without_std_only_centres():
    adv, _ = grpo(SCORES, GROUPS, MASK, grpo_norm_by_std=False)
    assert_close(adv[:, 0], torch.tensor([-1.0, -1.0, 1.0, -1.0, 2.0, 0.0]))


def test_brpo_normalises_over_the_batch():
    # scores [1, 0, 3, 0, 3, 5]: mean 2; deviations [-1, -2, 1, -2, 1, 3];
    # squares sum 1 + 4 + 1 + 4 + 1 + 9 = 20; unbiased var 20 / 5 = 4; std 2
    adv, ret = brpo(SCORES, MASK, eps=0.0)
    assert_close(adv[:, 0], torch.tensor([-0.5, -1.0, 0.5, -1.0, 0.5, 1.5]))
    assert_close(adv, adv[:, :1] * MASK)
    assert_close(ret, adv)


def test_arpo_broadcasts_raw_scores():
    adv, ret = arpo(SCORES, MASK)
    assert_close(adv, SCORES[:, None] * MASK)
    assert_close(ret, adv)


def test_group_statistics_by_hand():
    stats = group_statistics(SCORES, GROUPS)
    assert stats.ids.tolist() == [3, 7, 9]
    assert_close(stats.mean, torch.tensor([1.0, 2.0, 5.0]))
    assert_close(stats.std, torch.tensor([math.sqrt(3), math.sqrt(2), 0.0]))
    assert_close(stats.max - stats.min, torch.tensor([3.0, 2.0, 0.0]))
    assert stats.count.tolist() == [3, 2, 1]


def test_group_statistics_rejects_bad_ids():
    with pytest.raises(ValueError, match="integer"):
        group_statistics(SCORES, GROUPS.float())
    with pytest.raises(ValueError, match="group_ids must have shape"):
        group_statistics(SCORES, GROUPS[:3])


# ---------------------------------------------------------------------- registry


def test_registry_names_and_unknown_name():
    assert set(ADVANTAGE_ESTIMATORS) == {"gae", "bi_level_gae", "grpo", "brpo", "arpo", "rae"}
    with pytest.raises(KeyError, match="choose one of .*arpo.*bi_level_gae"):
        get_advantage_estimator("ppo")


def test_compute_advantages_uniform_calls():
    inputs = AdvantageInputs(rewards=BI_REWARDS, generated_mask=BI_MASK, values=BI_VALUES, turn_ends=BI_ENDS)
    adv, ret = compute_advantages("gae", inputs, gamma=1.0, lambda_=1.0)
    assert_close(adv, t([2, 1, -1, -2]))
    critic_out = AdvantageInputs(rewards=BI_REWARDS, generated_mask=BI_MASK, values=BI_VALUES.clone().requires_grad_())
    adv, ret = compute_advantages("gae", critic_out, gamma=1.0, lambda_=1.0)
    assert not adv.requires_grad and not ret.requires_grad
    adv, _ = compute_advantages("bi_level_gae", inputs, gamma=0.5, lambda_=0.5, high_level_gamma=0.5)
    assert_close(adv, t([0.125, 0.5, -1.5, -2.0]))
    # The score is the sum of the per-turn rewards: 1 + 2 = 3.
    adv, _ = compute_advantages("arpo", inputs)
    assert_close(adv, t([3, 3, 3, 3]))


def test_compute_advantages_grpo_sums_turn_rewards():
    # Trajectory scores 1 + 2 = 3 and 0 + 1 = 1 in one group: mean 2, std sqrt(2).
    rewards = t([0, 1, 0, 2], [1, 0, 0, 1])
    ends = t([0, 1, 0, 1], [1, 0, 0, 1])
    inputs = AdvantageInputs(rewards=rewards, generated_mask=torch.ones(2, 4), turn_ends=ends, group_ids=torch.tensor([0, 0]))
    adv, _ = compute_advantages("grpo", inputs, eps=0.0)
    assert_close(adv[:, 0], torch.tensor([1 / math.sqrt(2), -1 / math.sqrt(2)]))


def test_compute_advantages_reports_missing_inputs_and_hparams():
    no_critic = AdvantageInputs(rewards=BI_REWARDS, generated_mask=BI_MASK)
    with pytest.raises(ValueError, match="'gae' needs AdvantageInputs.values"):
        compute_advantages("gae", no_critic, gamma=1.0, lambda_=1.0)
    with pytest.raises(ValueError, match="'grpo' needs AdvantageInputs.group_ids"):
        compute_advantages("grpo", no_critic)
    with pytest.raises(ValueError, match=r"missing hparams \['lambda_'\]"):
        compute_advantages("gae", no_critic, gamma=1.0)
    with pytest.raises(ValueError, match=r"unknown hparams \['gama'\]"):
        compute_advantages("arpo", no_critic, gama=1.0)


def test_advantage_inputs_validates_shapes():
    with pytest.raises(ValueError, match="values must have shape"):
        AdvantageInputs(rewards=BI_REWARDS, generated_mask=BI_MASK, values=torch.zeros(1, 3))
    with pytest.raises(ValueError, match="group_ids must have shape"):
        AdvantageInputs(rewards=BI_REWARDS, generated_mask=BI_MASK, group_ids=torch.tensor([0, 1]))
