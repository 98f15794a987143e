"""StarPO's one weight path: the learner's policy weights into every rollout engine.

RLlib's `env_runner_group.sync_weights` (module state -> numpy -> object store ->
each runner's `set_state`) is not used for this: its numpy conversion has no
bfloat16 (and turns float16 into float32), it ships the whole module to every
runner, and engine actors are not runners. `PolicyWeightSync` takes the learner's
HF-named tensors (tied ones once, see `weights.unique_weights`) and moves them
with the transport `EngineSettings.weight_sync` names:

- "object_store": packed once (`pack_weights`: bfloat16 as int16 views, never
  through float32), one `ray.put`, and every engine of every env runner loads
  the same zero-copy arrays. With remote learners, learner rank 0 packs and puts.
- "collective": a broadcast from the learner's process (rank 0) into every engine
  process over one torch.distributed group (`collective`: NCCL on GPU, gloo on
  CPU). The group is re-formed when an engine was replaced or a sync failed.

A LoRA policy sends its merged weights, or, when the engines serve its adapter
(`EngineSettings.serves_adapter`), the adapter tensors alone, over either transport.

An engine in the learner's own process (engine="hf" on the local env runner with
the local learner) takes the tensors directly under either transport. After a
sync, `check` scores a fixed probe continuation on every engine and on the
learner: their largest log-prob difference is the end-to-end test of the sync
(stale weights, e.g. a tied LM head that missed the update, show up there).
Every step has a deadline from `EngineSettings`; a miss raises `EngineTimeoutError`
naming the engine (or env runner) and the step.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from collections.abc import Callable
from typing import Any

import ray
import torch
import torch.distributed as dist
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.env.env_runner_group import EnvRunnerGroup
from torch import Tensor

from rllib_ragen.inference.collective import GroupHost, GroupSpec, TensorLayout, send
from rllib_ragen.inference.engine import EngineTimeoutError, InferenceEngine, pack_weights, unique_weights
from rllib_ragen.inference.engine_settings import EngineSettings
from rllib_ragen.logits import token_logprobs
from rllib_ragen.lora import LoraSettings

# The probe scored after every sync: fixed random token ids (no text, no tokenizer needed).
PROBE_PROMPT_TOKENS = 24
PROBE_CONTINUATION_TOKENS = 8
_LOAD_STEP = "loading weights (object store)"
_RECEIVE_STEP = "receiving weights (collective)"


@dataclasses.dataclass(frozen=True)
class SyncReport:
    """What one sync moved.

    Attributes:
        seconds: Wall time of the transfer into every engine (the check not included).
        nbytes: Bytes of the policy weights sent (tied tensors once, in their own dtype).
    """

    seconds: float
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Payload:
    """What the learner sends.

    Attributes:
        adapter: The LoRA adapter the engines serve, instead of the (merged) weights.
        dtype: The engines' weight dtype where it is narrower than the learner's floats
            (`wire_dtype`), else None (sent as they are).
    """

    adapter: bool
    dtype: torch.dtype | None


def wire_dtype(config: EngineSettings, *, adapter: bool) -> torch.dtype | None:
    """The dtype weights travel in: the engines' own half-precision dtype, so that no engine receives
    float32 bytes only to round them; None (as they are) for "auto", float32 and a served adapter (`adapter`)."""
    if adapter or config.dtype not in ("bfloat16", "float16"):
        return None
    return getattr(torch, config.dtype)


class PolicyWeightSync:
    """Moves the learner's policy weights into the engines of every env runner.

    Args:
        config: The engines' settings (`weight_sync`, its timeout, the call timeout).
        lora: The policy's LoRA settings: with `config.serves_adapter(lora)` a sync sends the adapter only.
        learner_group: Where the policy is trained (local, or remote learners).
        env_runner_group: The runners whose engines receive the weights (the local
            runner, or remote runners).
    """

    def __init__(
        self,
        *,
        config: EngineSettings,
        lora: LoraSettings,
        learner_group: LearnerGroup,
        env_runner_group: EnvRunnerGroup,
    ) -> None:
        self.config = config
        self.learner_group, self.env_runner_group = learner_group, env_runner_group
        self._host = None
        if config.weight_sync == "collective":
            self._host = GroupHost(host=ray.util.get_node_ip_address(), timeout_s=config.weight_sync_timeout_s)
            engine = self._local_engine
            if engine is not None and not engine.in_process:
                # The pool is in the driver, which can run a sync: a replaced actor gets one.
                engine.resync = self.sync
        self._syncs = itertools.count()
        # What the learner sends: the engines' weights, or the LoRA adapter they serve.
        adapter = config.serves_adapter(lora)
        self._payload = Payload(adapter=adapter, dtype=wire_dtype(config, adapter=adapter))
        self._policy_tensors = functools.partial(_policy_tensors, payload=self._payload)
        self._probe: tuple[list[int], list[int]] | None = None
        # Every engine's probe log-probs at the last `check` (after a sync: what the synced weights score).
        self.engine_scores: list[list[float]] = []

    @property
    def _local_engine(self) -> InferenceEngine | None:
        runner = self.env_runner_group.local_env_runner
        return None if runner is None else runner.engine

    def sync(self, *, version: int | None = None) -> SyncReport:
        """Loads the learner's current policy weights into every engine.

        Args:
            version: The policy version of these weights; each env runner whose
                engines received them takes it as its `policy_version` (with the
                load itself, so a runner the weights missed keeps its old one).
                None leaves the runners' versions as they are (a re-sync).
        """
        start = time.perf_counter()
        nbytes = self._sync_collective(version) if self._host is not None else self._sync_object_store(version)
        runner = self.env_runner_group.local_env_runner
        if runner is not None and version is not None:
            runner.policy_version = version
        return SyncReport(time.perf_counter() - start, nbytes)

    def check(self) -> float:
        """Largest |log-prob| difference between the learner and any engine on the probe continuation."""
        if self._probe is None:
            vocab_size = self._on_learner(_vocab_size, "reading the vocabulary size")
            ids = torch.randint(
                3,
                vocab_size,
                (PROBE_PROMPT_TOKENS + PROBE_CONTINUATION_TOKENS,),
                generator=torch.Generator().manual_seed(0),
            ).tolist()
            self._probe = ids[:PROBE_PROMPT_TOKENS], ids[PROBE_PROMPT_TOKENS:]
        prompt, continuation = self._probe
        reference = self._on_learner(
            functools.partial(_learner_logprobs, prompt=prompt, continuation=continuation), "scoring the probe"
        )
        scored = [] if self._local_engine is None else self._local_engine.score_each(prompt, continuation)
        runner_scores = self._on_remote_runners(
            functools.partial(_score_each_on_runner, prompt=prompt, continuation=continuation),
            "scoring the weight-sync probe",
            "call_timeout_s",
        )
        scored += [each for _, per_runner in runner_scores for each in per_runner]
        self.engine_scores = scored
        return max(abs(a - b) for each in scored for a, b in zip(each, reference, strict=True))

    def close(self) -> None:
        """Releases the collective group's store (the engines stay)."""
        engine = self._local_engine
        if engine is not None and engine.resync == self.sync:
            engine.resync = None
        self._host = None

    # ------------------------------------------------------------------ transports
    def sync_snapshot(self, engine: str) -> SyncReport:
        """Loads the learner's current policy into each env runner's snapshot engine named `engine` (a runner
        attribute, e.g. `SelfPlayEnvRunner.league_engine`; runners without one are left alone).

        Always through Ray's object store, whatever `weight_sync` is: a snapshot is refreshed rarely, and
        only the rollout engines are members of the collective group. The runners' policy versions stay.
        """
        start = time.perf_counter()
        ref, nbytes = self._policy_ref()
        load = functools.partial(_load_snapshot_on_runner, ref=ref, engine=engine)
        runner = self.env_runner_group.local_env_runner
        if runner is not None:
            load(runner)
        self._on_remote_runners(load, f"loading the {engine} snapshot (object store)", "weight_sync_timeout_s")
        return SyncReport(time.perf_counter() - start, nbytes)

    def _policy_ref(self) -> tuple[ray.ObjectRef, int]:
        """The learner's policy weights packed in Ray's object store (a remote learner packs them itself)."""
        if self.learner_group.is_local:
            packed = pack_weights(self._on_learner(self._policy_tensors, "reading the policy weights"))
            return ray.put(packed), packed.nbytes
        return self._on_learner(functools.partial(_put_policy, payload=self._payload), "packing the policy weights")

    def _sync_object_store(self, version: int | None) -> int:
        engine = self._local_engine
        if self.learner_group.is_local and engine is not None and engine.in_process:
            tensors = self._on_learner(self._policy_tensors, "reading the policy weights")
            engine.update_weights(tensors)
            return sum(t.numel() * t.element_size() for _, t in unique_weights(tensors))
        ref, nbytes = self._policy_ref()
        if engine is not None:
            engine.load_packed(ref)
        self._on_remote_runners(
            functools.partial(_load_on_runner, ref=ref, version=version), _LOAD_STEP, "weight_sync_timeout_s"
        )
        return nbytes

    def _sync_collective(self, version: int | None) -> int:
        engine = self._local_engine
        if self.learner_group.is_local:
            pairs = unique_weights(self._on_learner(self._policy_tensors, "reading the policy weights"))
            if engine is not None and engine.in_process:
                engine.update_weights(dict(pairs))
                return TensorLayout.of(pairs).nbytes
            layout, device = TensorLayout.of(pairs), pairs[0][1].device
        else:
            pairs = None
            layout, device = self._on_learner(
                functools.partial(_policy_layout, payload=self._payload), "reading the policy layout"
            )
        members = self._members()
        backend = "nccl" if device.type == "cuda" and self.config.num_gpus_per_engine > 0 else "gloo"
        host = self._host
        assert host is not None, "sync runs the collective path only with a group host"
        spec = host.spec(tuple(members), world_size=1 + sum(count for _, count, _ in members), backend=backend)
        try:
            self._broadcast(spec, layout, members, pairs, version)
        except BaseException:
            host.invalidate()
            raise
        return layout.nbytes

    def _broadcast(
        self, spec: GroupSpec, layout: TensorLayout, members: list, pairs: list | None, version: int | None
    ) -> None:
        """Starts every receiver, sends from the learner, then waits for the receivers (they name a stall)."""
        engine, remote = self._local_engine, [m for m in members if m[0] > 0]
        wait_local = None if engine is None else engine.start_receive(spec, 1, layout)
        local_ranks = sum(count for index, count, _ in members if index == 0)
        wait_remote = self._start_remote_receives(spec, layout, remote, 1 + local_ranks, version) if remote else None
        try:
            if pairs is not None:
                send(spec, [tensor for _, tensor in pairs], layout)
            else:
                self._on_learner(
                    functools.partial(_send_from_learner, payload=self._payload, spec=spec, layout=layout),
                    "sending weights",
                )
            send_error = None
        except Exception as error:  # raised after the receivers' own errors, which name the engine
            send_error = error
        if wait_local is not None:
            wait_local()
        if wait_remote is not None:
            wait_remote()
        if send_error is not None:
            raise send_error

    def _members(self) -> list[tuple[int, int, int]]:
        """(runner index, engine processes, their identity) per runner (0 = local), dead engines replaced."""
        engine = self._local_engine
        members = [] if engine is None else [(0, *engine.weight_receivers())]
        members += [
            (index, *receivers)
            for index, receivers in self._on_remote_runners(
                _receivers_on_runner, "the liveness check before a weight sync", "weight_sync_timeout_s"
            )
        ]
        return members

    def _start_remote_receives(
        self, spec: GroupSpec, layout: TensorLayout, members: list, first_rank: int, version: int | None
    ) -> Callable[[], None]:
        """Every remote runner's engines join the broadcast (asynchronously); returns the wait for them.

        Runner i's engines take the ranks after runner i-1's, from `first_rank` on.
        """
        deadline = time.monotonic() + self.config.weight_sync_timeout_s
        tag = f"rllib_ragen_weight_sync_{next(self._syncs)}"
        first_ranks = itertools.accumulate([first_rank] + [count for _, count, _ in members[:-1]])
        calls = [
            functools.partial(
                _tagged,
                fn=functools.partial(_receive_on_runner, spec=spec, first_rank=first, layout=layout, version=version),
            )
            for first in first_ranks
        ]
        ids = [index for index, _, _ in members]
        made = self.env_runner_group.foreach_env_runner_async(calls, tag=tag, remote_worker_ids=ids)
        if made != len(ids):
            raise RuntimeError(f"only {made} of {len(ids)} env runners took the weight-sync request")

        def wait() -> None:
            answered: set[int] = set()
            while len(answered) < len(ids):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise EngineTimeoutError(
                        f"the engines of env runner(s) {sorted(set(ids) - answered)} did not finish {_RECEIVE_STEP} "
                        f"within weight_sync_timeout_s={self.config.weight_sync_timeout_s} s"
                    )
                ready = self.env_runner_group.fetch_ready_async_reqs(tags=tag, timeout_seconds=min(remaining, 1.0))
                answered.update(index for _, (index, _) in ready)

        return wait

    # ------------------------------------------------------------------ reaching learners and runners
    def _on_learner(self, fn: Callable[[Any], Any], step: str) -> Any:
        """`fn(learner)` on every learner; the answer of the one that gives one (rank 0)."""
        timeout_s = None if self.learner_group.is_local else self.config.weight_sync_timeout_s
        for result in self.learner_group.foreach_learner(fn, timeout_seconds=timeout_s):
            value = result.get()
            if value is not None:
                return value
        raise TimeoutError(
            f"learner rank 0 did not finish {step} within weight_sync_timeout_s={self.config.weight_sync_timeout_s} s"
        )

    def _on_remote_runners(self, fn: Callable[[Any], Any], step: str, setting: str) -> list[tuple[int, Any]]:
        """(worker index, `fn(runner)`) of every healthy remote runner; raises naming those that miss the deadline."""
        ids = self.env_runner_group.healthy_env_runner_ids()
        if not ids:
            return []
        timeout_s = getattr(self.config, setting)
        answers = self.env_runner_group.foreach_env_runner(
            functools.partial(_tagged, fn=fn),
            local_env_runner=False,
            remote_worker_ids=ids,
            timeout_seconds=timeout_s,
        )
        missing = sorted(set(ids) - {index for index, _ in answers})
        if missing:
            raise EngineTimeoutError(
                f"the engines of env runner(s) {missing} did not finish {step} within {setting}={timeout_s} s"
            )
        return sorted(answers, key=lambda answer: answer[0])


