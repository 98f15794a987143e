"""Group episodes <-> trajectory rows (dicts laid out as `TRAJECTORY_SCHEMA`). Pure: no Ray, no I/O.

- `episodes_to_rows`: `MultiAgentEpisode`s as `LLMEnvRunner` makes them (one
  per group) -> one row per trajectory.
- `row_to_trajectory`: one row -> that trajectory's `SingleAgentEpisode`,
  after checking every field; a malformed row raises `TrajectoryRowError`
  naming the row and the field.
- `GroupAssembler`: trajectory episodes, in any order -> the group episodes
  they belong to, each emitted once all its trajectories arrived.
- `rows_to_episodes`: rows -> group episodes (the two steps above).

Rebuilt episodes carry what the learner reads (`trajectory_from_episode`):
the sampled token ids as actions, their log-probs, the user and closing
pieces, the rewards, and the reset info's system ids, group id and seed.
"""

from __future__ import annotations

import json
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from rllib_ragen.data.schema import FIELD_NAMES, FIELDS, FieldSpec
from rllib_ragen.rollout.prompt.token_history import TokenHistory
from rllib_ragen.rollout.trajectory_record import (
    TrajectoryStart,
    TurnRecord,
    episode_model_outputs,
    is_record_info_key,
    start_info,
    trajectory_from_episode,
    turn_info,
    turn_model_outputs,
    turn_record,
)

# The reset-info key `EnvGroup` writes.
SEED = "seed"
# Added by `ray.data.read_parquet(..., include_paths=True)`; named in row errors.
PATH_COLUMN = "path"


class TrajectoryRowError(ValueError):
    """A stored trajectory row is malformed.

    Attributes:
        row: Which row (index, trajectory id and file when known).
        field: The offending field.
    """

    def __init__(self, row: str, field: str, problem: str) -> None:
        super().__init__(f"trajectory {row}: field {field!r} {problem}")
        self.row, self.field, self.problem = row, field, problem

    def __reduce__(self) -> tuple[type[TrajectoryRowError], tuple[str, str, str]]:
        # Ray ships errors raised in Ray Data workers to the driver by pickling.
        return type(self), (self.row, self.field, self.problem)


