"""The Arrow schema of a stored trajectory: one row per trajectory, Parquet on disk.

A row holds everything needed to rebuild the exact token sequence the model
saw and generated, plus the rewards and what the environment reported:

    token_ids = system | user_0 response_0 close_0 | user_1 response_1 close_1 | ...

`turn_spans[t] = [start, response_start, response_end]` cuts turn t out of
`token_ids`: its user piece (rendered user message + assistant header) is
`[start, response_start)`, the generated response `[response_start,
response_end)`, and the tokens closing the assistant message run from
`response_end` to the next turn's start (or to the end). Everything before
`turn_spans[0][0]` is the system block.

Fields (all non-null unless marked nullable):

| field | Arrow type | meaning |
|---|---|---|
| trajectory_id | string | unique id of the trajectory (the writer uses the agent's `SingleAgentEpisode` id) |
| episode_id | string | id of the group episode; rows sharing it are the trajectories of one group |
| agent_id | string | the trajectory's agent in its group episode ("traj_0", ...) |
| group_id | int64 | StarPO group: trajectories with one group_id started from one initial state (GRPO normalises within it) |
| group_size | int32 | number of rows sharing this row's episode_id |
| env | string | registered env name |
| env_config | string | JSON object of the env's config overrides (`make_env(env, **json.loads(env_config))`) |
| seed | int64, nullable | seed the env was reset with |
| token_ids | list<int32> | the whole trajectory, as laid out above |
| loss_mask | list<int8> | 1 exactly on generated response tokens, else 0; as long as token_ids |
| sampling_logp | list<float32>, nullable | log-prob of each token under the policy that sampled it (0 off the loss mask); null when unknown, e.g. for demonstrations, which nobody sampled |
| turn_spans | list<list<int32>> | per turn `[start, response_start, response_end]`, see above |
| turn_rewards | list<float64> | reward of each turn |
| observations | list<string> | env state text: the initial state, then the state after each turn (turns + 1 entries) |
| response_texts | list<string> | each turn's response decoded (with any prefill put back), as the answer parser read it |
| turn_infos | list<string> | each turn's step info as a JSON object (parsed actions, validity, budget left, ...) |
| terminated | bool | the trajectory's RLlib episode flag: it ended in a terminal state (*) |
| truncated | bool | the trajectory's RLlib episode flag: a budget cut it (*) |
| success | bool | the env reported the task solved at the end |

(*) RLlib's `MultiAgentEpisode` sets both flags on every trajectory acting in
its group's last env step; `success` tells a solved task apart.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa

SCHEMA_VERSION = "1"


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One column: its name, Arrow type, nullability and meaning."""

    name: str
    type: pa.DataType
    description: str
    nullable: bool = False


FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("trajectory_id", pa.string(), "unique id of the trajectory"),
    FieldSpec("episode_id", pa.string(), "id of the group episode; rows sharing it form one group"),
    FieldSpec("agent_id", pa.string(), "the trajectory's agent in its group episode"),
    FieldSpec("group_id", pa.int64(), "StarPO group: one initial state; GRPO normalises within it"),
    FieldSpec("group_size", pa.int32(), "number of rows sharing this row's episode_id"),
    FieldSpec("env", pa.string(), "registered env name"),
    FieldSpec("env_config", pa.string(), "JSON object of the env's config overrides"),
    FieldSpec("seed", pa.int64(), "seed the env was reset with", nullable=True),
    FieldSpec("token_ids", pa.list_(pa.int32()), "system block, then per turn: user piece, response, closing tokens"),
    FieldSpec("loss_mask", pa.list_(pa.int8()), "1 exactly on generated response tokens"),
    FieldSpec(
        "sampling_logp",
        pa.list_(pa.float32()),
        "log-prob of each token under the sampling policy (0 off the mask); null when unknown",
        nullable=True,
    ),
    FieldSpec("turn_spans", pa.list_(pa.list_(pa.int32())), "per turn [start, response_start, response_end]"),
    FieldSpec("turn_rewards", pa.list_(pa.float64()), "reward of each turn"),
    FieldSpec("observations", pa.list_(pa.string()), "initial state text, then the state after each turn"),
    FieldSpec("response_texts", pa.list_(pa.string()), "each turn's decoded response (with prefill)"),
    FieldSpec("turn_infos", pa.list_(pa.string()), "each turn's step info as a JSON object"),
    FieldSpec("terminated", pa.bool_(), "episode flag: ended in a terminal state"),
    FieldSpec("truncated", pa.bool_(), "episode flag: cut by a budget"),
    FieldSpec("success", pa.bool_(), "the env reported the task solved at the end"),
)

FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in FIELDS)

TRAJECTORY_SCHEMA = pa.schema(
    [pa.field(f.name, f.type, nullable=f.nullable, metadata={"description": f.description}) for f in FIELDS],
    metadata={"rllib_ragen.trajectory_schema_version": SCHEMA_VERSION},
)
