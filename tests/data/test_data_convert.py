"""Episodes <-> trajectory rows: exact round trips of real rollouts, and malformed rows named by row and field."""

from __future__ import annotations

import copy
import json

import numpy as np
import pyarrow as pa
import pytest
import torch

from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.data.convert import (
    TrajectoryRowError,
    episodes_to_rows,
    row_to_trajectory,
    rows_to_episodes,
    turn_spans,
)
from rllib_ragen.data.schema import FIELD_NAMES, TRAJECTORY_SCHEMA
from rllib_ragen.rollout.trajectory_record import response_text, trajectories_from_episodes
from rllib_ragen.training.token_batch import build_token_batch

pytestmark = pytest.mark.usefixtures("ray_session")  # conftest's: a local Ray for this module


@pytest.fixture(scope="module")
def rollouts(tiny_model_path):
    """Two groups of three real Sokoban trajectories sampled by LLMEnvRunner (HF engine, tiny model)."""
    config = (
        StarPOConfig()
        .environment("sokoban")
        .llm(model=str(tiny_model_path), critic="head")
        .rollouts(n_groups=2, group_size=3, max_turns=2, max_actions_per_turn=2, response_length=12)
        .inference(engine="hf")
        .starpo_evaluation(eval_interval=0)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        return algo.env_runner.sample()
    finally:
        algo.stop()


def _trajectory_view(episodes, history_window):
    return [
        (t.history.system_ids, t.history.training_rows(), t.turn_rewards, t.group_id)
        for t in trajectories_from_episodes(episodes, history_window=history_window)
    ]


def test_rows_follow_the_schema_and_cut_the_tokens_into_turns(rollouts):
    rows = episodes_to_rows(rollouts, env="sokoban", env_config={"dim_room": (6, 6)})
    assert len(rows) == 6 and all(set(row) == set(FIELD_NAMES) for row in rows)
    assert all(type(i) is int for row in rows for i in row["token_ids"])  # plain Python values
    # The rows are valid Arrow data of the documented schema.
    assert len(pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)) == 6
    for row, trajectory in zip(rows, trajectories_from_episodes(rollouts, history_window=None)):
        ids = row["token_ids"]
        turns = trajectory.history.answered_turns()
        assert row["turn_spans"] == turn_spans(trajectory.history)
        assert ids[: row["turn_spans"][0][0]] == trajectory.history.system_ids
        for (start, response_start, response_end), turn in zip(row["turn_spans"], turns):
            assert ids[start:response_start] == turn.user_ids
            assert ids[response_start:response_end] == turn.response_ids
            assert ids[response_end : response_end + len(turn.close_ids)] == turn.close_ids
        assert sum(row["loss_mask"]) == sum(len(t.response_ids) for t in turns)
        assert json.loads(row["env_config"]) == {"dim_room": [6, 6]}
        assert row["group_size"] == 3 and row["env"] == "sokoban"
    assert [row["seed"] for row in rows] == [10_000] * 3 + [10_001] * 3


def test_round_trip_keeps_tokens_masks_logprobs_rewards_and_layout(rollouts):
    rows = episodes_to_rows(rollouts, env="sokoban")
    restored = rows_to_episodes(rows)
    assert [e.id_ for e in restored] == [e.id_ for e in rollouts]
    for window in (None, 1):
        assert _trajectory_view(restored, window) == _trajectory_view(rollouts, window)
    original_batch = build_token_batch(trajectories_from_episodes(rollouts, history_window=None), pad_token_id=0)
    restored_batch = build_token_batch(trajectories_from_episodes(restored, history_window=None), pad_token_id=0)
    for name in ("input_ids", "generated_mask", "sampling_logp"):
        assert torch.equal(getattr(restored_batch, name), getattr(original_batch, name)), name
    for name in ("generated_mask", "turn_rewards", "turn_ends", "group_ids"):
        assert torch.equal(getattr(restored_batch.trajectories, name), getattr(original_batch.trajectories, name)), name
    assert original_batch.generated_mask.sum() > 0
    for original, back in zip(rollouts, restored):
        assert list(back.agent_episodes) == list(original.agent_episodes)
        assert back.env_t_to_agent_t == original.env_t_to_agent_t
        for agent, a in original.agent_episodes.items():
            b = back.agent_episodes[agent]
            assert b.id_ == a.id_
            assert b.get_observations() == a.get_observations()
            assert b.get_infos()[1:] == a.get_infos()[1:]
            assert (b.is_terminated, b.is_truncated) == (a.is_terminated, a.is_truncated)
            for t in range(len(a)):
                np.testing.assert_array_equal(b.get_extra_model_outputs("action_logp", t),
                                              a.get_extra_model_outputs("action_logp", t))
    # Converting again gives the very same rows.
    assert episodes_to_rows(restored, env="sokoban") == rows


