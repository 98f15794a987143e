"""Bandit: payoffs, success flag, arm order per seed, names, invalid picks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from envs.bandit import BanditConfig, BanditEnv


def _pull(env: BanditEnv, arm: str, seeds: range) -> list[tuple[float, bool]]:
    results = []
    for seed in seeds:
        env.reset(seed=seed)
        _, reward, terminated, truncated, info = env.step(arm)
        assert terminated and not truncated and info["action_is_valid"]
        results.append((reward, info["success"]))
    return results


def test_low_arm_always_pays_0_1_and_is_not_success():
    results = _pull(BanditEnv(), "Phoenix", range(200))
    assert all(r == pytest.approx(0.1) and not s for r, s in results)


def test_high_arm_pays_1_with_probability_a_quarter():
    trials = 4000
    results = _pull(BanditEnv(), "Dragon", range(trials))
    rewards = np.array([r for r, _ in results])
    assert set(rewards) == {0.0, 1.0}
    assert all(s for _, s in results)
    assert abs(rewards.mean() - 0.25) < 4 * math.sqrt(0.25 * 0.75 / trials)


def test_high_prob_one_makes_the_high_arm_deterministic():
    results = _pull(BanditEnv(high_prob=1.0), "Dragon", range(50))
    assert all(r == 1.0 for r, _ in results)


def test_arm_order_is_random_per_seed_and_reproducible():
    env = BanditEnv()
    first = [env.reset(seed=s)[0].index("Dragon") < env.reset(seed=s)[0].index("Phoenix")
             for s in range(400)]
    # Dragon named first in about half the seeds (4 binomial std).
    assert abs(sum(first) - 200) < 4 * math.sqrt(400 * 0.25)
    assert BanditEnv().reset(seed=7)[0] == BanditEnv().reset(seed=7)[0]


def test_text_names_both_arms_and_vocabulary_hides_which_is_high():
    normal, reversed_ = BanditEnv(), BanditEnv(low_arm="Dragon", high_arm="Phoenix")
    assert normal.action_vocabulary == reversed_.action_vocabulary == ("Dragon", "Phoenix")
    assert normal.instructions == reversed_.instructions
    obs, _ = normal.reset(seed=0)
    assert "Dragon" in obs and "Phoenix" in obs
    assert "Dragon" in normal.instructions and "Phoenix" in normal.instructions


def test_held_out_names():
    env = BanditEnv(low_arm="Trader", high_arm="Librarian", high_prob=1.0)
    env.reset(seed=0)
    _, reward, _, _, info = env.step("librarian")
    assert reward == 1.0 and info["success"] and info["arm"] == "Librarian"


def test_invalid_pick_changes_nothing_then_valid_pick_terminates():
    env = BanditEnv()
    obs_before, _ = env.reset(seed=3)
    for action in ("Unicorn", "", "Dragon || Phoenix"):
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs == obs_before and reward == 0.0 and not terminated and not truncated
        assert info["action_is_valid"] is False and info["success"] is False
    *_, terminated, _, info = env.step("  phoenix ")
    assert terminated and info["arm"] == "Phoenix"
    with pytest.raises(RuntimeError, match="reset"):
        env.step("Dragon")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"low_arm": "dragon"}, "differ"),
        ({"high_arm": ""}, "high_arm"),
        ({"low_arm": " Phoenix"}, "low_arm"),
        ({"high_prob": 1.5}, "high_prob"),
        ({"high_prob": -0.1}, "high_prob"),
        ({"low_payoff": float("nan")}, "low_payoff"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BanditConfig(**kwargs)
