"""FrozenLake's words render: exact sentences, a lossless read-back, and the expert playing through it."""

from __future__ import annotations

import numpy as np
import pytest

from envs.frozenlake import FrozenLakeConfig, FrozenLakeEnv
from envs.frozenlake_words import parse_words
from envs.offsets import offset_words, parse_offset
from rllib_ragen.data.experts import TurnBudgetLeft, expert_for


def test_render_states_goal_neighbours_holes_and_position():
    env = FrozenLakeEnv(render="words", is_slippery=False)
    obs, _ = env.reset(seed=0, options={"desc": ("FFFF", "FHSF", "HHFF", "HFGF")})
    assert obs == (
        "You are at (2,3) on a 4x4 lake.\n"
        "Goal: 2 Down.\n"
        "Next to you: Left hole, Down ice, Right ice, Up ice.\n"
        "Holes next to you: Left.\n"
        "Holes at: (2,2), (3,1), (3,2), (4,1)."
    )


def test_the_holes_beside_the_player_are_named_by_their_actions():
    env = FrozenLakeEnv(render="words", is_slippery=False)
    obs, _ = env.reset(seed=0, options={"desc": ("FHFF", "HSHF", "FHFF", "FFFG")})
    assert obs.splitlines()[3] == "Holes next to you: Left, Down, Right, Up."
    obs, _ = env.reset(seed=0, options={"desc": ("SFFF", "FFFF", "FFFF", "FFFG")})
    assert obs.splitlines()[3] == "Holes next to you: none."


def test_render_after_the_last_step_says_where_the_player_ended():
    env = FrozenLakeEnv(render="words", is_slippery=False)
    env.reset(seed=0, options={"desc": ("SH", "FG")})
    obs, *_ = env.step("Right")
    assert obs.splitlines()[0] == "You fell into the hole at (1,2) on a 2x2 lake."
    env.reset(seed=0, options={"desc": ("SH", "FG")})
    env.step("Down")
    obs, reward, terminated, _, _ = env.step("Right")
    assert obs.splitlines()[:2] == ["You reached the goal at (2,2) on a 2x2 lake.", "Goal: here."]
    assert reward == 1.0 and terminated


@pytest.mark.parametrize(("d_row", "d_col", "words"), [
    (2, 1, "2 Down and 1 Right"), (-1, 0, "1 Up"), (0, -3, "3 Left"), (0, 0, "here"), (-2, -2, "2 Up and 2 Left"),
])
def test_offsets_are_named_by_the_actions_that_cover_them(d_row, d_col, words):
    assert offset_words(d_row, d_col) == words
    assert parse_offset(words) == (d_row, d_col)


@pytest.mark.parametrize("words", ["", "north", "1 Right and 2 Down", "0 Down", "2 Down and", "Down"])
def test_unreadable_offsets_are_errors_naming_them(words):
    with pytest.raises(ValueError, match="unreadable offset"):
        parse_offset(words)


@pytest.mark.parametrize("size", [2, 4, 6])
def test_every_state_reads_back_to_the_same_map_and_player(size):
    env = FrozenLakeEnv(render="words", size=size, is_slippery=False)
    rng = np.random.default_rng(0)
    for seed in range(40):
        obs, _ = env.reset(seed=seed)
        for _ in range(4):
            desc = tuple("".join("F" if ch == "S" else ch for ch in row) for row in env.lake.desc.astype(str))
            assert parse_words(obs) == (desc, divmod(int(env.lake.s), env.lake.ncol))
            obs, _, terminated, truncated, _ = env.step(env.random_action(rng))
            if terminated or truncated:
                break


@pytest.mark.parametrize("text", [
    "", "You are somewhere.\nGoal: here.\nNext to you: .\nHoles next to you: none.\nHoles at: none.",
    "You are at (1,1) on a 2x2 lake.\nGoal: north.\nNext to you: .\nHoles next to you: none.\nHoles at: none.",
    "You are at (1,1) on a 2x2 lake.\nGoal: 1 Down.\nNext to you: .\nHoles next to you: none.\nPits: none.",
    "You are at (1,1) on a 2x2 lake.\nGoal: 1 Down.\nNext to you: .\nHoles at: none.",  # the 4-line render
])
def test_unreadable_text_is_an_error_naming_the_line(text):
    with pytest.raises(ValueError, match="FrozenLake words render has 5 lines|unreadable"):
        parse_words(text)


def test_instructions_follow_render_and_ice():
    words = FrozenLakeEnv(render="words", is_slippery=False).instructions
    assert "not slippery" in words and "Symbols" not in words
    grid = FrozenLakeEnv().instructions
    assert "Symbols: P you" in grid and "slippery: you may slide" in grid
    with pytest.raises(ValueError, match="render must be one of"):
        FrozenLakeConfig(render="pixels")


def test_expert_solves_every_deterministic_map_through_the_words_render():
    """The expert acts on the env, the model on the text: each text it is shown still reads as its state.

    Every generated map is reachable, and a 4x4 path is at most 15 moves long.
    """
    env = FrozenLakeEnv(render="words", is_slippery=False)
    turns = 15
    for seed in range(123, 123 + 32):
        obs, _ = env.reset(seed=seed)
        expert = expert_for(env)
        success = False
        for turn in range(turns):
            answer = expert(env, TurnBudgetLeft(turns=turns - turn, actions=turns - turn, per_turn=1))
            assert parse_words(obs)[1] == divmod(int(env.lake.s), env.lake.ncol)
            obs, _, terminated, truncated, info = env.step(answer.actions[0])
            if terminated or truncated:
                success = info["success"]
                break
        assert success, f"seed {seed}: the expert did not reach the goal in {turns} single-move turns"
