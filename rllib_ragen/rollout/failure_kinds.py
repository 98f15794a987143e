"""Why a trajectory failed: one named kind per failed trajectory, and the counts per kind.

The env judges its own state: a board's `fault` (FrozenLake's hole, Sokoban's box
stuck where it can never reach a target) is the kind when the last state shows one.
Otherwise the kind follows from how the trajectory ended, the same way on every env
(`envs.base.FAILURE_KINDS`), first match wins:

1. `env_error`: the env failed (its error ended the trajectory);
2. the last board's fault;
3. `invalid_answer`: the last answer held no valid action;
4. `repeated_no_op`: the last two or more moves changed nothing (into an edge, a wall, a stuck box);
5. `prompt_too_long`: the next prompt would not have fit the model's context;
6. `ended_unsolved`: the env ended the episode (e.g. a wrong final answer);
7. `out_of_turns`: the turn or action budget, or the env's own step limit, ran out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from envs.base import (
    ENDED_UNSOLVED,
    ENV_ERROR,
    FAILURE_KINDS,
    FAILURE_KINDS_INFO,
    INVALID_ANSWER,
    OUT_OF_TURNS,
    PROMPT_TOO_LONG,
    REPEATED_NO_OP,
    TERMINATED_INFO,
)
from envs.board import trailing_no_ops
from rllib_ragen.rollout.episode_readers import succeeded
from rllib_ragen.rollout.trajectory_record import state_boards

# Metric name prefix of the counts (`evaluation/failures/<kind>` in MLflow).
FAILURES_PREFIX = "failures/"
# A single move into a wall can be a slip or a probe; two in a row at the end is being stuck.
STUCK_NO_OPS = 2


def failure_kind(trajectory: Any) -> str | None:
    """The kind of failure of a finished trajectory (one agent's `SingleAgentEpisode`); None if it succeeded."""
    if succeeded(trajectory):
        return None
    infos = trajectory.get_infos()
    last, board = infos[-1], state_boards(trajectory)[-1]
    if "env_error" in last:
        return ENV_ERROR
    if board is not None and board.fault is not None:
        return board.fault
    if len(infos) > 1 and last.get("num_valid_actions", 0) == 0:
        return INVALID_ANSWER
    if board is not None and trailing_no_ops(board.moves) >= STUCK_NO_OPS:
        return REPEATED_NO_OP
    if last.get("prompt_truncated", False):
        return PROMPT_TOO_LONG
    if last.get(TERMINATED_INFO, False):
        return ENDED_UNSOLVED
    return OUT_OF_TURNS


def trajectories_of(episodes: Iterable[Any]) -> list[Any]:
    """The agent trajectories of group episodes, in order."""
    return [trajectory for episode in episodes for trajectory in episode.agent_episodes.values()]


def failure_counts(episodes: Iterable[Any]) -> dict[str, int]:
    """Failed trajectories per kind, over group episodes: every kind their env can name, zeros included
    (so that evaluations compare kind by kind), the env's own kinds first."""
    trajectories = trajectories_of(episodes)
    own = [kind for t in trajectories for kind in t.get_infos()[0].get(FAILURE_KINDS_INFO, ())]
    counts = dict.fromkeys([*own, *FAILURE_KINDS], 0)
    for trajectory in trajectories:
        kind = failure_kind(trajectory)
        if kind is not None:
            counts[kind] = counts.get(kind, 0) + 1
    return counts
