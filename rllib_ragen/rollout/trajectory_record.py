"""The trajectory record: what an `LLMEnvRunner` episode carries beyond RLlib's, written and read here only.

Episodes stay RLlib episodes (RLlib's connectors, checkpoints and Ray Data move
them); this module owns where a trajectory's pieces sit inside one:

- the reset info holds a `TrajectoryStart`: the system prompt's ids, the
  StarPO group and the policy version that sampled it (async rollouts);
- each step holds a `TurnRecord`: the user turn's ids before the response,
  the template tokens closing it and RLlib's `Columns.ACTION_LOGP` (the
  engine's sampling log-probs) in `extra_model_outputs`, the response's text
  in the step info; the sampled ids are the step's action;
- an env with a picture adds the state's board to each info (`envs.base.BOARD_INFO`,
  read with `board_of` and `state_boards`): the pages draw it, and stored rows leave it out
  (`is_record_info_key`), so it costs them nothing.

Writers (`start_info`, `turn_model_outputs`, `turn_info`) serve the env
runner, the Parquet converter and the demonstrations; readers
(`trajectory_from_episode`, `trajectory_start`, `turn_record`, ...) serve the
learner, the data tools, the metrics and the pages. A reader given an episode
made some other way raises a ValueError naming the episode and the missing piece.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from envs.base import BOARD_INFO
from envs.board import Board
from rllib_ragen.rollout.prompt.token_history import TokenHistory

# The keys are private: every writer and reader of an episode goes through this module.
_SYSTEM_IDS = "system_ids"
_GROUP_ID = "group_id"
_POLICY_VERSION = "policy_version"
_USER_IDS = "user_ids"
_CLOSE_IDS = "close_ids"
_RESPONSE_TEXT = "response_text"
_TURN_OUTPUTS = (Columns.ACTION_LOGP, _USER_IDS, _CLOSE_IDS)


@dataclasses.dataclass(frozen=True)
class TrajectoryStart:
    """What a trajectory starts from (its reset info).

    Attributes:
        system_ids: Tokens of the system block, shared by every prompt.
        group_id: StarPO group: trajectories of one group start from one initial state.
        policy_version: Version of the weights that sampled it; None for data
            nobody sampled live (demonstrations, stored rows).
    """

    system_ids: Sequence[int]
    group_id: int
    policy_version: int | None = None


@dataclasses.dataclass(frozen=True)
class TurnRecord:
    """One answered turn beside its sampled ids (the step's action).

    Attributes:
        user_ids: The user turn's ids before the response (message and assistant header).
        close_ids: The template tokens closing the response.
        sampling_logp: The engine's log-probs of the sampled ids (NaN when nobody sampled them).
        response_text: The decoded response.
    """

    user_ids: Sequence[int]
    close_ids: Sequence[int]
    sampling_logp: Sequence[float]
    response_text: str


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """One trajectory as the learner and the data tools read it.

    Attributes:
        history: The exact token pieces it was sampled with.
        turn_rewards: Each answered turn's reward.
        group_id: Its StarPO group.
    """

    history: TokenHistory
    turn_rewards: list[float]
    group_id: int


# ------------------------------------------------------------------ writers
def start_info(start: TrajectoryStart) -> dict[str, Any]:
    """The reset-info entries of a trajectory's start (merge them into the env's reset info)."""
    info: dict[str, Any] = {_SYSTEM_IDS: list(start.system_ids), _GROUP_ID: int(start.group_id)}
    if start.policy_version is not None:
        info[_POLICY_VERSION] = int(start.policy_version)
    return info


def turn_model_outputs(turn: TurnRecord) -> dict[str, np.ndarray]:
    """The step's `extra_model_outputs` of one turn."""
    return {
        Columns.ACTION_LOGP: np.asarray(turn.sampling_logp, dtype=np.float32),
        _USER_IDS: np.asarray(turn.user_ids, dtype=np.int32),
        _CLOSE_IDS: np.asarray(turn.close_ids, dtype=np.int32),
    }


def turn_info(turn: TurnRecord) -> dict[str, Any]:
    """The step-info entries of one turn (merge them into the env's step info)."""
    return {_RESPONSE_TEXT: turn.response_text}


def episode_model_outputs(turns: Sequence[TurnRecord]) -> dict[str, list[np.ndarray]]:
    """`extra_model_outputs` of a whole `SingleAgentEpisode` built at once, one entry a turn."""
    per_turn = [turn_model_outputs(turn) for turn in turns]
    return {key: [outputs[key] for outputs in per_turn] for key in _TURN_OUTPUTS}


