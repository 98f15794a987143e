"""The board drawing: cells by terrain, boxes by whether they stand on a target, the player by
where it stands, and a turn's moves as arrows (a no-op red, crossed where it hit, counted)."""

from __future__ import annotations

import pytest

from envs.board import Board, Move
from rllib_ragen.run.board_drawing import CELL, drawing, legend

COLOURS = {item["meaning"]: item["colour"] for item in legend()}


def test_cells_boxes_and_the_player_take_the_colour_of_what_they_are():
    board = Board(("#.T", "H.G"), player=(1, 0), boxes=((0, 2), (0, 1)))
    shapes = drawing(board)
    assert (shapes["width"], shapes["height"]) == (3 * CELL, 2 * CELL)
    assert [cell["fill"] for cell in shapes["cells"]][:1] == [COLOURS["wall"]]
    assert shapes["cells"][3]["fill"] == COLOURS["hole"] and shapes["cells"][5]["fill"] == COLOURS["goal"]
    assert [t["cx"] for t in shapes["targets"]] == [2.5 * CELL]
    assert [box["fill"] for box in shapes["boxes"]] == [COLOURS["box on a target"], COLOURS["box"]]
    assert shapes["player"]["fill"] == COLOURS["you, in a hole"] and shapes["player"]["cell"] == "1,0"
    assert drawing(Board(("G",), (0, 0)))["player"]["fill"] == COLOURS["you, on the goal"]
    assert drawing(Board((".",), (0, 0)))["player"]["fill"] == COLOURS["you"]


def test_moves_are_arrows_and_a_repeated_no_op_is_one_crossed_arrow_with_its_count():
    down = Move(0, 0, 1, 0, True)
    stuck = Move(1, 0, 1, 0, False)
    arrows = drawing(Board(("..", ".."), (1, 0)), [down, stuck, stuck])["arrows"]
    assert [(a["effective"], a["count"]) for a in arrows] == [(True, 1), (False, 2)]
    # The move goes from the centre of its cell towards the next one; the no-op stops at the edge it hit.
    assert (arrows[0]["x1"], arrows[0]["y1"]) == (0.5 * CELL, 0.5 * CELL) and arrows[0]["y2"] > CELL
    assert arrows[0]["cross"] is None and arrows[0]["colour"] == COLOURS["a move of the turn"]
    assert arrows[1]["y2"] < 2 * CELL and arrows[1]["colour"] == COLOURS[next(m for m in COLOURS if "nothing" in m)]
    # The cross is centred where the move hit: the middle of the cell's bottom edge.
    points = [tuple(map(float, p.strip("ML").split(","))) for p in arrows[1]["cross"].split()]
    assert len(points) == 4
    assert sum(x for x, _ in points) / 4 == pytest.approx(0.5 * CELL)
    assert sum(y for _, y in points) / 4 == pytest.approx(2 * CELL)
