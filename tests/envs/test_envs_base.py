"""The TextEnv contract, checked on every registered env."""

from __future__ import annotations

import random

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from envs import list_envs, make_env
from envs.base import match_action


@pytest.mark.parametrize("name", list_envs())
def test_passes_gymnasium_env_checker(name):
    check_env(make_env(name), skip_render_check=True)


@pytest.mark.parametrize("name", list_envs())
def test_contract_and_global_rng_untouched(name):
    np.random.seed(0)
    random.seed(0)
    np_state, py_state = np.random.get_state()[1].copy(), random.getstate()
    env = make_env(name)
    assert env.instructions and "<answer>" not in env.instructions
    obs, info = env.reset(seed=123)
    assert isinstance(obs, str) and obs and info["success"] is False
    assert obs == make_env(name).reset(seed=123)[0]
    assert env.available_actions is None or set(env.available_actions) <= set(env.action_vocabulary)
    action = env.available_actions[0] if env.available_actions else "1 + 2"
    _, reward, terminated, truncated, info = env.step(action)
    assert isinstance(reward, float)
    assert isinstance(terminated, bool) and isinstance(truncated, bool)
    assert info["action_is_valid"] is True and isinstance(info["success"], bool)
    assert (np.random.get_state()[1] == np_state).all() and random.getstate() == py_state


def test_reset_seeds_like_default_rng():
    env = make_env("bandit")
    env.reset(seed=42)
    # After reset the env drew its pair and the arm order; default_rng(42) agrees.
    expected = np.random.default_rng(42)
    expected.integers(len(env.config.arm_pairs))
    expected.random()
    assert env.np_random.random() == expected.random()


def test_step_errors_are_explicit():
    env = make_env("sokoban")
    with pytest.raises(RuntimeError, match="reset"):
        env.step("Up")
    env.reset(seed=0)
    with pytest.raises(TypeError, match="str"):
        env.step(3)


def test_match_action():
    vocabulary = ("Up", "Down")
    assert match_action(" dOWN\t", vocabulary) == "Down"
    assert match_action("Down!", vocabulary) is None
    assert match_action("", vocabulary) is None


@pytest.mark.parametrize("value", [3.0, 6.7e165, True, "3"])
def test_an_int_setting_refuses_anything_but_a_whole_number(value):
    """A float, a bool or text where a config declares `int` is named at once, not a crash inside the env."""
    from envs import check_env_config

    with pytest.raises(ValueError, match=r"distance takes an int, got"):
        check_env_config("corridor", {"distance": value})
    check_env_config("corridor", {"distance": np.int64(4)})  # numpy's whole numbers are whole numbers
