"""Sokoban's words render: exact sentences, a lossless read-back, and the expert playing through it."""

from __future__ import annotations

import numpy as np
import pytest

from envs.sokoban import SokobanConfig, SokobanEnv
from envs.sokoban_room import parse_room, render_room
from envs.sokoban_words import parse_words
from rllib_ragen.data.experts import TurnBudgetLeft, expert_for

ROOM = "######\n#__###\n#O_###\n#__X_#\n#_P__#\n######"


def test_render_states_boxes_targets_neighbours_and_walls_from_the_player():
    env = SokobanEnv(render="words")
    obs, _ = env.reset(seed=0, options={"room": ROOM})
    assert obs == (
        "You are at (5,3) in a 6x6 room with walls all around.\n"
        "Boxes: 1 Up and 1 Right.\n"
        "Targets: 2 Up and 1 Left.\n"
        "From box to nearest target: 1 Up and 2 Left.\n"
        "Next to you: Up floor, Down wall, Left floor, Right floor.\n"
        "Walls inside: (2,4), (2,5), (3,4), (3,5)."
    )
    obs, *_ = env.step("Right")
    assert obs.splitlines()[1:5] == [
        "Boxes: 1 Up.",
        "Targets: 2 Up and 2 Left.",
        "From box to nearest target: 1 Up and 2 Left.",
        "Next to you: Up box, Down wall, Left floor, Right floor.",
    ]


def test_boxes_on_targets_several_boxes_and_a_room_without_outer_walls():
    room = parse_room("√P_\n_XO")
    env = SokobanEnv(render="words", dim_room=(4, 4))
    obs, _ = env.reset(seed=0, options={"room": room})
    assert obs == (
        "You are at (1,2) in a 2x3 room.\n"
        "Boxes: 1 Left (on a target); 1 Down.\n"
        "Targets: 1 Left; 1 Down and 1 Right.\n"
        "From box to nearest target: here; 1 Right.\n"
        "Next to you: Up wall, Down box, Left box on a target, Right floor.\n"
        "Walls: none."
    )
    assert parse_words(obs) == room


def test_box_sides_name_what_lies_around_each_box_after_the_player_line():
    env = SokobanEnv(render="words", describe_box_sides=True)
    obs, _ = env.reset(seed=0, options={"room": ROOM})
    # The box at (4,4): a wall above it, floor on its other three sides; the player comes below it after Right.
    assert obs.splitlines()[4:6] == [
        "Next to you: Up floor, Down wall, Left floor, Right floor.",
        "Next to the box: Up wall, Down floor, Left floor, Right floor.",
    ]
    assert obs.splitlines()[6] == "Walls inside: (2,4), (2,5), (3,4), (3,5)."
    obs, *_ = env.step("Right")
    assert obs.splitlines()[5] == "Next to the box: Up wall, Down you, Left floor, Right floor."
    assert parse_words(obs) == env.room


def test_box_sides_of_several_boxes_in_a_room_without_outer_walls():
    room = parse_room("√P_\n_XO")
    env = SokobanEnv(render="words", dim_room=(4, 4), describe_box_sides=True)
    obs, _ = env.reset(seed=0, options={"room": room})
    assert obs.splitlines()[5] == (
        "Next to the boxes: Up wall, Down floor, Left wall, Right you; Up you, Down wall, Left floor, Right target."
    )
    assert parse_words(obs) == room


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"render": "words", "describe_box_sides": "yes"}, "describe_box_sides must be True or False, got 'yes'"),
        ({"describe_box_sides": True}, "describe_box_sides needs render='words'"),
    ],
)
def test_box_sides_refuse_a_non_bool_and_the_grid_render(overrides, message):
    with pytest.raises(ValueError, match=message):
        SokobanConfig(**overrides)


@pytest.mark.parametrize("box_sides", [False, True], ids=["plain", "box-sides"])
@pytest.mark.parametrize(("dim_room", "num_boxes"), [((6, 6), 1), ((7, 7), 2)])
def test_every_state_reads_back_to_the_same_room(dim_room, num_boxes, box_sides):
    env = SokobanEnv(render="words", dim_room=dim_room, num_boxes=num_boxes, describe_box_sides=box_sides)
    rng = np.random.default_rng(0)
    for seed in range(25):
        obs, _ = env.reset(seed=seed)
        for _ in range(6):
            assert render_room(parse_words(obs)) == render_room(env.room)
            obs, _, terminated, truncated, _ = env.step(env.random_action(rng))
            if terminated or truncated:
                break


@pytest.mark.parametrize("text", [
    "",
    "You are here.\nBoxes: 1 Up.\nTargets: here.\nFrom box to nearest target: 1 Up.\nNext to you: .\nWalls: none.",
    "You are at (2,2) in a 4x4 room.\nBoxes: north.\nTargets: here.\nFrom box to nearest target: 1 Up.\nNext to you: .\nWalls: none.",
    "You are at (2,2) in a 4x4 room.\nBoxes: 1 Up.\nTargets: here.\nFrom box to nearest target: 1 Up.\nNext to you: .\nBricks: none.",
])
def test_unreadable_text_is_an_error_naming_the_line(text):
    with pytest.raises(ValueError, match="Sokoban words render has 6 lines|unreadable"):
        parse_words(text)


def test_expert_solves_rooms_through_the_words_render_one_move_a_turn():
    """The expert acts on the env, the model on the text: each text it is shown still reads as its state."""
    env = SokobanEnv(render="words")
    solved = 0
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        expert = expert_for(env)
        for turn in range(13):
            assert render_room(parse_words(obs)) == render_room(env.room)
            answer = expert(env, TurnBudgetLeft(turns=13 - turn, actions=13 - turn, per_turn=1))
            assert answer is not None, f"seed {seed}: no plan within 13 single-move turns"
            obs, _, terminated, _, info = env.step(answer.actions[0])
            if terminated:
                solved += info["success"]
                break
    assert solved == 20


def test_instructions_follow_the_render():
    assert "Symbols:" not in SokobanEnv(render="words").instructions
    assert "Symbols: # wall" in SokobanEnv().instructions
    with pytest.raises(ValueError, match="render must be one of"):
        SokobanConfig(render="pixels")
