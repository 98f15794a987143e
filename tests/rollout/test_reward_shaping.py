"""Reasoning-aware reward shaping terms, checked against numbers worked out by hand."""

from __future__ import annotations

import pytest
import torch

from rllib_ragen.rollout.prompt.prompt_protocol import ParsedAnswer
from rllib_ragen.rollout.reward_shaping import (
    RewardShapingSettings,
    shaping_statistics,
    think_length_in_band,
    thought_names_action,
)
from rllib_ragen.training.advantages import length_weighted_advantages


@pytest.mark.parametrize(
    "think,expected", [("a b", 1.0), ("a b c d", 1.0), ("a", 0.0), ("a b c d e", 0.0), ("", 0.0), (None, 0.0)]
)
def test_think_length_in_band_is_inclusive(think, expected):
    assert think_length_in_band(think, think_min_words=2, think_max_words=4) == expected


@pytest.mark.parametrize(
    "think,actions,expected",
    [
        ("Going LEFT, then up.", ("Left", "Up"), 1.0),
        ("left looks safe", ("Left", "Down"), 0.5),  # one of two actions named
        ("leftward is safe", ("Left",), 0.0),  # whole words only
        (None, ("Left",), 0.0),
        ("left", (), 0.0),
    ],
)
def test_thought_names_action_share(think, actions, expected):
    assert thought_names_action(think, actions) == expected


def test_shaped_turn_reward_by_hand():
    shaping = RewardShapingSettings(
        think_length_coeff=0.2, think_min_words=2, think_max_words=4, think_names_action_coeff=0.5
    )
    parsed = ParsedAnswer(actions=("Left", "Up"), think="I go left now")
    # 4 words: in the band (1); names Left, not Up (0.5); bonus 0.2 * 1 + 0.5 * 0.5 = 0.45 on top of -0.1.
    reward, info = shaping.shape(-0.1, parsed)
    assert reward == pytest.approx(0.35)
    assert info == pytest.approx(
        {"task_reward": -0.1, "think_words": 4.0, "think_length": 1.0, "think_names_action": 0.5, "shaping_bonus": 0.45}
    )


def test_shaping_is_off_by_default():
    reward, info = RewardShapingSettings().shape(1.0, ParsedAnswer(actions=("Left",), think="left"))
    assert reward == 1.0 and info["shaping_bonus"] == 0.0


def test_length_weighted_advantages_by_hand():
    # Lengths 3, 1 and an empty row: mean over rows with tokens = 2, relative lengths 1.5 and 0.5.
    # alpha = 1: weights 1/1.5 = 2/3 and 1/0.5 = 2 (the empty row keeps 1).
    advantages = torch.tensor([[3.0, 3.0, 3.0, 9.0], [1.0, 9.0, 9.0, 9.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    weighted, weights = length_weighted_advantages(advantages, mask, alpha=1.0)
    torch.testing.assert_close(weights, torch.tensor([2 / 3, 2.0, 1.0]))
    torch.testing.assert_close(weighted, torch.tensor([[2.0, 2.0, 2.0, 0.0], [2.0, 0, 0, 0], [0.0, 0, 0, 0]]))
    # alpha = 0.5: weights 1.5 ** -0.5 and 0.5 ** -0.5 = sqrt(2).
    _, weights = length_weighted_advantages(advantages, mask, alpha=0.5)
    torch.testing.assert_close(weights, torch.tensor([1.5**-0.5, 2**0.5, 1.0]))


def test_shaping_statistics_average_the_turns_that_have_each_key():
    turns = [{"task_reward": 1.0, "think_length": 1.0}, {"task_reward": 0.0, "think_length": 0.0}, {}]
    stats = shaping_statistics(turns)
    assert stats == {"task_reward_mean": 0.5, "think_length_mean": 0.5}


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"think_min_words": 5, "think_max_words": 4}, "think_min_words <= think_max_words"),
        ({"think_min_words": -1}, "think_min_words"),
        ({"advantage_length_weight": -1.0}, "advantage_length_weight must be >= 0"),
        ({"think_length_coeff": float("nan")}, "think_length_coeff must be a finite number"),
    ],
)
def test_bad_shaping_settings_are_clear_errors(settings, message):
    with pytest.raises(ValueError, match=message):
        RewardShapingSettings(**settings)
