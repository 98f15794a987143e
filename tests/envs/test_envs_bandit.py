"""Bandit: RAGEN-2's names-only arms and pair sets, payouts, RAGEN v1's pairs, invalid picks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from envs import make_env
from envs.bandit import PHOENIX_DRAGON, TEST_PAIRS, TRAIN_PAIRS, BanditConfig, BanditEnv

SEEDS = range(300)


def _pull(env: BanditEnv, role: int, seeds) -> np.ndarray:
    """Rewards of pulling the low (role 0) or high (role 1) arm once per seed; checks the success flag."""
    rewards = []
    for seed in seeds:
        env.reset(seed=seed)
        _, reward, terminated, truncated, info = env.step(env.pair[role])
        assert terminated and not truncated and info["action_is_valid"]
        assert info["success"] is (role == 1) and info["arm"] == env.pair[role]
        rewards.append(reward)
    return np.array(rewards)


def _state_template(env: BanditEnv, seed: int) -> str:
    """The state with the names replaced by their screen position: what the state says besides the names."""
    observation, _ = env.reset(seed=seed)
    first, second = env.arm_order
    return observation.replace(first, "<first>").replace(second, "<second>")


@pytest.mark.parametrize("name", ["bandit", "bandit_test"])
def test_default_states_carry_the_names_and_nothing_about_payouts(name):
    env = make_env(name)
    templates = {_state_template(env, seed) for seed in SEEDS}
    # One text for every pair and either order: which arm is high cannot be read.
    assert templates == {"Two slot machines stand before you: <first> and <second>.\nWhich machine do you pull?"}
    assert not env.config.describe_payouts
    assert not any(word in env.instructions.lower() for word in ("small", "large", "every time", "0.1", "risk"))
    assert not any(n in env.instructions for pair in TRAIN_PAIRS + TEST_PAIRS for n in pair)


def test_the_payout_description_is_only_an_explicit_option():
    env = make_env("bandit", describe_payouts=True)
    templates = {_state_template(env, seed) for seed in SEEDS}
    # The control: with descriptions the text depends on which arm is shown first, so the test above can fail.
    assert len(templates) == 2
    observation, _ = env.reset(seed=0)
    low, high = env.pair
    assert f"{low}: pays a small reward every time." in observation
    assert f"{high}: pays a large reward, but only some of the time." in observation


def test_train_and_held_out_pairs_are_ragen2s_and_disjoint():
    assert len(TRAIN_PAIRS) == 12 and len(TEST_PAIRS) == 8
    assert ("Teacher", "Trader") in TRAIN_PAIRS and ("Nurse", "StartupFounder") in TRAIN_PAIRS
    assert ("Receptionist", "Explorer") in TEST_PAIRS
    train_names = {n.casefold() for pair in TRAIN_PAIRS for n in pair}
    test_names = {n.casefold() for pair in TEST_PAIRS for n in pair}
    assert len(train_names) == 24 and len(test_names) == 16 and not train_names & test_names
    for name, pairs in (("bandit", TRAIN_PAIRS), ("bandit_test", TEST_PAIRS)):
        env = make_env(name)
        assert env.config == BanditConfig(arm_pairs=pairs, low_payoff=0.1, high_payoff=1.0, high_prob=0.25)
        drawn = set()
        for seed in SEEDS:
            env.reset(seed=seed)
            drawn.add(env.pair)
        assert drawn == set(pairs)  # every pair is drawn, and only these


def test_arm_order_is_random_per_seed_and_reproducible():
    env = make_env("bandit")
    high_first = []
    for seed in range(400):
        env.reset(seed=seed)
        high_first.append(env.arm_order[0] == env.pair[1])
    # The high arm is shown first in about half the seeds (4 binomial std).
    assert abs(sum(high_first) - 200) < 4 * math.sqrt(400 * 0.25)
    assert make_env("bandit").reset(seed=7)[0] == make_env("bandit").reset(seed=7)[0]


@pytest.mark.parametrize(
    ("name", "low_payoff"), [("bandit", 0.1), ("bandit_test", 0.1), ("bandit_phoenix_dragon", 0.15)]
)
def test_payouts_have_the_right_means(name, low_payoff):
    low = _pull(make_env(name), 0, range(200))
    assert np.all(low == low_payoff)
    trials = 4000
    high = _pull(make_env(name), 1, range(trials))
    assert set(high) == {0.0, 1.0}
    # The mean of 4000 Bernoulli(0.25) draws has std sqrt(0.25 * 0.75 / 4000) = 0.0068: a 4-std
    # tolerance (0.027) fails a correct env with probability < 1e-4, and a payout chance of 0.2
    # or 0.3 (7 std away) with probability < 1e-4 too.
    assert abs(high.mean() - 0.25) < 4 * math.sqrt(0.25 * 0.75 / trials)


def test_high_prob_one_makes_the_high_arm_deterministic():
    assert np.all(_pull(make_env("bandit", high_prob=1.0), 1, range(50)) == 1.0)


def test_v1_phoenix_dragon_and_its_reversed_labels():
    v1, rev = make_env("bandit_phoenix_dragon"), make_env("bandit_rev")
    assert v1.pair is None and v1.config.arm_pairs == PHOENIX_DRAGON == (("Phoenix", "Dragon"),)
    assert rev.config.arm_pairs == (("Dragon", "Phoenix"),)
    assert v1.action_vocabulary == rev.action_vocabulary == ("Dragon", "Phoenix")
    assert v1.config.low_payoff == rev.config.low_payoff == 0.15
    rev.reset(seed=0)
    _, reward, _, _, info = rev.step("phoenix")
    assert info["success"] and info["arm"] == "Phoenix" and reward in (0.0, 1.0)


def test_vocabulary_is_every_name_sorted_and_the_state_offers_its_pair():
    env = make_env("bandit")
    assert env.action_vocabulary == tuple(sorted(n for pair in TRAIN_PAIRS for n in pair))
    env.reset(seed=1)
    assert env.available_actions == tuple(sorted(env.pair))
    rng = np.random.default_rng(0)
    assert {env.random_action(rng) for _ in range(50)} == set(env.pair)


def test_invalid_pick_changes_nothing_then_valid_pick_terminates():
    env = make_env("bandit")
    obs_before, _ = env.reset(seed=3)
    other_pair_name = next(n for pair in TRAIN_PAIRS if pair != env.pair for n in pair)
    for action in ("Unicorn", "", other_pair_name, " || ".join(env.pair)):
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs == obs_before and reward == 0.0 and not terminated and not truncated
        assert info["action_is_valid"] is False and info["success"] is False
    *_, terminated, _, info = env.step(f"  {env.pair[0].upper()} ")
    assert terminated and info["arm"] == env.pair[0]
    with pytest.raises(RuntimeError, match="reset"):
        env.step(env.pair[0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"arm_pairs": (("Phoenix", "phoenix"),)}, "once"),
        ({"arm_pairs": (("A", "B"), ("C", "a"))}, "once"),
        ({"arm_pairs": (("A", ""),)}, "non-empty"),
        ({"arm_pairs": ((" A", "B"),)}, "outer spaces"),
        ({"arm_pairs": (("A", "B", "C"),)}, "pairs"),
        ({"arm_pairs": ()}, "pairs"),
        ({"high_prob": 1.5}, "high_prob"),
        ({"high_prob": -0.1}, "high_prob"),
        ({"low_payoff": float("nan")}, "low_payoff"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BanditConfig(**kwargs)


def test_pairs_given_as_lists_as_from_yaml():
    assert BanditConfig(arm_pairs=[["A", "B"]]).arm_pairs == (("A", "B"),)
