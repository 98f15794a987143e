"""The `note_no_effect` option of Sokoban and FrozenLake: after a move that changed nothing the state ends in a
line saying so and why, gone after a move that changed something; off, every render is today's, character
for character; a bad value is refused; the expert and random demonstration players still play."""

from __future__ import annotations

import pytest

from envs import make_env
from envs.frozenlake import FrozenLakeEnv
from envs.registry import check_env_config
from envs.sokoban import SokobanEnv
from rllib_ragen.data.demonstrations import (
    DemonstrationSettings,
    RandomPlaySettings,
    expert_demonstrations,
    random_demonstrations,
)
from rllib_ragen.rollout.env_group import TurnBudgetSettings
from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings

NOTE = "Your last move, {}, changed nothing: {}."

# Today's words renders of seed 123 (recorded before the option existed): the start, and one move Down.
SOKOBAN_123 = (
    "You are at (3,5) in a 6x6 room with walls all around.\n"
    "Boxes: 1 Down and 1 Left.\n"
    "Targets: 1 Up.\n"
    "From box to nearest target: 2 Up and 1 Right.\n"
    "Next to you: Up target, Down floor, Left floor, Right wall.\n"
    "Walls inside: (2,2), (3,2), (4,2), (4,3), (5,2), (5,3)."
)
SOKOBAN_123_DOWN = (
    "You are at (4,5) in a 6x6 room with walls all around.\n"
    "Boxes: 1 Left.\n"
    "Targets: 2 Up.\n"
    "From box to nearest target: 2 Up and 1 Right.\n"
    "Next to you: Up floor, Down floor, Left box, Right wall.\n"
    "Walls inside: (2,2), (3,2), (4,2), (4,3), (5,2), (5,3)."
)
FROZENLAKE_123_UP = (
    "You are at (1,3) on a 4x4 lake.\n"
    "Goal: 3 Down.\n"
    "Next to you: Left ice, Down ice, Right ice, Up edge.\n"
    "Holes next to you: none.\n"
    "Holes at: (2,2), (3,1), (3,2), (4,1)."
)
FROZENLAKE_123_UP_RIGHT = (
    "You are at (1,4) on a 4x4 lake.\n"
    "Goal: 3 Down and 1 Left.\n"
    "Next to you: Left ice, Down ice, Right edge, Up edge.\n"
    "Holes next to you: none.\n"
    "Holes at: (2,2), (3,1), (3,2), (4,1)."
)


def _play(env, moves, **reset):
    obs, _ = env.reset(seed=123, **reset)
    seen = [obs]
    for move in moves:
        obs, *_ = env.step(move)
        seen.append(obs)
    return seen


@pytest.mark.parametrize("off", [{}, {"note_no_effect": False}], ids=["default", "False"])
def test_off_every_render_is_todays(off):
    """Seed 123, two no-ops among four moves each: the states as rendered before the option existed."""
    sokoban = make_env("sokoban", render="words", **off)
    # Right walks into a wall, Left pushes the box against one: no line, the state as it was.
    assert _play(sokoban, ["Right", "Down", "Left", "Up"]) == [
        SOKOBAN_123, SOKOBAN_123, SOKOBAN_123_DOWN, SOKOBAN_123_DOWN, SOKOBAN_123,
    ]
    lake = make_env("frozenlake", render="words", is_slippery=False, **off)
    assert _play(lake, ["Up", "Up", "Right", "Right"])[1:] == [
        FROZENLAKE_123_UP, FROZENLAKE_123_UP, FROZENLAKE_123_UP_RIGHT, FROZENLAKE_123_UP_RIGHT,
    ]
    assert _play(make_env("sokoban", **off), ["Right"]) == ["######\n##__O#\n##__P#\n###X_#\n###__#\n######"] * 2


def test_sokoban_a_wall_and_a_box_against_a_wall_are_named_and_the_line_goes_after_a_move():
    env = SokobanEnv(render="words", note_no_effect=True)
    start, into_wall, down, box_blocked, up = _play(env, ["Right", "Down", "Left", "Up"])
    assert start == SOKOBAN_123  # no move yet, no line
    assert into_wall == SOKOBAN_123 + "\n" + NOTE.format("Right", "a wall is there")
    assert down == SOKOBAN_123_DOWN  # Down moved the player: the line is gone
    assert box_blocked == SOKOBAN_123_DOWN + "\n" + NOTE.format("Left", "the box there is against a wall")
    assert up == SOKOBAN_123