def test_group_rows_may_come_in_any_order(rollouts):
    rows = episodes_to_rows(rollouts, env="sokoban")
    shuffled = [rows[i] for i in (4, 0, 5, 3, 2, 1)]
    restored = rows_to_episodes(shuffled)
    # Groups come out when complete (the second one first here), agents in order.
    assert [e.id_ for e in restored] == [rollouts[1].id_, rollouts[0].id_]
    assert _trajectory_view(restored[::-1], None) == _trajectory_view(rollouts, None)


def test_missing_trajectory_of_a_group_is_an_error(rollouts):
    rows = episodes_to_rows(rollouts, env="sokoban")
    with pytest.raises(ValueError, match=r"incomplete groups.*\(2 of 3\)"):
        rows_to_episodes(rows[:5])


def _corrupt(row, change):
    row = copy.deepcopy(row)
    change(row)
    return row


def _first_response_token(row):
    return row["turn_spans"][0][1]


MALFORMED = [
    (lambda r: r.pop("loss_mask"), "loss_mask", "is missing"),
    (lambda r: r.update(loss_mask=r["loss_mask"][:-1]), "loss_mask", "entries, but token_ids makes it"),
    (lambda r: r.update(sampling_logp=r["sampling_logp"] + [0.0]), "sampling_logp", "entries, but token_ids"),
    (lambda r: r.update(turn_rewards=r["turn_rewards"][:1]), "turn_rewards", "1 entries, but turn_spans makes it 2"),
    (lambda r: r.update(observations=r["observations"][:-1]), "observations", "but turn_spans makes it 3"),
    (lambda r: r.update(token_ids=[str(t) for t in r["token_ids"]]), "token_ids", "flat list of integers"),
    (lambda r: r.update(loss_mask=[bool(m) for m in r["loss_mask"]]), "loss_mask", "flat list of integers"),
    (lambda r: r.update(group_id="7"), "group_id", "must be integer, got str"),
    (lambda r: r.update(terminated=1), "terminated", "must be bool"),
    (lambda r: r.update(response_texts=[1, 2]), "response_texts", "list of strings"),
    (lambda r: r.update(turn_rewards=None), "turn_rewards", "is null"),
    (lambda r: r["loss_mask"].__setitem__(_first_response_token(r), 0), "loss_mask", "is 0 at token"),
    (lambda r: r["loss_mask"].__setitem__(0, 1), "loss_mask", "is 1 at token 0"),
    (lambda r: r["turn_spans"].reverse(), "turn_spans", "entry 1"),
    (lambda r: r.update(turn_spans=[]), "turn_spans", "is empty"),
    (lambda r: r["turn_infos"].__setitem__(1, "not json"), "turn_infos", "JSON objects"),
    (lambda r: r.update(group_size=0), "group_size", ">= 1"),
]


@pytest.mark.parametrize("change,field,message", MALFORMED, ids=[f"{m[1]}:{m[2][:20]}" for m in MALFORMED])
def test_malformed_row_names_row_and_field(rollouts, change, field, message):
    rows = episodes_to_rows(rollouts, env="sokoban")
    rows[2] = _corrupt(rows[2], change)
    with pytest.raises(TrajectoryRowError, match=message) as caught:
        rows_to_episodes(rows)
    assert caught.value.field == field
    assert f"row 2 (trajectory_id {rows[2]['trajectory_id']!r})" in str(caught.value)
    assert f"field {field!r}" in str(caught.value)


def test_row_errors_name_the_file_when_known(rollouts):
    row = dict(episodes_to_rows(rollouts, env="sokoban")[0], path="/data/rollouts.parquet", seed="x")
    expected = r"row 5 \(trajectory_id .*, file /data/rollouts.parquet\): field 'seed'"
    with pytest.raises(TrajectoryRowError, match=expected):
        row_to_trajectory(row, index=5)


def test_unknown_logprobs_are_stored_as_null_and_come_back_as_nan(rollouts):
    episode = copy.deepcopy(rollouts[0])
    for agent_episode in episode.agent_episodes.values():
        for t in range(len(agent_episode)):
            agent_episode.get_extra_model_outputs("action_logp", t)[:] = np.nan
    rows = episodes_to_rows([episode], env="sokoban")
    assert all(row["sampling_logp"] is None for row in rows)
    restored = rows_to_episodes(rows)[0]
    logp = restored.agent_episodes["traj_0"].get_extra_model_outputs("action_logp", 0)
    assert logp.dtype == np.float32 and np.isnan(logp).all()
    # Partly unknown log-probs are refused: a row is all-known or all-unknown.
    episode.agent_episodes["traj_0"].get_extra_model_outputs("action_logp", 0)[0] = -1.0
    with pytest.raises(ValueError, match="some response log-probs are NaN"):
        episodes_to_rows([episode], env="sokoban")


def test_response_text_of_every_turn_is_kept(rollouts):
    rows = episodes_to_rows(rollouts, env="sokoban")
    infos = rollouts[0].agent_episodes["traj_0"].get_infos()[1:]
    assert rows[0]["response_texts"] == [response_text(info) for info in infos]
    assert [json.loads(i)["parsed_actions"] for i in rows[0]["turn_infos"]] == [i["parsed_actions"] for i in infos]
