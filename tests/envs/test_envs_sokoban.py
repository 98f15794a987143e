"""Sokoban: generated rooms are solvable, rules and rewards match hand-computed values."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from envs import make_env
from envs.sokoban import SokobanConfig, SokobanEnv
from envs.sokoban_generator import wander
from envs.sokoban_room import (
    NEW_VOCAB_SYMBOLS,
    STANDARD_SYMBOLS,
    parse_room,
    render_room,
)
from envs.sokoban_solver import solve
from rllib_ragen.data.experts import TurnBudgetLeft, expert_for
from rllib_ragen.rollout.prompt.prompt_protocol import parse_answer


def _play(env: SokobanEnv, actions: list[str]) -> tuple[float, bool, bool, dict]:
    """Steps all actions; returns (total reward, terminated, truncated, last info)."""
    total, terminated, truncated, info = 0.0, False, False, {}
    for i, action in enumerate(actions):
        assert not (terminated or truncated), f"episode ended early, before action {i}"
        _, reward, terminated, truncated, info = env.step(action)
        total += reward
    return total, terminated, truncated, info


@pytest.mark.parametrize(
    ("dim_room", "num_boxes", "seeds"), [((6, 6), 1, range(50)), ((8, 8), 2, range(10))]
)
def test_generated_rooms_are_solvable_and_solutions_score_as_expected(dim_room, num_boxes, seeds):
    env = SokobanEnv(dim_room=dim_room, num_boxes=num_boxes)
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        room = env.room
        assert (room.layout.height, room.layout.width) == dim_room
        assert len(room.boxes) == num_boxes and not room.boxes & room.layout.targets
        assert obs.count("X") == num_boxes and obs.count("O") + obs.count("S") == num_boxes
        assert not info["success"]
        actions = solve(env)
        assert actions, f"seed {seed}: no solution for\n{obs}"
        total, terminated, truncated, info = _play(env, actions)
        assert terminated and not truncated and info["success"]
        # Each box ends on a target (+1 net each), the last push adds +10, each move -0.1.
        assert total == pytest.approx(10 + num_boxes - 0.1 * len(actions))


def test_same_seed_same_room_and_seeds_differ():
    env_a, env_b = SokobanEnv(), SokobanEnv()
    rooms = [env_a.reset(seed=s)[0] for s in range(30)]
    assert rooms == [env_b.reset(seed=s)[0] for s in range(30)]
    assert len(set(rooms)) >= 25


def test_wander_walks_the_player_one_to_three_cells_without_pushing():
    room = parse_room("##########\n#P_____XO#\n##########")  # a corridor: only Right
    distances = set()
    for seed in range(60):
        moved = wander(np.random.default_rng(seed), room)
        assert moved.boxes == room.boxes and moved.layout == room.layout
        distances.add(moved.player - room.player)
    assert distances == {1, 2, 3}


def test_render_parse_round_trip_and_border():
    env = SokobanEnv()
    obs, _ = env.reset(seed=3)
    assert parse_room(obs) == env.room
    rows = obs.split("\n")
    assert len(rows) == 6 and all(len(r) == 6 for r in rows)
    assert rows[0] == rows[-1] == "######" and all(r[0] == r[-1] == "#" for r in rows)


def test_walk_then_push_to_win_reward_arithmetic():
    env = SokobanEnv()
    env.reset(options={"room": "######\n#P_XO#\n######"})
    obs, reward, terminated, truncated, info = env.step("Right")
    assert obs == "######\n#_PXO#\n######"
    assert reward == pytest.approx(-0.1) and not terminated and not info["success"]
    obs, reward, terminated, truncated, info = env.step("Right")
    assert obs == "######\n#__P√#\n######"
    assert reward == pytest.approx(-0.1 + 1 + 10) and terminated and info["success"]
    assert not truncated


def test_push_onto_then_off_target():
    env = SokobanEnv()
    env.reset(options={"room": "#######\n#PXO__#\n#_X__O#\n#######"})
    obs, reward, terminated, *_ = env.step("Right")
    assert obs == "#######\n#_P√__#\n#_X__O#\n#######"
    assert reward == pytest.approx(-0.1 + 1) and not terminated
    obs, reward, terminated, *_ = env.step("Right")
    assert obs == "#######\n#__SX_#\n#_X__O#\n#######"
    assert reward == pytest.approx(-0.1 - 1) and not terminated


def test_push_from_target_to_target_cancels():
    env = SokobanEnv()
    env.reset(options={"room": "######\n#P√O_#\n#__X_#\n######"})
    obs, reward, terminated, *_ = env.step("Right")
    assert obs == "######\n#_S√_#\n#__X_#\n######"
    assert reward == pytest.approx(-0.1 + 1 - 1) and not terminated


@pytest.mark.parametrize(
    ("room", "action"),
    [
        ("#####\n#_PX#\n#O__#\n#####", "Right"),  # box against a wall
        ("######\n#PXX_#\n#_OO_#\n######", "Right"),  # box against a box
        ("#####\n#P_X#\n#__O#\n#####", "Left"),  # player against a wall
    ],
)
def test_blocked_moves_cost_a_step_and_change_nothing(room, action):
    env = SokobanEnv()
    obs_before, _ = env.reset(options={"room": room})
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs == obs_before
    assert reward == pytest.approx(-0.1) and not terminated and not truncated
    assert info["action_is_valid"] and not info["action_is_effective"]
    assert env.num_steps == 1


@pytest.mark.parametrize("action", ["jump", "", "Up Up", "upp", "Up||Down", "0"])
def test_invalid_action_changes_nothing_and_does_not_count(action):
    env = SokobanEnv(max_steps=1)
    obs_before, _ = env.reset(seed=5)
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs == obs_before and reward == 0.0 and not terminated and not truncated
    assert info["action_is_valid"] is False and info["success"] is False
    assert env.num_steps == 0


def test_actions_match_case_insensitively_with_whitespace():
    env = SokobanEnv()
    env.reset(options={"room": "######\n#P_XO#\n######"})
    _, _, _, _, info = env.step("  rIGHT\n")
    assert info["action_is_valid"] and env.room.player == env.room.cell(1, 2)


def test_truncated_at_max_steps_then_step_raises():
    env = SokobanEnv(max_steps=3)
    env.reset(options={"room": "######\n#P_XO#\n######"})
    results = [env.step("Left") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    assert sum(r[1] for r in results) == pytest.approx(-0.3)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("Right")


def test_solver_finds_shortest_path_and_reports_failures():
    walk_then_push = parse_room("#####\n#P__#\n#_X_#\n#_O_#\n#####")
    assert solve(walk_then_push) == ["Right", "Down"]
    corner = parse_room("#####\n#X_O#\n#__P#\n#####")  # box stuck in a corner
    assert solve(corner) is None
    assert solve(parse_room("#####\n#√_P#\n#####")) == []
    long_room = SokobanEnv(dim_room=(8, 8), num_boxes=2)
    long_room.reset(seed=1)
    assert solve(long_room, max_states=5) is None
    with pytest.raises(TypeError, match="Room"):
        solve("#####")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("#####\n#P_X#\n##", "different lengths"),
        ("#####\n#PQXO\n#####", "unknown symbol"),
        ("#####\n#__XO\n#####", "exactly one player"),
        ("#####\n#PXX_\n#O___", "as many boxes as targets"),
    ],
)
def test_parse_room_rejects_bad_rooms(text, message):
    with pytest.raises(ValueError, match=message):
        parse_room(text)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dim_room": (3, 6)}, "dim_room"),
        ({"dim_room": (6, 6, 6)}, "dim_room"),
        ({"num_boxes": 0}, "num_boxes"),
        ({"dim_room": (5, 5), "num_boxes": 8}, "num_boxes"),
        ({"max_steps": 0}, "max_steps"),
        ({"search_depth": 0}, "search_depth"),
        ({"grid_vocabulary": "emoji"}, "grid_vocabulary"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SokobanConfig(**kwargs)


def test_config_accepts_list_dims_and_rejects_unknown_keys():
    assert SokobanConfig(dim_room=[7, 7]).dim_room == (7, 7)
    with pytest.raises(TypeError, match="num_box.*accepted keys"):
        SokobanEnv(num_box=2)


def test_unknown_reset_option_raises():
    with pytest.raises(ValueError, match="level"):
        SokobanEnv().reset(seed=0, options={"level": 1})


def test_render_of_hand_room_is_identity():
    text = "#####\n#S_X#\n#√XO#\n#___#\n#####"
    assert render_room(parse_room(text)) == text


def test_grid_symbols_must_be_distinct_characters():
    with pytest.raises(ValueError, match="seven distinct"):
        dataclasses.replace(NEW_VOCAB_SYMBOLS, box="W")
    with pytest.raises(ValueError, match="seven distinct"):
        dataclasses.replace(NEW_VOCAB_SYMBOLS, box="BB")


def test_new_vocab_round_trips_every_kind_of_cell():
    standard = "#####\n#S_X#\n#√XO#\n#___#\n#####"
    new = "WWWWW\nW@.BW\nWCBGW\nW...W\nWWWWW"
    assert render_room(parse_room(standard), NEW_VOCAB_SYMBOLS) == new
    assert parse_room(new, NEW_VOCAB_SYMBOLS) == parse_room(standard)
    with pytest.raises(ValueError, match="unknown symbol '#'"):
        parse_room(standard, NEW_VOCAB_SYMBOLS)


def test_sokoban_new_vocab_shows_only_its_symbols_on_the_same_rooms():
    new, standard = make_env("sokoban_new_vocab"), make_env("sokoban")
    seen = set()
    for seed in range(30):
        observation, _ = new.reset(seed=seed)
        seen |= set(observation) - {"\n"}
        assert parse_room(observation, NEW_VOCAB_SYMBOLS) == new.room == parse_room(standard.reset(seed=seed)[0])
    new_symbols, old_symbols = set(dataclasses.astuple(NEW_VOCAB_SYMBOLS)), set(dataclasses.astuple(STANDARD_SYMBOLS))
    assert seen <= new_symbols and not seen & old_symbols
    assert "Symbols: W wall, . empty floor, G target, B box, C box on a target, A you" in new.instructions
    assert not {"#", "_", "√"} & set(new.instructions)


def test_sokoban_new_vocab_answers_parse_and_the_solver_and_expert_solve_it():
    env = make_env("sokoban_new_vocab")
    observation, _ = env.reset(seed=4)
    plan = solve(parse_room(observation, NEW_VOCAB_SYMBOLS))
    assert plan and plan == solve(env)
    answer = f"<think>push it</think><answer>{' || '.join(a.lower() for a in plan)}</answer>"
    parsed = parse_answer(answer, max_actions_per_turn=len(plan), action_vocabulary=env.action_vocabulary)
    assert list(parsed.actions) == plan
    _, terminated, _, info = _play(env, list(parsed.actions))
    assert terminated and info["success"]
    env.reset(seed=4)
    turn = expert_for(env)(env, TurnBudgetLeft(turns=5, actions=len(plan), per_turn=len(plan)))
    assert turn.actions == plan


def test_spaced_render_parses_back_and_gives_each_cell_its_own_token(tiny_tokenizer):
    plain, spaced = SokobanEnv(), SokobanEnv(cell_separator=" ")
    obs, _ = plain.reset(seed=3)
    spaced_obs, _ = spaced.reset(seed=3)
    assert [row.split(" ") for row in spaced_obs.split("\n")] == [list(row) for row in obs.split("\n")]
    assert parse_room(spaced_obs, separator=" ") == spaced.room == plain.room
    again, _ = SokobanEnv(cell_separator=" ").reset(seed=0, options={"room": spaced_obs})
    assert again == spaced_obs
    # SmolLM2's tokenizer merges runs of cells ("####", "__") without the separator.
    assert [len(tiny_tokenizer.encode(row)) for row in spaced_obs.split("\n")] == [6] * 6
    assert min(len(tiny_tokenizer.encode(row)) for row in obs.split("\n")) < 6


def test_an_unknown_cell_separator_is_refused_by_name():
    with pytest.raises(ValueError, match="cell_separator must be one of"):
        SokobanConfig(cell_separator=",")