@pytest.mark.parametrize(("room", "move", "reason"), [
    # The player at (1,2) with the box Left of it, a wall behind the box; a wall Up.
    ("#####\n#XP_#\n#O__#\n#####", "Left", "the box there is against a wall"),
    ("#####\n#XP_#\n#O__#\n#####", "Up", "a wall is there"),
    # Two boxes in a row Left of the player: the first is held by the second.
    ("######\n#XXP_#\n#OO__#\n######", "Left", "the box there is against another box"),
    # A room without outer walls: outside the grid counts as a wall.
    ("P_\nXO", "Up", "a wall is there"),
])
def test_sokoban_each_way_a_move_is_refused_gets_its_reason(room, move, reason):
    env = SokobanEnv(note_no_effect=True, dim_room=(6, 6))
    before, after = _play(env, [move], options={"room": room})
    assert after == before + "\n" + NOTE.format(move, reason)
    assert after.split("\n")[:-1] == room.split("\n")  # the grid render gains the line too


def test_frozenlake_the_edge_is_named_and_the_line_goes_after_a_move():
    env = FrozenLakeEnv(render="words", is_slippery=False, note_no_effect=True)
    _, up, up_again, right, right_again, down = _play(env, ["Up", "Up", "Right", "Right", "Down"])
    assert up == FROZENLAKE_123_UP
    assert up_again == FROZENLAKE_123_UP + "\n" + NOTE.format("Up", "the edge of the lake is there")
    assert right == FROZENLAKE_123_UP_RIGHT
    assert right_again == FROZENLAKE_123_UP_RIGHT + "\n" + NOTE.format("Right", "the edge of the lake is there")
    assert "changed nothing" not in down


def test_frozenlake_an_invalid_answer_is_no_move_and_keeps_the_line():
    env = FrozenLakeEnv(render="words", is_slippery=False, note_no_effect=True)
    env.reset(seed=0, options={"desc": ("SF", "FG")})
    noted, *_ = env.step("Left")
    assert noted.endswith(NOTE.format("Left", "the edge of the lake is there"))
    obs, _, _, _, info = env.step("Jump")
    assert not info["action_is_valid"] and obs == noted


def test_frozenlake_a_slide_into_the_edge_says_so():
    """Slippery ice: Right from the top-left corner goes Up a third of the time, into the edge."""
    env = FrozenLakeEnv(render="words", is_slippery=True, note_no_effect=True)
    reasons = set()
    for seed in range(30):
        env.reset(seed=seed, options={"desc": ("SFF", "FFF", "FFG")})
        obs, _, _, _, info = env.step("Right")
        if not info["action_is_effective"]:
            reasons.add(obs.split("\n")[-1])
        else:
            assert "changed nothing" not in obs
    assert reasons == {NOTE.format("Right", "you slid into the edge of the lake")}


@pytest.mark.parametrize("env", ["sokoban", "frozenlake"])
@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_bad_value_is_refused_naming_the_option(env, value):
    with pytest.raises(ValueError, match=f"note_no_effect must be True or False, got {value!r}"):
        make_env(env, note_no_effect=value)
    with pytest.raises(ValueError, match=f"env '{env}' rejects env_config .*note_no_effect must be True or False"):
        check_env_config(env, {"note_no_effect": value})


PROTOCOL = ProtocolSettings(max_actions_per_turn=1, think=False, prefill=True)
BUDGET = TurnBudgetSettings(max_turns=8, max_actions_per_traj=8)
NOTED = {
    "sokoban": {"render": "words", "note_no_effect": True},
    "frozenlake": {"render": "words", "is_slippery": False, "note_no_effect": True},
}


@pytest.mark.parametrize("env", ["sokoban", "frozenlake"])
def test_the_demonstration_players_play_with_the_note(env, tiny_tokenizer):
    """The warm start's players: the expert still solves every state it takes on, and random play,
    which walks into walls and edges, shows the line on the states its no-ops leave."""
    seeds = tuple(range(8))
    expert = expert_demonstrations(
        tiny_tokenizer, DemonstrationSettings(seeds=seeds, env=env, env_config=NOTED[env], protocol=PROTOCOL, budget=BUDGET)
    )
    assert expert and all(e.agent_episodes["traj_0"].get_infos(-1)["success"] for e in expert)
    played = random_demonstrations(
        tiny_tokenizer, RandomPlaySettings(seeds=seeds, env=env, env_config=NOTED[env], protocol=PROTOCOL, budget=BUDGET)
    )
    turns = [
        (info["action_is_effective"], obs)
        for episode in played
        for obs, info in zip(
            episode.agent_episodes["traj_0"].get_observations()[1:], episode.agent_episodes["traj_0"].get_infos()[1:]
        )
    ]
    assert any(not effective for effective, _ in turns)  # the test means something
    assert all(("changed nothing" in obs) == (not effective) for effective, obs in turns)
