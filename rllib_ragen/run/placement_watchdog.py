"""`PlacementWatchdog`: ends a sweep whose actor waits too long for resources, naming it.

An actor Ray cannot place (its trial's placement group, or the cluster, has no room for
it) waits without a word: no error, no timeout, an idle CPU. The watchdog, a Tune
callback in the driver, reads the actor table every few seconds and raises
`ActorPlacementTimeoutError` once an actor of this job has waited for a worker longer
than the timeout. An actor that is placed but still starting (loading a model) has a
worker process already and is not counted: its own start timeout covers it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray
from ray import tune
from ray.tune.experiment import Trial

from rllib_ragen.rllib_private import actor_table
from rllib_ragen.run.trial_resources import describe_placement

# Long enough for an actor to wait for a trial that is ending; far shorter than a model load.
DEFAULT_PLACEMENT_TIMEOUT_S = 120.0

# How often the actor table is read: cheap, and far below any sensible timeout.
POLL_INTERVAL_S = 2.0


class ActorPlacementTimeoutError(RuntimeError):
    """An actor of the sweep waited longer than the placement timeout for resources."""


class PlacementWatchdog(tune.Callback):
    """Raises `ActorPlacementTimeoutError` (ending `Tuner.fit`) when an actor of this job has
    waited more than `timeout_s` to be placed.

    Args:
        timeout_s: Seconds an actor may wait for a worker (its resources).
        clock: Monotonic seconds (a test's clock).
        actors: Reads the actor table (`rllib_private.actor_table`).
    """

    def __init__(
        self,
        *,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        actors: Callable[[], list[dict[str, Any]]] = actor_table,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"the placement timeout must be > 0 s, got {timeout_s}")
        self.timeout_s = timeout_s
        self._clock = clock
        self._actors = actors
        self._waiting_since: dict[str, float] = {}
        self._next_poll = 0.0

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        now = self._clock()
        if now >= self._next_poll:
            self._next_poll = now + POLL_INTERVAL_S
            self.check(trials)

    def check(self, trials: Sequence[Trial]) -> None:
        """Reads the actor table once; raises for an actor waiting past the timeout."""
        now, table = self._clock(), self._actors()
        job = ray.get_runtime_context().get_job_id()
        unplaced = {actor["ActorID"]: actor for actor in table if actor["JobID"] == job and _unplaced(actor)}
        self._waiting_since = {key: self._waiting_since.get(key, now) for key in unplaced}
        for key, since in self._waiting_since.items():
            if now - since > self.timeout_s:
                raise ActorPlacementTimeoutError(self._message(unplaced[key], table, trials, waited=now - since))

    def _message(
        self, actor: Mapping[str, Any], table: Sequence[Mapping[str, Any]], trials: Sequence[Trial], *, waited: float
    ) -> str:
        # A trial whose algorithm is still starting (waiting for the actor) is PENDING to Tune.
        live = [t for t in trials if t.status in (Trial.PENDING, Trial.RUNNING)]
        reserved = (
            "; ".join(
                f"trial {t.trial_id} ({t.status}) reserves {describe_placement(t.placement_group_factory)}"
                for t in live
            )
            or "no trial is live"
        )
        return (
            f"actor {owner_chain(actor, table)} waited {waited:.0f} s for resources "
            f"(more than the placement timeout, {self.timeout_s:g} s) and was never placed; {reserved}. "
            "An actor inside a trial must fit its trial's placement group (see `ray status`)"
        )


def _unplaced(actor: Mapping[str, Any]) -> bool:
    """Waiting for resources: pending creation, and no worker process leased yet."""
    return actor["State"] == "PENDING_CREATION" and not actor.get("Pid")


def owner_chain(actor: Mapping[str, Any], table: Sequence[Mapping[str, Any]]) -> str:
    """`VLLMEngineActor (started by StarPO)`: the actor's class and those of the actors that started it."""
    by_address = {_address(a["Address"]): a for a in table if a["Address"].get("Port")}
    owners: list[str] = []
    owner = by_address.get(_address(actor["OwnerAddress"]))
    while owner is not None and len(owners) < len(table):
        owners.append(owner["ActorClassName"])
        owner = by_address.get(_address(owner["OwnerAddress"]))
    started_by = f" (started by {' <- '.join(owners)})" if owners else ""
    return f"{actor['ActorClassName']}{started_by}"


def _address(address: Mapping[str, Any]) -> tuple[str, int]:
    return address.get("IPAddress", ""), int(address.get("Port", 0))
