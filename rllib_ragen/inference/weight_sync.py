"""How new policy weights reach the engine actors: the seam behind `update_weights`.

`ObjectStoreWeightSync` (CPU, one node): the weights are put in Ray's object store
once, as zero-copy numpy arrays, and every actor loads from the same reference.
A GPU strategy (an NCCL broadcast from the learner's rank 0 into the engines'
workers) subclasses `WeightSync` with the same two calls; the pool does not change.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence

import ray
from ray.actor import ActorHandle
from torch import Tensor

from rllib_ragen.inference.weights import PackedWeights, pack_weights


class WeightSync(abc.ABC):
    """Moves HF-named weights into engine actors (each has `load_weights`)."""

    @abc.abstractmethod
    def broadcast(self, actors: Sequence[ActorHandle], state_dict: Mapping[str, Tensor]) -> list[ray.ObjectRef]:
        """Starts loading `state_dict` into every actor; one ref per actor (its load seconds)."""

    @abc.abstractmethod
    def restore(self, actor: ActorHandle) -> ray.ObjectRef | None:
        """Starts loading the last broadcast weights into a new actor; None if none were sent."""


class ObjectStoreWeightSync(WeightSync):
    """Ray object store: `ray.put` once, every actor reads the same zero-copy arrays.

    The last weights stay pinned in the object store (one model copy) so that a
    restarted actor can be brought up to date without the learner.
    """

    def __init__(self) -> None:
        self._latest: ray.ObjectRef | None = None
        self.last_nbytes = 0

    def broadcast(self, actors: Sequence[ActorHandle], state_dict: Mapping[str, Tensor]) -> list[ray.ObjectRef]:
        packed: PackedWeights = pack_weights(state_dict)
        self._latest = ray.put(packed)
        self.last_nbytes = packed.nbytes
        return [actor.load_weights.remote(self._latest) for actor in actors]

    def restore(self, actor: ActorHandle) -> ray.ObjectRef | None:
        return None if self._latest is None else actor.load_weights.remote(self._latest)
