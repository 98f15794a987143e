"""Weight broadcast over a torch.distributed process group: learner (rank 0) -> engine processes.

vLLM 0.32 has its own weight transfer (`LLM.init_weight_transfer_engine` /
`update_weights`), but its backends ("nccl" through pynccl, "ipc" through CUDA
IPC, ...) all need CUDA, so CI could never run them, and their receive side calls
`model.load_weights`, which misses the CPU backend's tied-head repack (see
`vllm_reload`). So the transport here is a standalone torch process group:
`ProcessGroupNCCL` on GPU, `ProcessGroupGloo` on CPU (the only difference), over a
TCPStore the driver hosts, apart from the default group vLLM (and DDP learners)
initialise. Engines load what they receive through vLLM's `collective_rpc`.

Rank 0 holds the learner's tensors; ranks 1.. are engine processes. Tensors travel
in their own dtype (bfloat16 stays bfloat16), in flat per-dtype buckets, one
broadcast each. Every wait has a deadline, so a member that stalls or dies makes
the others raise within the sync's timeout; the driver then starts a new
generation of the group for the next sync.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import time
from collections.abc import Hashable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

BACKENDS = ("gloo", "nccl")
# Bounds the extra memory of a send (one flattened bucket at a time) and the size of one op.
BUCKET_BYTES = 256 * 2**20
_STORE_PREFIX = "rllib_ragen/weight_sync"


@dataclasses.dataclass(frozen=True)
class TensorLayout:
    """Names, shapes and dtypes of the broadcast tensors, and how they are grouped into buckets.

    Attributes:
        names: HF parameter names, in the sender's order.
        shapes: Shape of each tensor.
        dtypes: torch dtype name of each tensor ("bfloat16", ...).
        buckets: Indices of the tensors sent together as one flat buffer (one dtype each).
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    buckets: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, pairs: Sequence[tuple[str, Tensor]], *, bucket_bytes: int = BUCKET_BYTES) -> TensorLayout:
        """The layout of (name, tensor) pairs; a bucket holds one dtype and at most `bucket_bytes`
        (a larger tensor gets a bucket of its own)."""
        buckets: list[list[int]] = []
        sizes: list[int] = []
        open_bucket: dict[torch.dtype, int] = {}
        for index, (_, tensor) in enumerate(pairs):
            nbytes = tensor.numel() * tensor.element_size()
            bucket = open_bucket.get(tensor.dtype)
            if bucket is None or (sizes[bucket] and sizes[bucket] + nbytes > bucket_bytes):
                bucket = open_bucket[tensor.dtype] = len(buckets)
                buckets.append([])
                sizes.append(0)
            buckets[bucket].append(index)
            sizes[bucket] += nbytes
        return cls(
            names=tuple(name for name, _ in pairs),
            shapes=tuple(tuple(tensor.shape) for _, tensor in pairs),
            dtypes=tuple(str(tensor.dtype).removeprefix("torch.") for _, tensor in pairs),
            buckets=tuple(tuple(bucket) for bucket in buckets),
        )

    @property
    def nbytes(self) -> int:
        return sum(math.prod(shape) * getattr(torch, dtype).itemsize for shape, dtype in zip(self.shapes, self.dtypes))


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """How to join one generation of the weight-sync group; every member gets the same spec.

    Attributes:
        host: Address of the driver's TCPStore.
        port: Its port.
        generation: Bumped whenever the members change or a sync failed; a member
            holding an older generation's group builds a new one.
        world_size: 1 (the learner) + the number of engine processes.
        backend: "gloo" (CPU tensors) or "nccl" (CUDA tensors).
        timeout_s: Seconds a member waits for the others, per sync.
    """

    host: str
    port: int
    generation: int
    world_size: int
    backend: str
    timeout_s: float