# ------------------------------------------------------------ episodes -> rows
def episodes_to_rows(
    episodes: Iterable[MultiAgentEpisode], *, env: str, env_config: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One row per trajectory of each group episode, in episode then agent order.

    Args:
        episodes: Finished group episodes made by `LLMEnvRunner` (or laid out like them).
        env: The registered env name the episodes were played in.
        env_config: The env's config overrides (stored as JSON).
    """
    config_json = json.dumps(dict(env_config or {}), sort_keys=True, default=_json_default)
    rows = []
    for episode in episodes:
        if not isinstance(episode, MultiAgentEpisode):
            raise TypeError(f"expected group episodes (MultiAgentEpisode), got {type(episode).__name__}")
        members = [(agent, a) for agent, a in episode.agent_episodes.items() if len(a) > 0]
        for agent, agent_episode in members:
            rows.append(
                _trajectory_row(
                    agent_episode,
                    episode_id=episode.id_,
                    agent_id=str(agent),
                    group_size=len(members),
                    env=env,
                    env_config=config_json,
                )
            )
    return rows


def _trajectory_row(
    episode: SingleAgentEpisode, *, episode_id: str, agent_id: str, group_size: int, env: str, env_config: str
) -> dict[str, Any]:
    trajectory = trajectory_from_episode(episode, history_window=None)
    token_ids, generated_mask, logp = trajectory.history.full_sequence()
    step_infos = episode.get_infos()[1:]
    texts = [turn_record(episode, t).response_text for t in range(len(step_infos))]
    seed = episode.get_infos(0).get(SEED)
    return {
        "trajectory_id": episode.id_,
        "episode_id": episode_id,
        "agent_id": agent_id,
        "group_id": trajectory.group_id,
        "group_size": group_size,
        "env": env,
        "env_config": env_config,
        "seed": None if seed is None else int(seed),
        "token_ids": [int(i) for i in token_ids],
        # The stored field keeps its schema name; it holds the generated-token mask.
        "loss_mask": generated_mask,
        "sampling_logp": _stored_logp(np.asarray(logp, np.float32), np.asarray(generated_mask, bool), episode.id_),
        "turn_spans": turn_spans(trajectory.history),
        "turn_rewards": trajectory.turn_rewards,
        "observations": [str(o) for o in episode.get_observations()],
        "response_texts": texts,
        "turn_infos": [_env_info_json(info) for info in step_infos],
        "terminated": bool(episode.is_terminated),
        "truncated": bool(episode.is_truncated),
        "success": bool(step_infos[-1].get("success", False)),
    }


def _env_info_json(step_info: Mapping[str, Any]) -> str:
    """A step info without the record's entries (stored in their own fields), as JSON."""
    env_info = {k: v for k, v in step_info.items() if not is_record_info_key(k)}
    return json.dumps(env_info, sort_keys=True, default=_json_default)


def turn_spans(history: TokenHistory) -> list[list[int]]:
    """`[start, response_start, response_end]` of each answered turn in `full_sequence()`'s ids."""
    spans, start = [], len(history.system_ids)
    for turn in history.answered_turns():
        response_start = start + len(turn.user_ids)
        response_end = response_start + len(turn.response_ids)
        spans.append([start, response_start, response_end])
        start = response_end + len(turn.close_ids)
    return spans


def _stored_logp(logp: np.ndarray, mask: np.ndarray, episode_id: str) -> list[float] | None:
    """The log-prob column: None when the response log-probs are unknown (all NaN)."""
    unknown = np.isnan(logp[mask])
    if unknown.all():
        return None
    if unknown.any():
        raise ValueError(f"episode {episode_id}: some response log-probs are NaN, others not; store all or none")
    return logp.tolist()


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot store a {type(value).__name__} in a trajectory row: {value!r}")


# ------------------------------------------------------------ rows -> episodes
def row_to_trajectory(row: Mapping[str, Any], *, index: int = 0) -> SingleAgentEpisode:
    """The trajectory episode of one row, after checking every field.

    Args:
        row: A dict with the fields of `TRAJECTORY_SCHEMA` (extra keys are ignored).
        index: The row's position, used in error messages.

    Raises:
        TrajectoryRowError: a field is missing, null, of the wrong type, of the
            wrong length, or inconsistent with `turn_spans`.
    """
    label = _row_label(row, index)
    missing = [name for name in FIELD_NAMES if name not in row]
    if missing:
        raise TrajectoryRowError(label, missing[0], f"is missing (missing fields: {missing})")
    fields = {spec.name: _checked_value(row[spec.name], spec, label) for spec in FIELDS}
    _check_layout(fields, label)
    return _trajectory_episode(fields, label)


def _row_label(row: Mapping[str, Any], index: int) -> str:
    details = []
    if isinstance(row.get("trajectory_id"), str):
        details.append(f"trajectory_id {row['trajectory_id']!r}")
    if isinstance(row.get(PATH_COLUMN), str):
        details.append(f"file {row[PATH_COLUMN]}")
    return f"row {index}" + (f" ({', '.join(details)})" if details else "")


def _checked_value(value: Any, spec: FieldSpec, label: str) -> Any:
    """The value of one field if it has the field's type; lists of numbers come back as arrays."""
    if value is None:
        if spec.nullable:
            return None
        raise TrajectoryRowError(label, spec.name, "is null")
    kind = spec.type
    if pa.types.is_list(kind):
        return _checked_list(value, kind.value_type, spec.name, label)
    if pa.types.is_string(kind):
        ok = isinstance(value, str)
    elif pa.types.is_boolean(kind):
        ok = isinstance(value, (bool, np.bool_))
    else:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    if not ok:
        got = f"{type(value).__name__} {value!r:.60}"
        raise TrajectoryRowError(label, spec.name, f"must be {_type_name(kind)}, got {got}")
    return value


def _checked_list(value: Any, item: pa.DataType, name: str, label: str) -> Any:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, np.ndarray)):
        raise TrajectoryRowError(label, name, f"must be a list of {_type_name(item)}s, got {type(value).__name__}")
    if pa.types.is_list(item):
        return [_checked_list(v, item.value_type, name, label) for v in value]
    if pa.types.is_string(item):
        bad = [v for v in value if not isinstance(v, str)]
        if bad:
            raise TrajectoryRowError(label, name, f"must be a list of strings, got an item {bad[0]!r:.60}")
        return list(value)
    try:
        array = np.asarray(value) if len(value) else np.zeros(0, dtype=np.int64)
    except ValueError as error:  # ragged nesting
        raise TrajectoryRowError(label, name, f"must be a flat list of {_type_name(item)}s ({error})") from None
    allowed = "iu" if pa.types.is_integer(item) else "iuf"
    if array.ndim != 1 or array.dtype.kind not in allowed:
        raise TrajectoryRowError(
            label, name, f"must be a flat list of {_type_name(item)}s, got items of type {array.dtype}"
        )
    return array


