"""Asynchronous rollouts with bounded staleness, on RLlib's async env-runner calls.

With `async_rollouts=True` the remote `LLMEnvRunner`s sample the next
iterations' groups while the learner updates, with the weights they last
received. `AsyncGroupSampler` issues each iteration's seeds as one shard per
runner through `EnvRunnerGroup.foreach_env_runner_async` and collects finished
shards with `fetch_ready_async_reqs` (APPO/IMPALA's pattern). It runs ahead by at
most `max_staleness` iterations, so a group sampled under policy version `v` is
trained at version `v + max_staleness` at the latest; with `max_staleness=0` it
samples exactly what the synchronous loop samples, in the same order.

Before each weight sync the sampler waits for the shards in flight (an actor runs
its calls in order, so a weight load would queue behind them anyway); the
shards it has not issued yet are sampled after the sync, with the new weights.

Every group carries the policy version its runner held (`POLICY_VERSION` in its
reset infos, set by the weight sync itself), so a runner that missed a broadcast
(say one restarted after a crash, which holds the initial weights) is seen in
its groups' version. A runner that dies loses only its shard in flight: the
groups already fetched stay, and its seeds are issued again to a healthy runner.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

POLICY_VERSION = "policy_version"
_SAMPLE_TAG = "rllib_ragen_async_sample"


@dataclasses.dataclass(frozen=True)
class AsyncRollouts:
    """Whether and how far rollouts run ahead of the learner.

    Attributes:
        async_rollouts: Sample on the remote env runners while the learner updates.
        max_staleness: Most policy versions a trained group may lag the learner (>= 0).
    """

    async_rollouts: bool = False
    max_staleness: int = 1

    def __post_init__(self) -> None:
        if int(self.max_staleness) < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