# ---------------------------------------------------------------------- run on a learner
def _is_rank_zero() -> bool:
    """True on the one learner that sends (DDP learners hold identical weights)."""
    return not dist.is_initialized() or dist.get_rank() == 0


def _module(learner: TorchLearner) -> Any:
    return learner.module[DEFAULT_MODULE_ID].unwrapped()


def _policy_tensors(learner: TorchLearner, payload: Payload) -> dict[str, Tensor] | None:
    """What the engines load (`LLMRLModule.policy_state_dict`), on rank 0, in the dtype they hold it in."""
    if not _is_rank_zero():
        return None
    tensors = _module(learner).policy_state_dict(adapter=payload.adapter)
    if payload.dtype is None:
        return tensors
    # Rounded here as the engine would round it on load (both round to nearest even): half the bytes.
    # A tensor under two names (a tied LM head) is cast once, so that it still travels once.
    casts: dict[tuple, Tensor] = {}
    out = {}
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            out[name] = tensor
            continue
        identity = (tensor.data_ptr(), tuple(tensor.shape), tensor.stride())
        out[name] = casts.setdefault(identity, tensor.to(payload.dtype))
    return out


def _rank_zero_tensors(learner: TorchLearner, payload: Payload) -> dict[str, Tensor]:
    """`_policy_tensors` where the caller already checked that this learner is rank 0."""
    tensors = _policy_tensors(learner, payload)
    assert tensors is not None, "called on rank 0 only"
    return tensors


