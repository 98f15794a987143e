"""Trajectory Parquet files: write rollouts, read a dataset back as group episodes with Ray Data.

Writing happens where the episodes are (the driver), one file per call, with
pyarrow. Reading is a Ray Data pipeline:

    read_parquet (one row per trajectory)
    -> map_batches(trajectories_from_batch): each row checked and turned into
       its trajectory's SingleAgentEpisode, in parallel
    -> iter_batches on the driver -> GroupAssembler: the group episodes
       (MultiAgentEpisode), each once all its trajectories arrived

Batches may cut a group anywhere, so trajectories become episodes in the map
and groups are assembled after it, without a shuffle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray.data
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from rllib_ragen.checks import check_at_least_one
from rllib_ragen.data.convert import GroupAssembler, episodes_to_rows, row_to_trajectory
from rllib_ragen.data.schema import TRAJECTORY_SCHEMA


@dataclasses.dataclass(frozen=True)
class RecordingSettings:
    """Writing sampled rollouts to Parquet (set with `StarPOConfig.rollout_recording()`).

    Each field is documented where `StarPOConfig.rollout_recording()` sets it.
    """

    rollout_parquet_dir: str | None = None
    write_rollouts_every: int = 1

    def __post_init__(self) -> None:
        check_at_least_one(self, "write_rollouts_every")


TRAJECTORY = "trajectory"
GROUP_SIZE = "group_size"


def write_trajectories(
    episodes: Iterable[MultiAgentEpisode],
    path: str | Path,
    *,
    env: str,
    env_config: Mapping[str, Any] | None = None,
) -> Path:
    """Writes group episodes to one Parquet file in `TRAJECTORY_SCHEMA` (parent dirs created)."""
    rows = episodes_to_rows(episodes, env=env, env_config=env_config)
    if not rows:
        raise ValueError(f"no trajectories to write to {path}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA), path)
    return path


def rollout_file(directory: str | Path, iteration: int) -> Path:
    """Where the rollouts of training iteration `iteration` (1-based) go."""
    return Path(directory) / f"rollouts-iter{iteration:06d}.parquet"


def write_rollouts(
    episodes: Iterable[MultiAgentEpisode],
    directory: str | Path,
    *,
    iteration: int,
    env: str,
    env_config: Mapping[str, Any] | None = None,
) -> Path:
    """Writes one iteration's rollouts to `rollout_file(directory, iteration)`."""
    return write_trajectories(episodes, rollout_file(directory, iteration), env=env, env_config=env_config)


def trajectories_from_batch(batch: pa.Table) -> dict[str, np.ndarray]:
    """`map_batches` function: rows [N] -> trajectory episodes [N] and their group sizes [N].

    Raises `TrajectoryRowError` (row and field named) on a malformed row.
    """
    rows = batch.to_pylist()
    trajectories = np.empty(len(rows), dtype=object)
    for index, row in enumerate(rows):
        trajectories[index] = row_to_trajectory(row, index=index)
    return {TRAJECTORY: trajectories, GROUP_SIZE: np.asarray([row[GROUP_SIZE] for row in rows], dtype=np.int64)}


def read_trajectories(path: str | Path | list[str]) -> ray.data.Dataset:
    """A Parquet file, directory or list of files as a dataset of trajectory rows.

    Each row also carries the `path` it came from, so that row errors name the file.
    """
    source = [str(p) for p in path] if isinstance(path, list) else str(path)
    return ray.data.read_parquet(source, include_paths=True)


def map_to_trajectories(dataset: ray.data.Dataset, **map_batches_kwargs: Any) -> ray.data.Dataset:
    """Rows -> trajectory episodes with `map_batches` (kwargs go to `map_batches`)."""
    return dataset.map_batches(trajectories_from_batch, batch_format="pyarrow", **map_batches_kwargs)


def iter_group_episodes(
    trajectories: ray.data.Dataset, *, batch_size: int | None = None, **iter_batches_kwargs: Any
) -> Iterator[MultiAgentEpisode]:
    """Group episodes of a mapped dataset (see `map_to_trajectories`), one pass.

    Args:
        trajectories: The mapped dataset.
        batch_size: Rows fetched at a time (None: whole blocks).
        iter_batches_kwargs: More arguments of `Dataset.iter_batches` (e.g. a local shuffle buffer).

    Raises ValueError at the end of the pass if a group is missing trajectories.
    """
    assembler = GroupAssembler()
    for batch in trajectories.iter_batches(batch_size=batch_size, batch_format="numpy", **iter_batches_kwargs):
        for trajectory, group_size in zip(batch[TRAJECTORY], batch[GROUP_SIZE]):
            group = assembler.add(trajectory, int(group_size))
            if group is not None:
                yield group
    assembler.finish()


def read_episodes(path: str | Path | list[str]) -> list[MultiAgentEpisode]:
    """All group episodes stored under `path`."""
    return list(iter_group_episodes(map_to_trajectories(read_trajectories(path))))
