"""Boards: FrozenLake and Sokoban record their own state in every info (terrain, player, boxes,
moves and whether each changed anything, the fault a state shows), the same whatever the render;
envs without a picture record none; a board survives JSON and a malformed one is named."""

from __future__ import annotations

import json

import pytest

from envs import make_env
from envs.base import BOARD_INFO, FAILURE_KINDS_INFO
from envs.board import Board, Move, trailing_no_ops

LAKE = ("SFH", "FFF", "HFG")
ROOM = "######\n#____#\n#_X__#\n#__O_#\n#P___#\n######"


@pytest.mark.parametrize("render", ["grid", "words"])
def test_frozenlake_records_its_map_the_player_and_each_move(render):
    env = make_env("frozenlake", is_slippery=False, render=render)
    _, info = env.reset(seed=0, options={"desc": LAKE})
    assert info[BOARD_INFO] == {
        "terrain": ["..H", "...", "H.G"],
        "player": [0, 0],
        "boxes": [],
        "moves": [],
        "fault": None,
    }
    assert info[FAILURE_KINDS_INFO] == ["hole"]
    env.step("Up")  # into the top edge: nothing changes
    env.step("Jump")  # invalid: no move
    *_, info = env.step("Right")
    board = Board.from_json(info[BOARD_INFO])
    assert board.player == (0, 1) and board.moves == (Move(0, 0, -1, 0, False), Move(0, 0, 0, 1, True))
    *_, terminated, _, info = env.step("Right")
    assert terminated and Board.from_json(info[BOARD_INFO]).fault == "hole"


def test_a_slip_is_drawn_as_the_move_asked_for_from_where_the_player_stood():
    env = make_env("frozenlake", is_slippery=True)
    _, info = env.reset(seed=3)
    start = Board.from_json(info[BOARD_INFO]).player
    for _ in range(6):
        *_, terminated, truncated, info = env.step("Down")
        board = Board.from_json(info[BOARD_INFO])
        move = board.moves[-1]
        assert (move.d_row, move.d_col) == (1, 0)
        assert move.effective == ((move.row, move.col) != board.player)
        if terminated or truncated:
            break
    assert (board.moves[0].row, board.moves[0].col) == start


@pytest.mark.parametrize("render", ["grid", "words"])
def test_sokoban_records_walls_targets_boxes_and_a_box_that_can_never_reach_a_target(render):
    env = make_env("sokoban", render=render)
    _, info = env.reset(seed=0, options={"room": ROOM})
    board = Board.from_json(info[BOARD_INFO])
    assert board.terrain == ("######", "#....#", "#....#", "#..T.#", "#....#", "######")
    assert (board.player, board.boxes, board.fault) == ((4, 1), ((2, 2),), None)
    assert info[FAILURE_KINDS_INFO] == ["dead_box"]
    for action in ("Left", "Right", "Up"):
        *_, info = env.step(action)
    board = Board.from_json(info[BOARD_INFO])
    assert board.moves == (Move(4, 1, 0, -1, False), Move(4, 1, 0, 1, True), Move(4, 2, -1, 0, True))
    assert board.fault is None
    *_, info = env.step("Up")  # the box against the top wall, off every target's row and column
    board = Board.from_json(info[BOARD_INFO])
    assert (board.player, board.boxes, board.fault) == ((2, 2), ((1, 2),), "dead_box")


def test_the_board_is_the_env_state_not_its_render():
    room = make_env("sokoban").reset(seed=5)[1][BOARD_INFO]
    assert make_env("sokoban", render="words").reset(seed=5)[1][BOARD_INFO] == room
    assert make_env("sokoban_new_vocab").reset(seed=5)[1][BOARD_INFO] == room


def test_envs_without_a_picture_record_no_board():
    _, info = make_env("bandit").reset(seed=0)
    assert BOARD_INFO not in info and FAILURE_KINDS_INFO not in info


def test_a_board_survives_json_and_a_malformed_one_is_named():
    board = Board(("#.T", "H.G"), (0, 1), ((0, 2),), (Move(0, 0, 0, 1, True), Move(0, 1, 0, 1, False)), "dead_box")
    assert Board.from_json(json.loads(json.dumps(board.to_json()))) == board
    assert trailing_no_ops(board.moves) == 1 and trailing_no_ops(()) == 0
    with pytest.raises(ValueError, match="not a board"):
        Board.from_json({"terrain": ["..."]})
    with pytest.raises(ValueError, match=r"letters \['x'\]"):
        Board(("x.",), (0, 0))
    with pytest.raises(ValueError, match="outside the 1x2 board"):
        Board(("..",), (0, 2))