def _type_name(kind: pa.DataType) -> str:
    if pa.types.is_string(kind):
        return "string"
    if pa.types.is_boolean(kind):
        return "bool"
    if pa.types.is_integer(kind):
        return "integer"
    if pa.types.is_floating(kind):
        return "number"
    return "list"


def _check_layout(fields: dict[str, Any], label: str) -> None:
    """Lengths agree, turn spans cut the tokens in order, the loss mask marks the responses."""
    n, spans = len(fields["token_ids"]), fields["turn_spans"]
    if not spans:
        raise TrajectoryRowError(label, "turn_spans", "is empty: a trajectory has at least one turn")
    expected = {
        "loss_mask": n,
        "sampling_logp": n,
        "turn_rewards": len(spans),
        "response_texts": len(spans),
        "turn_infos": len(spans),
        "observations": len(spans) + 1,
    }
    for name, length in expected.items():
        if fields[name] is not None and len(fields[name]) != length:
            basis = "token_ids" if length == n else "turn_spans"
            raise TrajectoryRowError(label, name, f"has {len(fields[name])} entries, but {basis} makes it {length}")
    response = np.zeros(n, dtype=np.int64)
    previous_end = 0
    for t, span in enumerate(spans):
        if len(span) != 3 or not previous_end <= span[0] <= span[1] < span[2] <= n:
            raise TrajectoryRowError(
                label,
                "turn_spans",
                f"entry {t} is {list(map(int, span))}; need [start, response_start, "
                f"response_end] with {previous_end} <= start <= response_start < response_end <= {n}",
            )
        response[span[1] : span[2]] = 1
        previous_end = int(span[2])
    mismatch = np.flatnonzero(fields["loss_mask"] != response)
    if mismatch.size:
        i = int(mismatch[0])
        raise TrajectoryRowError(
            label,
            "loss_mask",
            f"is {int(fields['loss_mask'][i])} at token {i}, but turn_spans put "
            f"{'a response' if response[i] else 'no response'} token there (the mask must be 1 exactly on responses)",
        )
    if n and fields["token_ids"].min() < 0:
        raise TrajectoryRowError(label, "token_ids", "holds a negative id")
    if fields["group_size"] < 1:
        raise TrajectoryRowError(label, "group_size", f"must be >= 1, got {fields['group_size']}")
    for name, texts in (("env_config", [fields["env_config"]]), ("turn_infos", fields["turn_infos"])):
        for text in texts:
            if not isinstance(_json_object(text), dict):
                raise TrajectoryRowError(label, name, f"must hold JSON objects, got {text!r:.60}")


