"""`VLLMEnginePool`: N Ray actors each holding a `vllm.LLM`, behind one `InferenceEngine`.

A batch is split into contiguous shards, one per actor, generated in parallel
and put back in order. An actor that dies (`RayActorError`) is replaced by a new
one, brought to the current weights, and its shard is sent again: no prompt is lost.
Every wait on an actor has a deadline from `EngineSettings` (start, call, weight
sync): an actor that misses it is stopped, `EngineTimeoutError` names it and the
step, and the next call replaces it.

Weights arrive through either transport of `rllib_ragen.inference.weight_sync`:
a reference to packed weights in Ray's object store (`load_packed`; kept, so a
replaced actor is restored from it), or a collective broadcast (`start_receive`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
import torch
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from torch import Tensor

from rllib_ragen.inference.collective import GroupSpec, TensorLayout
from rllib_ragen.inference.engine import (
    Completion,
    EngineTimeoutError,
    InferenceEngine,
    PackedWeights,
    SamplingParams,
    check_score_inputs,
    check_token_ids,
    check_weights,
    hf_weight_shapes,
    pack_weights,
)
from rllib_ragen.inference.engine_settings import EngineSettings
from rllib_ragen.inference.vllm.actor import VLLMEngineActor, actor_env_vars
from rllib_ragen.lora import LoraSettings
from rllib_ragen.sharding import split_contiguous

logger = logging.getLogger(__name__)

LOAD_STEP = "loading weights (object store)"
RECEIVE_STEP = "receiving weights (collective)"


class VLLMEnginePool(InferenceEngine):
    """A pool of vLLM engine actors.

    Args:
        model_path: Local model directory (every actor loads it).
        config: Engine settings (num_engines, kv cache, dtype, threads, GPUs, timeouts...).
        seed: Base seed of the engines' samplers (engine i uses seed + i).
        adapter: The policy's LoRA adapter, when the engines serve it (syncs then send it alone);
            None: they hold full (merged) weights.

    Attributes:
        resync: Set by the weight sync when it can bring the whole pool up to date
            from this process (collective transport, pool in the driver); an actor
            replaced after a broadcast is restored through it.
    """

    in_process = False

    def __init__(
        self, model_path: str | Path, config: EngineSettings, *, seed: int = 0, adapter: LoraSettings | None = None
    ) -> None:
        from transformers import AutoConfig

        self.model_path = str(Path(model_path).resolve())
        self.config = config
        self._actor_kwargs = {"seed": seed, "adapter": adapter}
        self.vocab_size: int = AutoConfig.from_pretrained(self.model_path, local_files_only=True).vocab_size
        # What a sync sends: the HF weights, or the LoRA adapter the engines serve.
        self._weight_shapes = hf_weight_shapes(self.model_path, adapter)
        self._actor_class = ray.remote(VLLMEngineActor).options(
            num_cpus=config.num_cpus_per_engine,
            num_gpus=config.num_gpus_per_engine,
            max_restarts=0,  # replaced by the pool itself, with the current weights
            runtime_env={"env_vars": actor_env_vars(config)},
        )
        logger.info("starting %d vLLM engine(s) on %s", config.num_engines, self.model_path)
        self.actors = [
            self._actor_class.remote(self.model_path, config, rank, **self._actor_kwargs)
            for rank in range(config.num_engines)
        ]
        try:
            for rank, actor in enumerate(self.actors):
                self._wait_started(rank, actor)
        except (RuntimeError, EngineTimeoutError):
            self.shutdown()
            raise
        logger.info("%d vLLM engine(s) started", config.num_engines)
        self.restarts = 0
        self.last_sync_seconds: float | None = None
        self.last_sync_nbytes = 0
        self.resync = None
        # What a replaced actor needs: the last packed weights, or (after a broadcast) a resync.
        self._latest_packed: ray.ObjectRef | None = None
        self._broadcast_received = False

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """One completion per prompt, in order.

        With `params.seed` set, prompt i is sampled with seed + i: the output does
        not depend on how the batch is split, and identical prompts still differ.
        """
        if not prompts:
            return []
        self._check_prompts(prompts, extra_tokens=params.max_new_tokens)
        seeds = [None if params.seed is None else params.seed + i for i in range(len(prompts))]
        return self._run_sharded(
            len(prompts),
            "generate",
            lambda actor, lo, hi: actor.generate.remote(prompts[lo:hi], params, seeds[lo:hi]),
        )

    def score(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-probs (temperature 1) of each continuation's tokens after its prompt."""
        joined = check_score_inputs(prompts, continuations, vocab_size=self.vocab_size)
        if not prompts:
            return []
        self._check_prompts(joined, extra_tokens=0)
        return self._run_sharded(
            len(prompts), "score", lambda actor, lo, hi: actor.score.remote(prompts[lo:hi], continuations[lo:hi])
        )

    def score_each(self, prompt: Sequence[int], continuation: Sequence[int]) -> list[list[float]]:
        """One copy of the prompt per actor: shards of one item each, so every engine scores it."""
        return self.score([prompt] * len(self.actors), [continuation] * len(self.actors))

    def update_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        """Loads HF-named weights into every engine in place, through the object store."""
        check_weights(state_dict, self._weight_shapes)
        packed = pack_weights(state_dict)
        self.last_sync_nbytes = packed.nbytes
        self.load_packed(packed)

    def load_packed(self, packed: PackedWeights | ray.ObjectRef) -> None:
        """Every actor loads the same packed weights (zero-copy from the object store); kept for restores."""
        ref = packed if isinstance(packed, ray.ObjectRef) else ray.put(packed)
        self._latest_packed, self._broadcast_received = ref, False
        start = time.perf_counter()
        deadline = time.monotonic() + self.config.weight_sync_timeout_s
        refs = [actor.load_weights.remote(ref) for actor in self.actors]
        # A replaced actor gets the new weights from `_restore`, so nothing is re-sent.
        load_seconds = [
            self._get(rank, r, step=LOAD_STEP, setting="weight_sync_timeout_s", deadline=deadline, resend=None)
            for rank, r in enumerate(refs)
        ]
        self._log_sync(start, load_seconds)

    def start_receive(self, spec: GroupSpec, first_rank: int, layout: TensorLayout) -> Callable[[], None]:
        """Every actor joins the broadcast (actor i as rank first_rank + i); the returned function waits.

        An actor that dies or fails meanwhile fails the sync: the group is broken
        for everyone, and the next sync replaces the actor and forms a new group.
        """
        shapes_only = {name: torch.empty(shape, device="meta") for name, shape in zip(layout.names, layout.shapes)}
        check_weights(shapes_only, self._weight_shapes)
        self._latest_packed, self._broadcast_received = None, True
        start = time.perf_counter()
        deadline = time.monotonic() + self.config.weight_sync_timeout_s
        refs = [actor.receive_weights.remote(spec, first_rank + r, layout) for r, actor in enumerate(self.actors)]

        def wait() -> None:
            load_seconds = []
            for rank, ref in enumerate(refs):
                try:
                    load_seconds.append(self._await(rank, ref, RECEIVE_STEP, "weight_sync_timeout_s", deadline))
                except RayActorError as error:
                    raise RuntimeError(f"vLLM engine {rank} died while {RECEIVE_STEP}") from error
            self._log_sync(start, load_seconds)

        return wait

    def weight_receivers(self) -> tuple[int, int]:
        """(actors, replacements so far), after replacing every actor that died since the last call.

        The replacement is not restored here: this is asked right before a sync.
        """
        deadline = time.monotonic() + self.config.weight_sync_timeout_s
        pings = [actor.info.remote() for actor in self.actors]
        for rank, ping in enumerate(pings):
            try:
                self._await(rank, ping, "the liveness check before a weight sync", "weight_sync_timeout_s", deadline)
            except RayActorError:
                logger.warning("vLLM engine %d is dead; starting a replacement before the weight sync", rank)
                self._replace(rank, restore=False)
        return len(self.actors), self.restarts

    def health(self, timeout_s: float = 30.0) -> dict[str, object]:
        """Pings every actor; healthy when all answer within `timeout_s`.

        `engine_threads` are the torch thread counts the live actors report.
        """
        infos = []
        for actor in self.actors:
            with contextlib.suppress(RayActorError, GetTimeoutError):
                infos.append(ray.get(actor.info.remote(), timeout=timeout_s))
        return {
            "engine": type(self).__name__,
            "healthy": len(infos) == len(self.actors) > 0,
            "num_engines": len(self.actors),
            "live_engines": len(infos),
            "engine_threads": [info["num_threads"] for info in infos],
            "restarts": self.restarts,
            "last_sync_seconds": self.last_sync_seconds,
        }

    def shutdown(self) -> None:
        """Kills every engine actor."""
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []

    def _run_sharded(self, n_items: int, step: str, submit: Callable[[Any, int, int], ray.ObjectRef]) -> list:
        """Runs `submit(actor, lo, hi)` on contiguous shards in parallel; concatenates in order."""
        bounds = [(s[0], s[-1] + 1) if s else (0, 0) for s in split_contiguous(range(n_items), len(self.actors))]
        deadline = time.monotonic() + self.config.call_timeout_s
        refs = [submit(actor, lo, hi) if hi > lo else None for actor, (lo, hi) in zip(self.actors, bounds)]
        results = []
        for rank, (ref, (lo, hi)) in enumerate(zip(refs, bounds)):
            if ref is not None:
                results.extend(
                    self._get(
                        rank,
                        ref,
                        step=step,
                        setting="call_timeout_s",
                        deadline=deadline,
                        resend=_shard_resend(submit, lo, hi),
                    )
                )
        return results

    def _get(
        self,
        rank: int,
        ref: ray.ObjectRef,
        *,
        step: str,
        setting: str,
        deadline: float,
        resend: Callable[[Any], ray.ObjectRef] | None,
    ) -> Any:
        """`_await(ref)`; if actor `rank` died, replaces it and re-submits with `resend(new_actor)`.

        The re-submitted work gets a deadline of its own (`setting` seconds from then). A replacement
        that dies too (while it starts, loads the current weights or redoes the work) is replaced
        again, up to `max_restarts_per_call` replacements in the call.
        """
        for attempt in range(self.config.max_restarts_per_call + 1):
            try:
                if attempt > 0:
                    self._replace(rank)
                    if resend is None:
                        return None
                    ref = resend(self.actors[rank])
                    deadline = time.monotonic() + getattr(self.config, setting)
                return self._await(rank, ref, step, setting, deadline)
            except RayActorError as error:
                if attempt == self.config.max_restarts_per_call:
                    raise RuntimeError(
                        f"vLLM engine {rank} died {attempt + 1} times in one call ({step}); giving up"
                    ) from error
                logger.warning("vLLM engine %d died (%s); starting a replacement", rank, type(error).__name__)
        raise AssertionError("unreachable")

    def _await(self, rank: int, ref: ray.ObjectRef, step: str, setting: str, deadline: float) -> Any:
        """`ray.get(ref)` by `deadline`, else stops actor `rank` and raises `EngineTimeoutError`.

        Raises:
            RayActorError: the actor died (the caller decides whether to replace it).
        """
        try:
            return ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except GetTimeoutError:
            # Stopped, not left running: its work is abandoned, and the next call replaces it.
            ray.kill(self.actors[rank])
            raise EngineTimeoutError(
                f"vLLM engine {rank} did not finish {step} within {setting}={getattr(self.config, setting)} s; "
                "it was stopped and the next call replaces it"
            ) from None
        except RayTaskError as error:
            if isinstance(error.cause, TimeoutError):
                raise EngineTimeoutError(f"vLLM engine {rank} timed out {step}: {error.cause}") from error
            raise

    def _replace(self, rank: int, *, restore: bool = True) -> None:
        """Starts a new actor for `rank` and (unless `restore=False`) loads the current weights into it.

        Raises:
            RayActorError: the new actor died too (the caller may replace it again).
            EngineTimeoutError: it did not start within `start_timeout_s` (it was stopped).
        """
        ray.kill(self.actors[rank])
        self.actors[rank] = self._actor_class.remote(self.model_path, self.config, rank, **self._actor_kwargs)
        self.restarts += 1
        deadline = time.monotonic() + self.config.start_timeout_s
        self._await(rank, self.actors[rank].info.remote(), "starting", "start_timeout_s", deadline)
        logger.info("vLLM engine %d replaced (%d replacements so far)", rank, self.restarts)
        if restore:
            self._restore(rank)

    def _restore(self, rank: int) -> None:
        """Brings the new actor `rank` (which holds the checkpoint's weights) to the current ones."""
        if self._latest_packed is not None:
            deadline = time.monotonic() + self.config.weight_sync_timeout_s
            ref = self.actors[rank].load_weights.remote(self._latest_packed)
            self._await(rank, ref, LOAD_STEP, "weight_sync_timeout_s", deadline)
        elif self._broadcast_received:
            if self.resync is None:
                raise RuntimeError(
                    f"vLLM engine {rank} was replaced and holds the checkpoint's weights; with "
                    "weight_sync='collective' only the learner can send it the current ones, which this "
                    "process cannot ask for (a remote env runner): this call fails, and the next sync "
                    "brings the engine up to date"
                )
            self.resync()

    def _wait_started(self, rank: int, actor: ActorHandle) -> None:
        timeout_s = self.config.start_timeout_s
        try:
            ray.get(actor.info.remote(), timeout=timeout_s)
        except GetTimeoutError:
            ray.kill(actor)
            raise EngineTimeoutError(
                f"vLLM engine {rank} did not start within start_timeout_s={timeout_s} s; it was stopped"
            ) from None
        except RayActorError as error:
            raise RuntimeError(f"vLLM engine {rank} failed to start: {error}") from error

    def _log_sync(self, start: float, load_seconds: Sequence[float | None]) -> None:
        self.last_sync_seconds = time.perf_counter() - start
        logger.info(
            "weights synced to %d engines in %.2f s (slowest engine load %.2f s)",
            len(self.actors),
            self.last_sync_seconds,
            max((s or 0.0 for s in load_seconds), default=0.0),
        )

    def _check_prompts(self, sequences: Sequence[Sequence[int]], *, extra_tokens: int) -> None:
        check_token_ids(sequences, vocab_size=self.vocab_size, what="prompt")
        longest = max(len(s) for s in sequences) + extra_tokens
        if longest > self.config.max_model_len:
            raise ValueError(
                f"a sequence needs {longest} positions (prompt + new tokens), more than "
                f"max_model_len={self.config.max_model_len}"
            )


def _shard_resend(submit: Callable[[Any, int, int], ray.ObjectRef], lo: int, hi: int) -> Callable[[Any], ray.ObjectRef]:
    """`submit` of the shard [lo, hi) on whichever actor it is given."""
    return lambda actor: submit(actor, lo, hi)
