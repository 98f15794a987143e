"""Env registry: built-ins, errors, and a custom env added with one call."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from run_helpers import README_ENV, write_readme_env

import envs
from envs import registry
from envs.base import TextEnv


class CoinGuessEnv(TextEnv):
    """A one-step custom env: guess the side of a coin drawn per seed."""

    def __init__(self, *, sides: tuple[str, ...] = ("heads", "tails")) -> None:
        super().__init__()
        self.sides = sides
        self.coin: str | None = None

    @property
    def instructions(self) -> str:
        return f"Guess the coin. Actions: {', '.join(self.sides)}."

    @property
    def action_vocabulary(self) -> tuple[str, ...]:
        return self.sides

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> dict[str, Any]:
        self.coin = self.sides[int(rng.integers(len(self.sides)))]
        return {}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        right = action.strip() == self.coin
        return float(right), True, False, {"success": right}

    def render_text(self) -> str:
        return "A coin was flipped."


@pytest.fixture(autouse=True)
def _isolated_registry(monkeypatch):
    """Registrations made by a test vanish after it."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def test_builtins_are_registered_with_their_defaults():
    assert set(envs.list_envs()) >= {
        "sokoban", "larger_sokoban", "sokoban_new_vocab", "frozenlake", "bandit", "bandit_test",
        "bandit_phoenix_dragon", "bandit_rev", "countdown",
    }
    sokoban, larger = envs.make_env("sokoban"), envs.make_env("larger_sokoban")
    assert sokoban.config == envs.SokobanConfig(dim_room=(6, 6), num_boxes=1, max_steps=100)
    assert (larger.config.dim_room, larger.config.num_boxes) == ((8, 8), 2)
    assert envs.make_env("sokoban_new_vocab").config == envs.SokobanConfig(grid_vocabulary="new")
    bandit, held_out = envs.make_env("bandit"), envs.make_env("bandit_test")
    assert (len(bandit.config.arm_pairs), len(held_out.config.arm_pairs)) == (12, 8)
    assert bandit.config == envs.BanditConfig(low_payoff=0.1, high_payoff=1.0, high_prob=0.25)
    v1, rev = envs.make_env("bandit_phoenix_dragon"), envs.make_env("bandit_rev")
    assert (v1.config.arm_pairs, rev.config.arm_pairs) == ((("Phoenix", "Dragon"),), (("Dragon", "Phoenix"),))
    lake = envs.make_env("frozenlake")
    assert (lake.config.size, lake.config.p_frozen, lake.config.is_slippery) == (4, 0.8, True)
    assert isinstance(envs.make_env("countdown"), envs.CountdownEnv)


def test_overrides_merge_with_registered_defaults():
    env = envs.make_env("larger_sokoban", max_steps=7)
    assert env.config.max_steps == 7 and env.config.dim_room == (8, 8)
    assert envs.make_env("larger_sokoban").config.max_steps == 100  # defaults untouched


def test_unknown_env_lists_known_names():
    with pytest.raises(KeyError, match="sokobon.*countdown.*sokoban"):
        envs.make_env("sokobon")


def test_unknown_config_key_names_it_and_the_accepted_keys():
    with pytest.raises(TypeError, match=r"\['dim_rom'\].*accepted keys.*dim_room"):
        envs.make_env("sokoban", dim_rom=(6, 6))


def test_bad_config_value_raises_value_error():
    with pytest.raises(ValueError, match="num_boxes"):
        envs.make_env("sokoban", num_boxes=0)


def test_custom_env_with_one_call():
    envs.register_env("coin", CoinGuessEnv, sides=("heads", "tails"))
    env = envs.make_env("coin")
    assert "coin" in envs.list_envs() and env.action_vocabulary == ("heads", "tails")
    obs, _ = env.reset(seed=0)
    _, reward, terminated, _, info = env.step(env.coin)
    assert obs == "A coin was flipped." and reward == 1.0 and terminated and info["success"]
    assert envs.make_env("coin", sides=("a", "b", "c")).action_vocabulary == ("a", "b", "c")
    with pytest.raises(TypeError, match=r"\['side'\].*accepted keys: \['sides'\]"):
        envs.make_env("coin", side=("a",))


