"""Parquet trajectories: episodes -> files -> Ray Data map_batches -> the same episodes; rollouts written by a run."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.data.convert import episodes_to_rows
from rllib_ragen.data.parquet import (
    TRAJECTORY,
    iter_group_episodes,
    map_to_trajectories,
    read_episodes,
    read_trajectories,
    rollout_file,
    write_trajectories,
)
from rllib_ragen.data.schema import TRAJECTORY_SCHEMA
from rllib_ragen.rollout.trajectory_record import trajectories_from_episodes


def sokoban_config(model_path) -> StarPOConfig:
    return (
        StarPOConfig()
        .environment("sokoban")
        .llm(model=str(model_path), critic="head")
        .rollouts(n_groups=2, group_size=2, max_turns=2, max_actions_per_turn=2, response_length=12)
        .inference(engine="hf")
        .training(mini_batch_size=4, micro_batch_size=2, actor_lr=1e-3, critic_lr=1e-3)
        .starpo_evaluation(eval_interval=0)
        .debugging(seed=0)
    )


@pytest.fixture(scope="module")
def rollouts(ray_session, tiny_model_path):
    algo = sokoban_config(tiny_model_path).build_algo()
    try:
        return algo.env_runner.sample()
    finally:
        algo.stop()


def _view(episodes):
    return [
        (t.history.training_rows(), t.turn_rewards, t.group_id)
        for t in trajectories_from_episodes(episodes, history_window=None)
    ]


def test_parquet_round_trip_through_ray_data_map_batches(rollouts, tmp_path):
    env_config = {"max_steps": 50}
    first = write_trajectories(rollouts[:1], tmp_path / "data" / "a.parquet", env="sokoban", env_config=env_config)
    write_trajectories(rollouts[1:], tmp_path / "data" / "b.parquet", env="sokoban")
    assert pq.read_schema(first).equals(TRAJECTORY_SCHEMA, check_metadata=False)
    assert pq.read_table(first).to_pylist() == episodes_to_rows(rollouts[:1], env="sokoban", env_config=env_config)
    # map_batches turns each row into its trajectory episode ...
    mapped = map_to_trajectories(read_trajectories(tmp_path / "data")).take_all()
    assert len(mapped) == 4 and all(isinstance(r[TRAJECTORY], SingleAgentEpisode) for r in mapped)
    # ... and the groups come back whole, token for token.
    restored = sorted(read_episodes(tmp_path / "data"), key=lambda e: [x.id_ for x in rollouts].index(e.id_))
    assert [e.id_ for e in restored] == [e.id_ for e in rollouts]
    assert _view(restored) == _view(rollouts)


def test_shuffled_rows_still_come_back_as_whole_groups(rollouts, tmp_path):
    write_trajectories(rollouts, tmp_path / "all.parquet", env="sokoban")
    mapped = map_to_trajectories(read_trajectories(tmp_path / "all.parquet")).materialize()

    def arrival(seed):
        shuffle = dict(batch_size=1, local_shuffle_buffer_size=4, local_shuffle_seed=seed)
        return [t.multi_agent_episode_id for b in mapped.iter_batches(**shuffle) for t in b[TRAJECTORY]], shuffle

    def interleaved(ids):
        return any(len(ids) - ids[::-1].index(x) - ids.index(x) != ids.count(x) for x in ids)

    # A shuffle seed whose order interleaves the two groups' rows.
    shuffle = next(s for ids, s in map(arrival, range(20)) if interleaved(ids))
    restored = list(iter_group_episodes(mapped, **shuffle))
    assert sorted(e.id_ for e in restored) == sorted(e.id_ for e in rollouts)
    by_id = {e.id_: e for e in restored}
    assert _view([by_id[e.id_] for e in rollouts]) == _view(rollouts)


def test_malformed_row_in_a_file_names_file_row_and_field(rollouts, tmp_path):
    rows = episodes_to_rows(rollouts, env="sokoban")
    rows[3]["loss_mask"] = rows[3]["loss_mask"][:-2]
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA), path)
    # Ray Data re-raises a worker's error as a RayError that carries its message.
    with pytest.raises(ray.exceptions.RayError) as caught:
        read_episodes(path)
    message = str(caught.value)
    assert "field 'loss_mask'" in message and "entries, but token_ids makes it" in message
    assert f"trajectory_id {rows[3]['trajectory_id']!r}" in message and str(path) in message


def test_wrongly_typed_column_is_named(rollouts, tmp_path):
    rows = episodes_to_rows(rollouts, env="sokoban")
    for row in rows:
        row["token_ids"] = [str(t) for t in row["token_ids"]]
    path = tmp_path / "strings.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)  # no schema: token_ids become list<string>
    with pytest.raises(ray.exceptions.RayError, match=r"field 'token_ids' must be a flat list of integers"):
        read_episodes(path)


def test_starpo_run_writes_rollouts_every_n_iterations(ray_session, tiny_model_path, tmp_path):
    algo = sokoban_config(tiny_model_path).rollout_recording(
        rollout_parquet_dir=str(tmp_path / "rollouts"), write_rollouts_every=2
    ).build_algo()
    sampled = []
    sample = algo.env_runner.sample
    algo.env_runner.sample = lambda **kw: sampled.append(sample(**kw)) or sampled[-1]
    try:
        for _ in range(2):
            algo.train()
    finally:
        algo.stop()
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == [rollout_file(".", 2).name]
    # The file holds every group sampled in iteration 2 (before the StarPO-S filter), exactly.
    restored = read_episodes(rollout_file(tmp_path / "rollouts", 2))
    assert sorted(e.id_ for e in restored) == sorted(e.id_ for e in sampled[1])
    by_id = {e.id_: e for e in restored}
    assert _view([by_id[e.id_] for e in sampled[1]]) == _view(sampled[1])


def test_recording_knob_is_validated(tiny_model_path):
    with pytest.raises(ValueError, match="write_rollouts_every must be >= 1"):
        sokoban_config(tiny_model_path).rollout_recording(write_rollouts_every=0)
