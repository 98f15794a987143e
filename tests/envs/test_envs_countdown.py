"""Countdown: the equation checker and generated instances."""

from __future__ import annotations

import re

import pytest

from envs.countdown import CountdownConfig, CountdownEnv, score_equation


@pytest.mark.parametrize(
    ("equation", "numbers", "target"),
    [
        ("(3 + 5) * 2", [3, 5, 2], 16),
        (" 2*(5+3) ", [3, 5, 2], 16),
        ("(3 + 5) * 2 = 16", [3, 5, 2], 16),
        ("8 / (3 - 8 / 3)", [3, 3, 8, 8], 24),  # needs exact fractions: floats give 23.99...
        ("44 + 19 + 35", [44, 19, 35], 98),
    ],
)
def test_correct_equations_score_one(equation, numbers, target):
    assert score_equation(equation, numbers, target) == (1.0, True, True, "correct")


@pytest.mark.parametrize(
    ("equation", "reason"),
    [
        ("3 + 5 + 2", "equals 10, not 16"),
        ("3 * 5 / 2", "equals 15/2, not 16"),
        ("(3 + 3) * 2", "exactly once"),  # 3 used twice, 5 unused
        ("3 + 5", "exactly once"),  # 2 unused
        ("(3 + 5) * 2 * 1", "exactly once"),  # an extra number
        ("(3 + 5) * 2 = 17", "claims 17"),
    ],
)
def test_wrong_but_well_formed_scores_0_1(equation, reason):
    score = score_equation(equation, [3, 5, 2], 16)
    assert score.reward == pytest.approx(0.1) and score.well_formed and not score.correct
    assert re.search(reason, score.reason)


def test_division_by_zero_is_well_formed_but_wrong():
    score = score_equation("2 / (4 - 4)", [4, 4, 2], 2)
    assert score == (0.1, True, False, "division by zero")


@pytest.mark.parametrize(
    "equation",
    [
        "",
        "3 +",
        "abc",
        "2 ** 3 + 5",
        "(3 + 5) // 2",
        "-3 + 5 + 2",
        "2.5 * 3 + 5",
        "0x10 + 3 + 5",
        "__import__('os').system('true')",
        "(3 + 5) * 2; 1",
        "3 + 5 * 2 = x",
        "3 (5) 2",
        "1" * 300,
    ],
)
def test_malformed_scores_zero(equation):
    score = score_equation(equation, [3, 5, 2], 16)
    assert score.reward == 0.0 and not score.well_formed and not score.correct
    assert score.reason.startswith("malformed")


def test_generated_instances_are_solvable_and_in_range():
    env = CountdownEnv()
    seen = set()
    for seed in range(300):
        obs, _ = env.reset(seed=seed)
        match = re.fullmatch(r"Target: (\d+), nums: \[(\d+), (\d+), (\d+)\]", obs)
        assert match, obs
        target, numbers = int(match[1]), [int(n) for n in match.groups()[1:]]
        assert 1 <= target <= 100 and all(1 <= n <= 99 for n in numbers)
        assert score_equation(env.reference_equation, numbers, target).correct
        seen.add(obs)
    assert len(seen) >= 290


def test_four_numbers_and_determinism():
    config = {"num_numbers": 4, "max_number": 20, "max_target": 50}
    env = CountdownEnv(**config)
    obs, _ = env.reset(seed=9)
    assert len(env.numbers) == 4 and obs == CountdownEnv(**config).reset(seed=9)[0]
    assert score_equation(env.reference_equation, env.numbers, env.target).correct


def test_env_step_rewards_and_termination():
    env = CountdownEnv()
    obs, _ = env.reset(seed=1)
    obs2, reward, terminated, truncated, info = env.step("3 +")
    assert obs2 == obs and reward == 0.0 and not terminated and not truncated
    assert info["action_is_valid"] is False
    _, reward, terminated, _, info = env.step(env.reference_equation)
    assert reward == 1.0 and terminated and info["success"]
    env.reset(seed=1)
    _, reward, terminated, _, info = env.step(" + ".join(map(str, env.numbers)) + " + 1")
    assert reward == pytest.approx(0.1) and terminated and not info["success"]
    assert env.action_vocabulary is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"num_numbers": 1}, "num_numbers"), ({"num_numbers": 7}, "num_numbers"),
     ({"max_number": 0}, "max_number"), ({"max_target": 0}, "max_target")],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CountdownConfig(**kwargs)


def test_random_action_is_well_formed_and_uses_every_number():
    import numpy as np

    from envs.countdown import score_equation

    env = CountdownEnv()
    env.reset(seed=11)
    rng = np.random.default_rng(0)
    for _ in range(20):
        equation = env.random_action(rng)
        assert score_equation(equation, env.numbers, env.target).well_formed, equation