def _vocab_size(learner: TorchLearner) -> int | None:
    return _module(learner).policy.get_input_embeddings().num_embeddings if _is_rank_zero() else None


def _put_policy(learner: TorchLearner, payload: Payload) -> tuple[ray.ObjectRef, int] | None:
    if not _is_rank_zero():
        return None
    packed = pack_weights(_rank_zero_tensors(learner, payload))
    return ray.put(packed), packed.nbytes


def _policy_layout(learner: TorchLearner, payload: Payload) -> tuple[TensorLayout, torch.device] | None:
    if not _is_rank_zero():
        return None
    pairs = unique_weights(_rank_zero_tensors(learner, payload))
    return TensorLayout.of(pairs), pairs[0][1].device


def _send_from_learner(learner: TorchLearner, payload: Payload, spec: GroupSpec, layout: TensorLayout) -> bool | None:
    if not _is_rank_zero():
        return None
    send(spec, [tensor for _, tensor in unique_weights(_rank_zero_tensors(learner, payload))], layout)
    return True


@torch.no_grad()
def _learner_logprobs(learner: TorchLearner, prompt: list[int], continuation: list[int]) -> list[float] | None:
    """The policy's log-probs (temperature 1) of `continuation` after `prompt`, as the engines' `score`."""
    if not _is_rank_zero():
        return None
    policy = _module(learner).policy
    ids = torch.tensor([prompt + continuation], device=policy.device)
    logits = policy(input_ids=ids).logits[:, len(prompt) - 1 : -1].float()
    return token_logprobs(logits, ids[:, len(prompt) :])[0].tolist()