def _json_object(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _trajectory_episode(fields: dict[str, Any], label: str) -> SingleAgentEpisode:
    ids = fields["token_ids"].astype(np.int32)
    spans = [[int(x) for x in span] for span in fields["turn_spans"]]
    ends = [span[0] for span in spans[1:]] + [len(ids)]
    logp = fields["sampling_logp"]
    # Unknown log-probs (demonstrations) become NaN: never mistaken for real values.
    logp = np.full(len(ids), np.nan, dtype=np.float32) if logp is None else logp.astype(np.float32)
    start = TrajectoryStart(ids[: spans[0][0]].tolist(), int(fields["group_id"]))
    reset_info = {**start_info(start), SEED: fields["seed"]}
    turns = [
        TurnRecord(ids[start:rs].tolist(), ids[re:end].tolist(), logp[rs:re].tolist(), str(text))
        for (start, rs, re), end, text in zip(spans, ends, fields["response_texts"])
    ]
    step_infos = [{**json.loads(info), **turn_info(turn)} for info, turn in zip(fields["turn_infos"], turns)]
    return SingleAgentEpisode(
        id_=fields["trajectory_id"],
        agent_id=fields["agent_id"],
        module_id=DEFAULT_MODULE_ID,
        multi_agent_episode_id=fields["episode_id"],
        observations=list(fields["observations"]),
        infos=[reset_info, *step_infos],
        actions=[ids[rs:re] for _, rs, re in spans],
        rewards=[float(r) for r in fields["turn_rewards"]],
        extra_model_outputs=episode_model_outputs(turns),
        terminated=bool(fields["terminated"]),
        truncated=bool(fields["truncated"]),
        len_lookback_buffer=0,
    )


class GroupAssembler:
    """Collects trajectory episodes, in any order, into their group episodes.

    `add` returns a group's `MultiAgentEpisode` once all `group_size` of its
    trajectories arrived; `finish` raises if any group is still incomplete.
    """

    def __init__(self) -> None:
        self._pending: dict[str, list[SingleAgentEpisode]] = {}
        self._sizes: dict[str, int] = {}

    def add(self, trajectory: SingleAgentEpisode, group_size: int) -> MultiAgentEpisode | None:
        key = trajectory.multi_agent_episode_id
        size = self._sizes.setdefault(key, int(group_size))
        if size != group_size:
            raise ValueError(f"group episode {key!r}: its rows disagree on group_size ({size} vs {group_size})")
        members = self._pending.setdefault(key, [])
        if any(m.agent_id == trajectory.agent_id for m in members):
            raise ValueError(f"group episode {key!r} holds agent {trajectory.agent_id!r} twice")
        members.append(trajectory)
        if len(members) < size:
            return None
        del self._pending[key], self._sizes[key]
        return group_episode(members)

    def finish(self) -> None:
        """Raises ValueError naming the groups that are missing trajectories."""
        if self._pending:
            missing = [f"{key!r} ({len(m)} of {self._sizes[key]})" for key, m in self._pending.items()]
            raise ValueError(f"incomplete groups, trajectories found of group_size: {', '.join(missing[:5])}")


def group_episode(members: Sequence[SingleAgentEpisode]) -> MultiAgentEpisode:
    """Replays the trajectories of one group into its `MultiAgentEpisode`, turn by turn.

    As in `LLMEnvRunner`, each env step holds the agents still acting, and the
    step where the last of them ends is the group's last (`__all__`).
    """
    members = sorted(members, key=lambda m: _natural_key(str(m.agent_id)))
    episode = MultiAgentEpisode(
        id_=members[0].multi_agent_episode_id, agent_module_ids={m.agent_id: m.module_id for m in members}
    )
    episode.add_env_reset(
        observations={m.agent_id: m.get_observations(0) for m in members},
        infos={m.agent_id: m.get_infos(0) for m in members},
    )
    for t in range(max(len(m) for m in members)):
        acting = [m for m in members if len(m) > t]
        last = {m.agent_id: t == len(m) - 1 for m in acting}
        group_done = all(len(m) <= t + 1 for m in members)
        episode.add_env_step(
            observations={m.agent_id: m.get_observations(t + 1) for m in acting},
            actions={m.agent_id: m.get_actions(t) for m in acting},
            rewards={m.agent_id: m.get_rewards(t) for m in acting},
            infos={m.agent_id: m.get_infos(t + 1) for m in acting},
            terminateds={**{m.agent_id: m.is_terminated and last[m.agent_id] for m in acting}, "__all__": group_done},
            truncateds={**{m.agent_id: m.is_truncated and last[m.agent_id] for m in acting}, "__all__": group_done},
            extra_model_outputs={m.agent_id: turn_model_outputs(turn_record(m, t)) for m in acting},
        )
    for m in members:
        episode.agent_episodes[m.agent_id].id_ = m.id_
    return episode


def _natural_key(name: str) -> list[Any]:
    """ "traj_2" before "traj_10"."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def rows_to_episodes(rows: Iterable[Mapping[str, Any]]) -> list[MultiAgentEpisode]:
    """Group episodes of trajectory rows; each group's rows may appear anywhere."""
    assembler, episodes = GroupAssembler(), []
    for index, row in enumerate(rows):
        group = assembler.add(row_to_trajectory(row, index=index), row["group_size"])
        if group is not None:
            episodes.append(group)
    assembler.finish()
    return episodes