def is_record_info_key(key: str) -> bool:
    """Whether a step-info key is kept out of the env's info in stored rows: the record's response
    text (stored in a field of its own) or the board (for pages only: a stored row needs no picture)."""
    return key in (_RESPONSE_TEXT, BOARD_INFO)


# ------------------------------------------------------------------ readers
def _missing(episode: SingleAgentEpisode, piece: str, where: str) -> ValueError:
    return ValueError(f"episode {episode.id_} was not made by LLMEnvRunner: no {piece!r} in {where}")


def trajectory_start(episode: SingleAgentEpisode) -> TrajectoryStart:
    """The start of a trajectory, from its reset info."""
    info = episode.get_infos(0)
    for key in (_SYSTEM_IDS, _GROUP_ID):
        if key not in info:
            raise _missing(episode, key, "its reset info")
    version = info.get(_POLICY_VERSION)
    return TrajectoryStart(
        [int(i) for i in info[_SYSTEM_IDS]], int(info[_GROUP_ID]), None if version is None else int(version)
    )


def policy_version(episode: SingleAgentEpisode) -> int:
    """The version of the weights that sampled a trajectory (every live rollout records one)."""
    version = trajectory_start(episode).policy_version
    if version is None:
        raise _missing(episode, _POLICY_VERSION, "its reset info")
    return version


def turn_record(episode: SingleAgentEpisode, turn: int) -> TurnRecord:
    """The record of answered turn `turn` (0-based)."""
    info = episode.get_infos(turn + 1)
    if _RESPONSE_TEXT not in info:
        raise _missing(episode, _RESPONSE_TEXT, f"the step info of turn {turn}")
    user_ids, close_ids, sampling_logp = _turn_tokens(episode, turn)
    return TurnRecord(user_ids, close_ids, sampling_logp, str(info[_RESPONSE_TEXT]))


def _turn_tokens(episode: SingleAgentEpisode, turn: int) -> tuple[list[int], list[int], list[float]]:
    """A turn's user ids, close ids and sampling log-probs: all the learner needs beside the action."""
    for key in _TURN_OUTPUTS:
        if key not in episode.extra_model_outputs:
            raise _missing(episode, key, "its extra_model_outputs")
    return (
        [int(i) for i in episode.get_extra_model_outputs(_USER_IDS, turn)],
        [int(i) for i in episode.get_extra_model_outputs(_CLOSE_IDS, turn)],
        [float(x) for x in episode.get_extra_model_outputs(Columns.ACTION_LOGP, turn)],
    )


def response_text(info: Mapping[str, Any]) -> str:
    """A step info's response text, "" without one: the metrics and pages show whatever an episode holds."""
    return str(info.get(_RESPONSE_TEXT, ""))


def board_of(info: Mapping[str, Any]) -> Board | None:
    """The board an info holds (`envs.board`), None when its env draws none (or the row was stored)."""
    data = info.get(BOARD_INFO)
    return None if data is None else Board.from_json(data)


def state_boards(episode: SingleAgentEpisode) -> list[Board | None]:
    """The board of each state of a trajectory, the reset's first: a turn whose answer ran no action
    left the state as it was (and the env gave no new board), so it keeps the one before."""
    boards: list[Board | None] = []
    for info in episode.get_infos():
        board = board_of(info)
        if board is None and boards and info.get("num_actions_executed") == 0:
            board = boards[-1]
        boards.append(board)
    return boards


def trajectory_from_episode(episode: SingleAgentEpisode, *, history_window: int | None) -> Trajectory:
    """Rebuilds the exact token history an `LLMEnvRunner` episode was sampled with."""
    start = trajectory_start(episode)
    history = TokenHistory(list(start.system_ids), history_window)
    for t in range(len(episode)):
        user_ids, close_ids, sampling_logp = _turn_tokens(episode, t)
        history.add_user(user_ids)
        history.add_response([int(i) for i in episode.get_actions(t)], sampling_logp, close_ids)
    return Trajectory(history, [float(r) for r in episode.get_rewards()], start.group_id)


def trajectories_from_episodes(
    episodes: Iterable[MultiAgentEpisode | SingleAgentEpisode], *, history_window: int | None
) -> list[Trajectory]:
    """All agent trajectories of group episodes, in a stable order."""
    out: list[Trajectory] = []
    for episode in episodes:
        agents = episode.agent_episodes.values() if isinstance(episode, MultiAgentEpisode) else [episode]
        out.extend(trajectory_from_episode(a, history_window=history_window) for a in agents if len(a) > 0)
    return out
