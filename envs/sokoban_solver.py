"""Shortest-solution Sokoban solver (breadth-first search over player moves).

Used to check that generated rooms are solvable and to make demonstration
data: `solve` returns the action names that solve the room in the fewest
moves, or None.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from envs.sokoban_room import ACTIONS, Layout, Room, apply_move

DEFAULT_MAX_STATES = 200_000


def solve(env_or_room: Any, *, max_states: int = DEFAULT_MAX_STATES) -> list[str] | None:
    """Fewest-move action list solving a room, or None.

    Args:
        env_or_room: a `Room`, or an env with a `room` attribute (e.g. a reset
            `SokobanEnv`; its current state is solved, not its initial one).
        max_states: most distinct (player, boxes) states to visit before giving up.

    Returns:
        Action names such as ["Up", "Left"] ([] if already solved), or None if
        the room is unsolvable or the search visited `max_states` states first.
    """
    room = env_or_room if isinstance(env_or_room, Room) else getattr(env_or_room, "room", None)
    if not isinstance(room, Room):
        raise TypeError(f"solve needs a Room or an env with a .room Room, got {type(env_or_room).__name__}")
    if max_states < 1:
        raise ValueError(f"max_states must be >= 1, got {max_states}")
    return _bfs(room, max_states)


def _bfs(room: Room, max_states: int) -> list[str] | None:
    layout = room.layout
    live = live_cells(layout)
    start = (room.player, room.boxes)
    parent: dict[tuple[int, frozenset[int]], tuple[tuple[int, frozenset[int]], int] | None] = {start: None}
    frontier = deque([start])
    while frontier:
        state = frontier.popleft()
        if state[1] == layout.targets:
            return _path(parent, state)
        for direction in range(len(ACTIONS)):
            move = apply_move(layout, state[0], state[1], direction)
            nxt = (move.player, move.boxes)
            if nxt in parent or (move.box_to >= 0 and move.box_to not in live):
                continue
            if len(parent) >= max_states:
                return None
            parent[nxt] = (state, direction)
            frontier.append(nxt)
    return None


def _path(parent: dict, state: tuple[int, frozenset[int]]) -> list[str]:
    actions = []
    while parent[state] is not None:
        state, direction = parent[state]
        actions.append(ACTIONS[direction])
    return actions[::-1]


def live_cells(layout: Layout) -> frozenset[int]:
    """Cells from which a lone box can still be pushed onto some target.

    A box pushed anywhere else (e.g. into a non-target corner) can never reach
    a target, so the search prunes those pushes. Computed by pulling boxes
    backwards from every target: a box at `c` can come from `c - d` when the
    player stood at `c - 2d`.
    """
    opposite = (1, 0, 3, 2)  # Up<->Down, Left<->Right in ACTIONS order
    live = set(layout.targets)
    frontier = deque(layout.targets)
    while frontier:
        cell = frontier.popleft()
        for direction in range(len(ACTIONS)):
            back = opposite[direction]
            source = layout.neighbors[cell][back]
            pusher = layout.neighbors[source][back] if source >= 0 else -1
            if pusher >= 0 and source not in live:
                live.add(source)
                frontier.append(source)
    return frozenset(live)
