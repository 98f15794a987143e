"""Corridor: per-seed layouts, deterministic moves, reward only on reaching the goal."""

from __future__ import annotations

import itertools

import pytest

from envs import make_env
from envs.corridor import CorridorEnv


def test_seed_fixes_the_layout_and_layouts_differ():
    env = make_env("corridor")
    renders = [env.reset(seed=seed)[0] for seed in range(20)]
    assert renders == [make_env("corridor").reset(seed=seed)[0] for seed in range(20)]
    assert len(set(renders)) > 5
    for render in renders:
        assert render.index("G") - render.index("P") == 3  # the goal is `distance` cells to the right


def test_reward_comes_only_at_the_goal():
    env = make_env("corridor", distance=3)
    env.reset(seed=0)
    steps = [env.step("Right") for _ in range(3)]
    assert [s[1] for s in steps] == [0.0, 0.0, 1.0]
    assert [s[2] for s in steps] == [False, False, True]
    assert steps[-1][4]["success"]


def test_walls_hold_and_invalid_moves_change_nothing():
    env = CorridorEnv(distance=1, max_padding=0)
    observation, _ = env.reset(seed=0)
    assert observation == "#PG#"
    assert env.step("Left")[0] == "#PG#"  # into the wall: stays put, counts as a move
    state, reward, terminated, _, info = env.step("Jump")
    assert (state, reward, terminated, info["action_is_valid"]) == ("#PG#", 0.0, False, False)
    assert env.num_steps == 1


def test_three_turns_of_random_moves_win_one_time_in_eight():
    """Of all 8 sequences of 3 moves, only Right, Right, Right reaches a goal 3 cells away."""
    wins = 0
    for moves in itertools.product(("Left", "Right"), repeat=3):
        env = CorridorEnv(distance=3, max_padding=0)
        env.reset(seed=0)
        wins += [env.step(move) for move in moves][-1][4]["success"]
    assert wins == 1


def test_truncated_after_max_steps():
    env = CorridorEnv(distance=3, max_steps=2)
    env.reset(seed=1)
    assert env.step("Left")[3] is False
    assert env.step("Left")[3] is True


@pytest.mark.parametrize("key,value", [("distance", 0), ("max_padding", -1), ("max_steps", 0)])
def test_bad_config_is_named(key, value):
    with pytest.raises(ValueError, match=key):
        CorridorEnv(**{key: value})