# ---------------------------------------------------------------------- run on an env runner
def _tagged(runner: EnvRunner, fn: Callable[[Any], Any]) -> tuple[int, Any]:
    return runner.worker_index, fn(runner)


def _load_on_runner(runner: EnvRunner, ref: ray.ObjectRef, version: int | None) -> None:
    runner.engine.load_packed(ref)
    _set_version(runner, version)


def _load_snapshot_on_runner(runner: EnvRunner, ref: ray.ObjectRef, engine: str) -> None:
    snapshot = getattr(runner, engine, None)
    if snapshot is not None:
        snapshot.load_packed(ref)


def _receive_on_runner(
    runner: EnvRunner, spec: GroupSpec, first_rank: int, layout: TensorLayout, version: int | None
) -> None:
    runner.engine.start_receive(spec, first_rank, layout)()
    _set_version(runner, version)


def _set_version(runner: EnvRunner, version: int | None) -> None:
    """The runner now samples with the weights of `version` (after they loaded, never before)."""
    if version is not None:
        runner.policy_version = version


def _receivers_on_runner(runner: EnvRunner) -> tuple[int, int]:
    return runner.engine.weight_receivers()


def _score_each_on_runner(runner: EnvRunner, prompt: list[int], continuation: list[int]) -> list[list[float]]:
    return runner.engine.score_each(prompt, continuation)