class GroupHost:
    """The driver's side: hosts the TCPStore and decides which generation of the group is current.

    Args:
        host: Address the members reach the driver at.
        timeout_s: Seconds members wait for each other (and for the store).
    """

    def __init__(self, *, host: str, timeout_s: float) -> None:
        self.host, self.timeout_s = host, timeout_s
        self._store = dist.TCPStore(host, 0, None, True, datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
        self.generation = 0
        self._members: Hashable | None = None

    def spec(self, members: Hashable, *, world_size: int, backend: str) -> GroupSpec:
        """The group for `members` (any hashable description of the engine processes)."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if members != self._members:
            self.generation += 1
            self._members = members
        return GroupSpec(self.host, self._store.port, self.generation, world_size, backend, self.timeout_s)

    def invalidate(self) -> None:
        """After a failed sync: the next `spec` starts a new generation, whoever the members are."""
        self._members = None


# This process's group per store: (host, port) -> (generation, rank, group). Like
# torch.distributed's default group, it lives as long as the process; a new
# generation replaces it.
_MEMBERSHIPS: dict[tuple[str, int], tuple[int, int, dist.ProcessGroup]] = {}


def send(spec: GroupSpec, tensors: Sequence[Tensor], layout: TensorLayout) -> None:
    """Rank 0: broadcasts `tensors` (in `layout`'s order) to every other member.

    Raises:
        TimeoutError: a broadcast did not complete within `spec.timeout_s`.
        RuntimeError: a member left (gloo/NCCL report it).
    """
    deadline = time.monotonic() + spec.timeout_s
    group = _group(spec, rank=0)
    device = _device(spec)
    for number, bucket in enumerate(layout.buckets):
        parts = [tensors[index].reshape(-1) for index in bucket]
        flat = (parts[0] if len(parts) == 1 else torch.cat(parts)).to(device).contiguous()
        _wait(group.broadcast(flat, 0), spec, deadline, f"sending bucket {number + 1}/{len(layout.buckets)}")


def receive(spec: GroupSpec, rank: int, layout: TensorLayout) -> list[tuple[str, Tensor]]:
    """Rank `rank` >= 1: receives the broadcast; returns (name, tensor) views of the received buffers.

    Raises:
        TimeoutError: the broadcast did not complete within `spec.timeout_s`.
    """
    if rank < 1:
        raise ValueError(f"receivers have rank >= 1 (rank 0 sends), got {rank}")
    deadline = time.monotonic() + spec.timeout_s
    group = _group(spec, rank=rank)
    device = _device(spec)
    pairs: list[tuple[str, torch.Tensor]] = []
    for number, bucket in enumerate(layout.buckets):
        numels = [math.prod(layout.shapes[index]) for index in bucket]
        flat = torch.empty(sum(numels), dtype=getattr(torch, layout.dtypes[bucket[0]]), device=device)
        _wait(group.broadcast(flat, 0), spec, deadline, f"receiving bucket {number + 1}/{len(layout.buckets)}")
        pairs.extend(
            (layout.names[index], part.view(layout.shapes[index])) for index, part in zip(bucket, flat.split(numels))
        )
    return pairs


def _group(spec: GroupSpec, *, rank: int) -> dist.ProcessGroup:
    """This process's group for `spec` (joined once per generation; joining waits for every member)."""
    key = (spec.host, spec.port)
    held = _MEMBERSHIPS.get(key)
    if held is not None and held[:2] == (spec.generation, rank):
        return held[2]
    _MEMBERSHIPS.pop(key, None)
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    client = dist.TCPStore(spec.host, spec.port, is_master=False, timeout=timeout)
    store = dist.PrefixStore(f"{_STORE_PREFIX}/{spec.generation}", client)
    # torch's stubs make ProcessGroupGloo/NCCL Backends, not ProcessGroups; at runtime they act as groups.
    group: Any
    if spec.backend == "gloo":
        group = dist.ProcessGroupGloo(store, rank, spec.world_size, timeout)
    else:
        if not dist.is_nccl_available():
            raise RuntimeError("weight sync backend 'nccl' needs a CUDA build of torch; this one has no NCCL")
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(store, rank, spec.world_size, options)
    _MEMBERSHIPS[key] = (spec.generation, rank, group)
    return group


def _device(spec: GroupSpec) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if spec.backend == "nccl" else torch.device("cpu")


def _wait(work: dist.Work, spec: GroupSpec, deadline: float, step: str) -> None:
    """Waits for a collective op until `deadline`, polling: NCCL's `wait()` would not block the CPU."""
    while not work.is_completed():
        if time.monotonic() > deadline:
            # A hung NCCL communicator stays in flight until aborted; a gloo op ends at its own
            # timeout (the same one), and its group is replaced by the next generation.
            if spec.backend == "nccl":
                _MEMBERSHIPS.pop((spec.host, spec.port))[2].abort()
            raise TimeoutError(f"{step} of generation {spec.generation} did not complete within {spec.timeout_s} s")
        time.sleep(0.001)
    work.wait()  # raises the op's own error, e.g. a member that left