def test_callable_factory_and_duplicate_names():
    envs.register_env("coin3", lambda **kw: CoinGuessEnv(sides=("x", "y", "z")))
    assert envs.make_env("coin3").action_vocabulary == ("x", "y", "z")
    with pytest.raises(ValueError, match="already registered.*overwrite=True"):
        envs.register_env("coin3", CoinGuessEnv)
    envs.register_env("coin3", CoinGuessEnv, overwrite=True)
    assert envs.make_env("coin3").action_vocabulary == ("heads", "tails")


def test_registration_errors_are_caught_early():
    with pytest.raises(TypeError, match="colour"):
        envs.register_env("coin_bad", CoinGuessEnv, colour="red")
    assert "coin_bad" not in envs.list_envs()
    with pytest.raises(ValueError, match="non-empty"):
        envs.register_env(" ", CoinGuessEnv)
    with pytest.raises(TypeError, match="callable"):
        envs.register_env("not_callable", "CoinGuessEnv")
    envs.register_env("not_an_env", lambda: object())
    with pytest.raises(TypeError, match="not a TextEnv"):
        envs.make_env("not_an_env")


def test_an_import_path_names_an_env_class_in_any_process(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    env = envs.make_env(write_readme_env(tmp_path), secret=4)
    assert type(env).__name__ == "GuessEnv" and env.config.secret == 4
    envs.check_env(README_ENV, in_other_processes=True)
    assert README_ENV not in envs.list_envs()  # imported, not registered
    with pytest.raises(TypeError, match="'sekret'"):
        envs.make_env(README_ENV, sekret=4)


@pytest.mark.parametrize(
    "name,message",
    [
        ("no_such_module:Env", "unknown env 'no_such_module:Env': cannot import module 'no_such_module'"),
        ("envs.bandit:NoSuchEnv", "module 'envs.bandit' has no attribute 'NoSuchEnv'"),
        ("envs.bandit:BanditConfig.low_arm", "unknown env"),
        ("sokobann", r"unknown env 'sokobann'; registered envs: \[.*'sokoban'"),
    ],
)
def test_an_unknown_env_is_named(name, message):
    with pytest.raises(ValueError, match=message):
        envs.check_env(name)
    with pytest.raises(KeyError):
        envs.make_env(name)


def test_a_name_registered_here_is_refused_for_other_processes():
    envs.register_env("coin", CoinGuessEnv)
    envs.check_env("coin")  # fine in this process
    with pytest.raises(ValueError, match="'coin' is registered in this process only.*import path"):
        envs.check_env("coin", in_other_processes=True)
    envs.check_env("sokoban", in_other_processes=True)  # built-ins are registered in every process
    with pytest.raises(ValueError, match="marks import paths"):
        envs.register_env("a:b", CoinGuessEnv)


def test_readme_env_takes_only_the_actions_its_rule_names(tmp_path, monkeypatch):
    """"Guess the number between 1 and 5. Actions: 1, 2, 3, 4, 5.": anything else is invalid and changes nothing."""
    monkeypatch.syspath_prepend(str(tmp_path))
    env = envs.make_env(write_readme_env(tmp_path), secret=4)
    env.reset(seed=0)
    for action in ("7", "four", "0", "", "1 2"):
        state, reward, terminated, _, info = env.step(action)
        assert (state, reward, terminated, info["action_is_valid"]) == ("Pick a number.", 0.0, False, False), action
    assert env.step(" 2 ")[1:4] == (0.0, True, False)  # valid, wrong: the episode ends
    env.reset(seed=0)
    state, reward, terminated, _, info = env.step("4")
    assert (state, reward, terminated, info["success"], info["action_is_valid"]) == ("Solved.", 1.0, True, True, True)
