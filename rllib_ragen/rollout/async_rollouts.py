"""Asynchronous rollouts with bounded staleness, on RLlib's async env-runner calls.

With `async_rollouts=True` the remote `LLMEnvRunner`s sample the next
iterations' groups while the learner updates, with the weights they last
received. `RunAheadShards` issues each iteration's seeds as one shard per
runner through `EnvRunnerGroup.foreach_env_runner_async` and collects finished
shards with `fetch_ready_async_reqs` (APPO/IMPALA's pattern). It runs ahead by at
most `max_staleness` iterations, so a group sampled under policy version `v` is
trained at version `v + max_staleness` at the latest; with `max_staleness=0` it
samples exactly what the synchronous loop samples, in the same order.

Before each weight sync the sampler waits for the shards in flight (an actor runs
its calls in order, so a weight load would queue behind them anyway); the
shards it has not issued yet are sampled after the sync, with the new weights.

Every group carries the policy version its runner held (its trajectories'
starts record it, set by the weight sync itself), so a runner that missed a broadcast
(say one restarted after a crash, which holds the initial weights) is seen in
its groups' version. A runner that dies loses only its shard in flight: the
groups already fetched stay, and its seeds are issued again to a healthy runner.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from ray.rllib.env.env_runner_group import EnvRunnerGroup
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from rllib_ragen.rollout.trajectory_record import policy_version
from rllib_ragen.sharding import split_contiguous

logger = logging.getLogger(__name__)

_SAMPLE_TAG = "rllib_ragen_async_sample"


@dataclasses.dataclass(frozen=True)
class AsyncRolloutSettings:
    """Whether and how far rollouts run ahead of the learner (set with `StarPOConfig.rollouts()`).

    Each field is documented where `StarPOConfig.rollouts()` sets it.
    """

    async_rollouts: bool = False
    max_staleness: int = 1

    def __post_init__(self) -> None:
        if int(self.max_staleness) < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")


# (first seed, its groups, the runner's metrics): what one shard's sample call returns.
ShardResult = tuple[int, list[MultiAgentEpisode], dict]


@dataclasses.dataclass(frozen=True)
class _Shard:
    batch: int
    seeds: list[int]


class RunAheadShards:
    """Keeps the remote env runners sampling an iteration's groups ahead of the learner.

    Args:
        env_runner_group: The remote `LLMEnvRunner`s.
        sample_call: ``sample_call(seeds)`` -> the function a runner runs for one
            shard (returns a `ShardResult`).
        shard_timeout_s: Seconds one shard may take on a runner before the wait
            for it fails (naming the runners).
    """

    def __init__(
        self,
        env_runner_group: EnvRunnerGroup,
        *,
        sample_call: Callable[[list[int]], Callable[[Any], ShardResult]],
        shard_timeout_s: float,
    ) -> None:
        self.runners = env_runner_group
        self.sample_call = sample_call
        self.shard_timeout_s = shard_timeout_s
        self._pending: collections.deque[_Shard] = collections.deque()
        self._in_flight: dict[int, _Shard] = {}  # runner id -> its shard
        self._finished: dict[int, list[ShardResult]] = collections.defaultdict(list)
        self._shards_per_batch: dict[int, int] = {}
        self.issued = 0  # batches issued (sampled, in flight or pending)
        self.consumed = 0  # batches handed to the learner
        self.reissued_shards = 0  # shards sampled again after their runner failed

    def next_batch(self, new_seeds: Callable[[], list[int]], *, run_ahead: int) -> list[ShardResult]:
        """The oldest batch not yet handed out, once all its shards are in.

        First issues batches (`new_seeds()` gives each one's seeds) until
        `run_ahead` batches after this one are issued too.
        """
        while self.issued <= self.consumed + run_ahead:
            self._add_batch(new_seeds())
        batch = self.consumed
        self._wait(lambda: len(self._finished[batch]) >= self._shards_per_batch[batch], f"batch {batch}")
        self.consumed += 1
        del self._shards_per_batch[batch]
        return sorted(self._finished.pop(batch), key=lambda result: result[0])

    def drain(self) -> None:
        """Waits for the shards in flight (keeping their groups); issues no new ones."""
        self._wait(lambda: not self._in_flight, "the shards in flight", dispatch=False)

    def _add_batch(self, seeds: list[int]) -> None:
        runners = max(len(self.runners.healthy_env_runner_ids()), 1)
        shards = [_Shard(self.issued, part) for part in split_contiguous(seeds, runners) if part]
        self._shards_per_batch[self.issued] = len(shards)
        self._pending.extend(shards)
        self.issued += 1
        self._dispatch()

    def _dispatch(self) -> None:
        """Gives each idle healthy runner the oldest pending shard."""
        idle = [i for i in self.runners.healthy_env_runner_ids() if i not in self._in_flight]
        assigned = [(runner, self._pending.popleft()) for runner in idle[: len(self._pending)]]
        if not assigned:
            return
        made = self.runners.foreach_env_runner_async(
            [self.sample_call(shard.seeds) for _, shard in assigned],
            tag=_SAMPLE_TAG,
            remote_worker_ids=[runner for runner, _ in assigned],
        )
        if made != len(assigned):
            raise RuntimeError(f"only {made} of {len(assigned)} idle env runners took a sample request")
        self._in_flight.update(assigned)

    def _wait(self, done: Callable[[], bool], what: str, *, dispatch: bool = True) -> None:
        deadline = time.monotonic() + self.shard_timeout_s
        while not done():
            if not self.runners.healthy_env_runner_ids():
                raise RuntimeError(f"no healthy remote env runner is left to sample {what}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"env runner(s) {sorted(self._in_flight)} did not finish sampling {what} "
                    f"within {self.shard_timeout_s} s"
                )
            self._fetch(timeout_s=min(remaining, 1.0))
            if dispatch:
                self._dispatch()

    def _fetch(self, *, timeout_s: float) -> None:
        """Collects finished shards; a failed runner's shard goes back to the front of the queue."""
        for runner, result in self.runners.fetch_ready_async_reqs(tags=_SAMPLE_TAG, timeout_seconds=timeout_s):
            self._finished[self._in_flight.pop(runner).batch].append(result)
        healthy = set(self.runners.healthy_env_runner_ids())
        for runner in [r for r in self._in_flight if r not in healthy]:
            shard = self._in_flight.pop(runner)
            logger.warning("env runner %d failed while sampling seeds %s; they are sampled again", runner, shard.seeds)
            self._pending.appendleft(shard)
            self.reissued_shards += 1


def policy_version_of(episode: MultiAgentEpisode) -> int:
    """The policy version that sampled a group (its first trajectory's)."""
    return policy_version(next(iter(episode.agent_episodes.values())))


def staleness_counts(staleness: list[int], *, max_staleness: int) -> dict[str, float]:
    """A histogram of group staleness: ``staleness_<s>`` for s in 0..max_staleness, ``staleness_over_max`` beyond."""
    counts = {f"staleness_{s}": 0.0 for s in range(max_staleness + 1)}
    counts["staleness_over_max"] = 0.0
    for value in staleness:
        key = f"staleness_{value}" if 0 <= value <= max_staleness else "staleness_over_max"
        counts[key] += 1
    return counts
