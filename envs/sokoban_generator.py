"""Solvable Sokoban rooms from a seeded generator.

The recipe (from gym-sokoban, as used by RAGEN):
1. carve the floor with a random walk (the room's topology);
2. put every box on its own target and the player on a free cell;
3. play backwards: the player walks and *pulls* boxes; among the states reached
   within `search_depth` reverse moves, keep one with the highest score
   (box swaps x total box displacement) and no box left on a target. Since
   every pull can be undone by a push, the kept state is solvable;
4. walk the player 1-3 random steps (never pushing) so it is not always next
   to a box.
Rooms where this fails (too little floor, no box can leave its target) are
redrawn from the same generator, so the result stays a function of the seed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import numpy as np

from envs.sokoban_room import DIRECTIONS, Layout, Room

# 3x3 stamps the random walk carves: a cell, a line, a cross, a square.
_MASKS = (
    ((0, 0, 0), (0, 1, 0), (0, 0, 0)),
    ((0, 0, 0), (1, 1, 1), (0, 0, 0)),
    ((0, 1, 0), (0, 1, 0), (0, 1, 0)),
    ((0, 1, 0), (1, 1, 1), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (1, 1, 0)),
)
P_CHANGE_DIRECTION = 0.35
MAX_TRIES = 200


def generate_room(
    rng: np.random.Generator,
    *,
    dim_room: tuple[int, int],
    num_boxes: int,
    search_depth: int,
) -> Room:
    """A solvable room drawn from `rng` (same generator state -> same room).

    Raises RuntimeError if `MAX_TRIES` draws all come out degenerate, which
    means the room is too small for `num_boxes`.
    """
    height, width = dim_room
    walk_steps = int(1.7 * (height + width))
    for _ in range(MAX_TRIES):
        floor = carve_floor(rng, height, width, walk_steps)
        if len(floor) < num_boxes + 2:
            continue
        targets, player = _place_pieces(rng, floor, num_boxes)
        walls = frozenset(range(height * width)) - floor
        layout = Layout(height, width, walls, targets)
        start = reverse_play(rng, layout, player, search_depth)
        if start is not None:
            return wander(rng, start)
    raise RuntimeError(
        f"no usable {height}x{width} room with {num_boxes} box(es) in {MAX_TRIES} tries; "
        "use a larger dim_room or fewer boxes"
    )


def carve_floor(rng: np.random.Generator, height: int, width: int, steps: int) -> frozenset[int]:
    """Floor cells carved by a random walk that stays off the outer border."""
    floor: set[int] = set()
    row, col = int(rng.integers(1, height - 1)), int(rng.integers(1, width - 1))
    moves = list(DIRECTIONS.values())
    d_row, d_col = moves[int(rng.integers(len(moves)))]
    for _ in range(steps):
        if rng.random() < P_CHANGE_DIRECTION:
            d_row, d_col = moves[int(rng.integers(len(moves)))]
        row = min(max(row + d_row, 1), height - 2)
        col = min(max(col + d_col, 1), width - 2)
        mask = _MASKS[int(rng.integers(len(_MASKS)))]
        for m_row in range(3):
            for m_col in range(3):
                r, c = row + m_row - 1, col + m_col - 1
                if mask[m_row][m_col] and 0 < r < height - 1 and 0 < c < width - 1:
                    floor.add(r * width + c)
    return frozenset(floor)


def _place_pieces(rng: np.random.Generator, floor: frozenset[int], num_boxes: int) -> tuple[frozenset[int], int]:
    """Distinct target cells (boxes start on them) and a player cell."""
    cells = rng.choice(sorted(floor), size=num_boxes + 1, replace=False)
    return frozenset(int(c) for c in cells[:num_boxes]), int(cells[num_boxes])


def reverse_play(rng: np.random.Generator, layout: Layout, player: int, search_depth: int) -> Room | None:
    """The best start reachable by walking and pulling boxes off their targets.

    Breadth-first over reverse moves up to `search_depth` deep. Boxes keep
    their identity along a path so each is scored against its own target.
    Returns None if no reachable state has every box off the targets.
    """
    start_boxes = tuple(sorted(layout.targets))
    origin = start_boxes
    # state key -> (boxes in identity order, last pulled box id, box swaps)
    seen = {(player, frozenset(start_boxes))}
    frontier = deque([(player, start_boxes, -1, 0, 0)])
    best_score = 0
    best: list[tuple[int, tuple[int, ...]]] = []
    while frontier:
        player_cell, boxes, last, swaps, depth = frontier.popleft()
        score = swaps * _displacement(layout, boxes, origin)
        if score > 0 and not set(boxes) & layout.targets:
            if score > best_score:
                best_score, best = score, []
            if score == best_score:
                best.append((player_cell, boxes))
        if depth == search_depth:
            continue
        for nxt in _reverse_moves(layout, player_cell, boxes, last, swaps):
            key = (nxt[0], frozenset(nxt[1]))
            if key not in seen:
                seen.add(key)
                frontier.append((*nxt, depth + 1))
    if not best:
        return None
    player_cell, boxes = best[int(rng.integers(len(best)))]
    return Room(layout, player_cell, frozenset(boxes))


def _reverse_moves(
    layout: Layout, player: int, boxes: tuple[int, ...], last: int, swaps: int
) -> Iterator[tuple[int, tuple[int, ...], int, int]]:
    """Yields (player, boxes, last pulled id, swaps) after each walk or pull."""
    opposite = (1, 0, 3, 2)
    for direction in range(len(DIRECTIONS)):
        nxt = layout.neighbors[player][direction]
        if nxt < 0 or nxt in boxes:
            continue
        yield nxt, boxes, last, swaps
        behind = layout.neighbors[player][opposite[direction]]
        if behind >= 0 and behind in boxes:
            pulled = boxes.index(behind)
            moved = (*boxes[:pulled], player, *boxes[pulled + 1 :])
            yield nxt, moved, pulled, swaps + (pulled != last)


def _displacement(layout: Layout, boxes: tuple[int, ...], origin: tuple[int, ...]) -> int:
    """Sum of Manhattan distances from each box to the target it started on."""
    total = 0
    for box, home in zip(boxes, origin):
        (r1, c1), (r2, c2) = divmod(box, layout.width), divmod(home, layout.width)
        total += abs(r1 - r2) + abs(c1 - c2)
    return total


def wander(rng: np.random.Generator, room: Room) -> Room:
    """Walks the player 1-3 random steps onto free cells it has not visited."""
    visited = {room.player}
    player = room.player
    for _ in range(int(rng.integers(1, 4))):
        options = [
            cell
            for cell in room.layout.neighbors[player]
            if cell >= 0 and cell not in room.boxes and cell not in visited
        ]
        if not options:
            break
        player = options[int(rng.integers(len(options)))]
        visited.add(player)
    return Room(room.layout, player, room.boxes)
