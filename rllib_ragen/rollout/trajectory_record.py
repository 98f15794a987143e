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

Readers of finished group episodes sit here too: success, valid turns, thoughts and
the rollout statistics (`succeeded`, `turn_validity`, `think_text`,
`rollout_statistics`), for the env runner's metrics, evaluation, the collapse
metrics and the trajectory page; and why a trajectory failed (`failure_kind`,
counted by `failure_counts`). The env judges its own state: a board's `fault`
(FrozenLake's hole, Sokoban's box stuck where it can never reach a target) is the
kind when the last state shows one. Otherwise the kind follows from how the
trajectory ended, the same way on every env (`envs.base.FAILURE_KINDS`), first
match wins:

1. `env_error`: the env failed (its error ended the trajectory);
2. the last board's fault;
3. `invalid_answer`: the last answer held no valid action;
4. `repeated_no_op`: the last two or more moves changed nothing (into an edge, a wall, a stuck box);
5. `prompt_too_long`: the next prompt would not have fit the model's context;
6. `ended_unsolved`: the env ended the episode (e.g. a wrong final answer);
7. `out_of_turns`: the turn or action budget, or the env's own step limit, ran out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from envs.base import (
    BOARD_INFO,
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
from envs.board import Board, trailing_no_ops
from rllib_ragen.rollout.prompt.token_history import TokenHistory
from rllib_ragen.rollout.reward_shaping import TASK_REWARD, shaping_statistics

# The keys are private: every writer and reader of an episode goes through this module.
_SYSTEM_IDS = "system_ids"
_GROUP_ID = "group_id"
_POLICY_VERSION = "policy_version"
_ROLE = "role"
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
        role: A two-player game's role key, "<game>/<seat>" in self-play and "<game>/<seat>/vs_<module>"
            against another player (RAE's baseline key); None elsewhere.
    """

    system_ids: Sequence[int]
    group_id: int
    policy_version: int | None = None
    role: str | None = None


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
        role: Its role key in a two-player game (`TrajectoryStart.role`), None elsewhere.
    """

    history: TokenHistory
    turn_rewards: list[float]
    group_id: int
    role: str | None = None


# ------------------------------------------------------------------ writers
def start_info(start: TrajectoryStart) -> dict[str, Any]:
    """The reset-info entries of a trajectory's start (merge them into the env's reset info)."""
    info: dict[str, Any] = {_SYSTEM_IDS: list(start.system_ids), _GROUP_ID: int(start.group_id)}
    if start.policy_version is not None:
        info[_POLICY_VERSION] = int(start.policy_version)
    if start.role is not None:
        info[_ROLE] = start.role
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
    version, role = info.get(_POLICY_VERSION), info.get(_ROLE)
    return TrajectoryStart(
        [int(i) for i in info[_SYSTEM_IDS]],
        int(info[_GROUP_ID]),
        None if version is None else int(version),
        None if role is None else str(role),
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
    return Trajectory(history, [float(r) for r in episode.get_rewards()], start.group_id, start.role)


def trajectories_from_episodes(
    episodes: Iterable[MultiAgentEpisode | SingleAgentEpisode], *, history_window: int | None
) -> list[Trajectory]:
    """All agent trajectories of group episodes, in a stable order."""
    out: list[Trajectory] = []
    for episode in episodes:
        agents = episode.agent_episodes.values() if isinstance(episode, MultiAgentEpisode) else [episode]
        out.extend(trajectory_from_episode(a, history_window=history_window) for a in agents if len(a) > 0)
    return out


def think_text(response: str) -> str | None:
    """The stripped text between `<think>` and `</think>` of a response, or None without one."""
    start, end = response.find("<think>"), response.find("</think>")
    if start < 0 or end < start:
        return None
    return response[start + len("<think>") : end].strip()


def succeeded(trajectory: Any) -> bool:
    """Whether a finished trajectory (one agent's `SingleAgentEpisode`) solved its task."""
    return bool(trajectory.get_infos()[-1].get("success", False))


def turn_validity(trajectory: Any) -> list[float]:
    """Per turn of a trajectory: 1.0 if its answer held at least one valid action, else 0.0."""
    return [float(i.get("num_valid_actions", 0) > 0) for i in trajectory.get_infos()[1:]]


def rollout_statistics(episodes: list[MultiAgentEpisode]) -> dict[str, float]:
    """Success, reward and in-group spread of a list of finished group episodes."""
    returns: list[float] = []
    successes: list[float] = []
    in_group_std: list[float] = []
    lengths: list[int] = []
    turns: list[int] = []
    valid_turns: list[float] = []
    well_formed: list[float] = []
    thoughts: list[str] = []
    task_returns: list[float] = []
    turn_infos: list[dict[str, Any]] = []
    for episode in episodes:
        group_returns = []
        for agent_episode in episode.agent_episodes.values():
            infos = agent_episode.get_infos()
            group_returns.append(float(sum(agent_episode.get_rewards())))
            successes.append(float(succeeded(agent_episode)))
            lengths.extend(len(a) for a in agent_episode.get_actions())
            turns.append(len(agent_episode))
            valid_turns.extend(turn_validity(agent_episode))
            well_formed.extend(float(bool(i.get("format_ok", False))) for i in infos[1:])
            thoughts.extend(t for t in (think_text(response_text(i)) for i in infos[1:]) if t is not None)
            # Episodes from before reward shaping (e.g. offline data) carry only task rewards.
            task_returns.append(sum(i.get(TASK_REWARD, r) for i, r in zip(infos[1:], agent_episode.get_rewards())))
            turn_infos.extend(infos[1:])
        returns.extend(group_returns)
        in_group_std.append(float(np.std(group_returns, ddof=1)) if len(group_returns) > 1 else 0.0)
    return {
        "episode_return_mean": float(np.mean(returns)),
        "episode_return_std": float(np.std(returns)),
        "success_rate": float(np.mean(successes)),
        "in_group_reward_std": float(np.mean(in_group_std)),
        "response_length_mean": float(np.mean(lengths)) if lengths else 0.0,
        "num_turns_mean": float(np.mean(turns)),
        "valid_action_ratio": float(np.mean(valid_turns)) if valid_turns else 0.0,
        # Answers in the <think>/<answer> format, whether or not their actions were valid.
        "well_formed_ratio": float(np.mean(well_formed)) if well_formed else 0.0,
        # Distinct thoughts among all turns' thoughts: near 0 when reasoning collapsed to one template.
        "distinct_thought_ratio": len(set(thoughts)) / len(thoughts) if thoughts else 0.0,
        "num_trajectories": float(len(returns)),
        # The env's reward alone; episode_return_mean includes the reasoning-aware shaping.
        "task_return_mean": float(np.mean(task_returns)),
        **shaping_statistics(turn_infos),
    }


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
