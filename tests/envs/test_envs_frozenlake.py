"""FrozenLake: reachable random maps, slip statistics, termination and rendering."""

from __future__ import annotations

import math

import numpy as np
import pytest

from envs.frozenlake import FrozenLakeConfig, FrozenLakeEnv

OPEN_ICE = ("FFFF", "FSFF", "FFFF", "FFFG")  # start at (1, 1)


def _player(obs: str) -> tuple[int, int]:
    """(row, col) of the player symbol in a render."""
    rows = obs.split("\n")
    hits = [(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "PX√"]
    assert len(hits) == 1, obs
    return hits[0]


def _flood_fill_reaches_goal(desc: np.ndarray) -> bool:
    """Independent reachability check: grow the reached set by array shifts."""
    passable = desc != "H"
    reached = desc == "S"
    while True:
        grown = reached.copy()
        grown[1:] |= reached[:-1]
        grown[:-1] |= reached[1:]
        grown[:, 1:] |= reached[:, :-1]
        grown[:, :-1] |= reached[:, 1:]
        grown &= passable
        if (grown == reached).all():
            return bool(reached[desc == "G"].any())
        reached = grown


def test_generated_maps_are_reachable_random_and_mostly_frozen():
    env = FrozenLakeEnv()
    holes, starts, goals = [], set(), set()
    for seed in range(200):
        obs, _ = env.reset(seed=seed)
        desc = env.lake.desc.astype(str)
        assert desc.shape == (4, 4)
        assert (desc == "S").sum() == 1 and (desc == "G").sum() == 1
        assert _flood_fill_reaches_goal(desc), f"seed {seed}: unreachable\n{obs}"
        assert obs.count("P") == 1 and obs.count("G") == 1 and obs.count("O") == (desc == "H").sum()
        holes.append((desc == "H").sum() / 14)
        starts.add(_player(obs))
        goals.add(tuple(np.argwhere(desc == "G")[0]))
    # p_frozen=0.8 means ~20% holes (a bit fewer: unreachable maps are redrawn).
    assert 0.12 < np.mean(holes) < 0.22
    assert len(starts) >= 12 and len(goals) >= 12


def test_same_seed_same_map_and_same_slips():
    def rollout(seed: int) -> list[str]:
        env = FrozenLakeEnv()
        obs, _ = env.reset(seed=seed)
        renders = [obs]
        for _ in range(6):
            obs, _, terminated, _, _ = env.step("Right")
            renders.append(obs)
            if terminated:
                break
        return renders

    assert rollout(11) == rollout(11)
    assert len({rollout(s)[0] for s in range(20)}) >= 15


def test_slip_statistics_match_one_third():
    env = FrozenLakeEnv()
    trials = 1500
    outcomes = {(1, 2): 0, (0, 1): 0, (2, 1): 0}  # intended Right, slips Up and Down
    for seed in range(trials):
        env.reset(seed=seed, options={"desc": OPEN_ICE})
        obs, *_ = env.step("Right")
        outcomes[_player(obs)] += 1  # KeyError if it ever went Left or stayed
    tolerance = 4 * math.sqrt((1 / 3) * (2 / 3) / trials)  # 4 binomial std of a fraction
    for cell, count in outcomes.items():
        assert abs(count / trials - 1 / 3) < tolerance, (cell, count)


def test_not_slippery_moves_as_intended():
    env = FrozenLakeEnv(is_slippery=False)
    for seed in range(20):
        env.reset(seed=seed, options={"desc": OPEN_ICE})
        obs, *_ = env.step("down")
        assert _player(obs) == (2, 1)


def test_hole_ends_episode_without_reward():
    env = FrozenLakeEnv(is_slippery=False)
    env.reset(seed=0, options={"desc": ("SH", "FG")})
    obs, reward, terminated, truncated, info = env.step("Right")
    assert obs == "_X\n_G"
    assert reward == 0.0 and terminated and not truncated and not info["success"]
    with pytest.raises(RuntimeError):
        env.step("Down")


def test_goal_ends_episode_with_reward_one():
    env = FrozenLakeEnv(is_slippery=False)
    obs, _ = env.reset(seed=0, options={"desc": ("SH", "FG")})
    assert obs == "PO\n_G"
    obs, reward, terminated, _, info = env.step("Down")
    assert obs == "_O\nPG" and reward == 0.0 and not terminated
    obs, reward, terminated, _, info = env.step("Right")
    assert obs == "_O\n_√" and reward == 1.0 and terminated and info["success"]


def test_bump_into_edge_and_truncation():
    env = FrozenLakeEnv(is_slippery=False, max_steps=2)
    obs_before, _ = env.reset(seed=0, options={"desc": ("SF", "FG")})
    obs, reward, terminated, truncated, info = env.step("Up")
    assert obs == obs_before and not info["action_is_effective"] and info["action_is_valid"]
    assert reward == 0.0 and not terminated and not truncated
    *_, truncated, _ = env.step("Left")
    assert truncated


def test_invalid_action_changes_nothing_and_does_not_count():
    env = FrozenLakeEnv(is_slippery=False, max_steps=1)
    obs_before, _ = env.reset(seed=0, options={"desc": ("SF", "FG")})
    for action in ("North", "", "Left Left"):
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs == obs_before and reward == 0.0 and not (terminated or truncated)
        assert info["action_is_valid"] is False
    assert env.num_steps == 0
    *_, truncated, _ = env.step("Up")
    assert truncated


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"size": 1}, "size"), ({"p_frozen": 0.0}, "p_frozen"), ({"p_frozen": 1.5}, "p_frozen"),
     ({"max_steps": 0}, "max_steps")],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FrozenLakeConfig(**kwargs)


@pytest.mark.parametrize(
    "desc", [("SF", "FF"), ("SG", "GF"), ("SFA", "FGF"), ("SF", "G")]
)
def test_bad_user_map_raises(desc):
    with pytest.raises(ValueError, match="desc"):
        FrozenLakeEnv().reset(seed=0, options={"desc": desc})


def test_larger_maps_generate():
    env = FrozenLakeEnv(size=6, p_frozen=0.7)
    obs, _ = env.reset(seed=4)
    assert len(obs.split("\n")) == 6 and _flood_fill_reaches_goal(env.lake.desc.astype(str))


def test_spaced_render_gives_each_cell_its_own_token(tiny_tokenizer):
    obs, _ = FrozenLakeEnv().reset(seed=5)
    spaced, _ = FrozenLakeEnv(cell_separator=" ").reset(seed=5)
    assert [row.split(" ") for row in spaced.split("\n")] == [list(row) for row in obs.split("\n")]
    assert [len(tiny_tokenizer.encode(row)) for row in spaced.split("\n")] == [4] * 4
    assert min(len(tiny_tokenizer.encode(row)) for row in obs.split("\n")) < 4
    with pytest.raises(ValueError, match="cell_separator must be one of"):
        FrozenLakeConfig(cell_separator="|")
