"""`VLLMEnginePool`: N Ray actors each holding a `vllm.LLM`, behind one `InferenceEngine`.

A batch is split into contiguous shards, one per actor, generated in parallel
and put back in order. An actor that dies (`RayActorError`) is replaced by a new
one, brought to the current weights, and its shard is sent again: no prompt is lost.
Weights travel through a `WeightSync` strategy (object store on CPU; the seam for
an NCCL broadcast on GPU).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from torch import Tensor

from rllib_ragen.inference.batching import check_score_inputs, check_token_ids, shard_bounds
from rllib_ragen.inference.engine import Completion, InferenceEngine, SamplingParams
from rllib_ragen.inference.factory import EngineConfig
from rllib_ragen.inference.vllm_actor import VLLMEngineActor, actor_env_vars
from rllib_ragen.inference.weight_sync import ObjectStoreWeightSync, WeightSync
from rllib_ragen.inference.weights import check_weights, hf_weight_shapes

logger = logging.getLogger(__name__)


class VLLMEnginePool(InferenceEngine):
    """A pool of vLLM engine actors.

    Args:
        model_path: Local model directory (every actor loads it).
        config: Engine settings (num_engines, kv cache, dtype, threads, GPUs...).
        weight_sync: How weights reach the actors (default: Ray's object store).
        max_restarts_per_call: Actor replacements one call may make before giving up.
    """

    def __init__(
        self,
        model_path: str | Path,
        config: EngineConfig,
        *,
        weight_sync: WeightSync | None = None,
        max_restarts_per_call: int = 2,
    ) -> None:
        from transformers import AutoConfig

        if max_restarts_per_call < 0:
            raise ValueError(f"max_restarts_per_call must be >= 0, got {max_restarts_per_call}")
        self.model_path = str(Path(model_path).resolve())
        self.config = config
        self.weight_sync = weight_sync or ObjectStoreWeightSync()
        self.max_restarts_per_call = max_restarts_per_call
        self.vocab_size: int = AutoConfig.from_pretrained(self.model_path, local_files_only=True).vocab_size
        self._weight_shapes = hf_weight_shapes(self.model_path)
        self._actor_class = ray.remote(VLLMEngineActor).options(
            num_cpus=config.num_cpus_per_engine,
            num_gpus=config.num_gpus_per_engine,
            max_restarts=0,  # replaced by the pool itself, with the current weights
            runtime_env={"env_vars": actor_env_vars(config)},
        )
        self.actors = [self._actor_class.remote(self.model_path, config, rank) for rank in range(config.num_engines)]
        try:
            for rank, actor in enumerate(self.actors):
                self._wait_started(rank, actor)
        except RuntimeError:
            self.shutdown()
            raise
        self.restarts = 0
        self.last_sync_seconds: float | None = None

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
            len(prompts), lambda actor, lo, hi: actor.generate.remote(prompts[lo:hi], params, seeds[lo:hi])
        )

    def score(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-probs (temperature 1) of each continuation's tokens after its prompt."""
        joined = check_score_inputs(prompts, continuations, vocab_size=self.vocab_size)
        if not prompts:
            return []
        self._check_prompts(joined, extra_tokens=0)
        return self._run_sharded(
            len(prompts), lambda actor, lo, hi: actor.score.remote(prompts[lo:hi], continuations[lo:hi])
        )

    def update_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        """Loads HF-named weights into every engine in place; the time is in `last_sync_seconds`."""
        check_weights(state_dict, self._weight_shapes)
        start = time.perf_counter()
        refs = self.weight_sync.broadcast(self.actors, state_dict)
        # A replaced actor gets the new weights from `restore`, so nothing is re-sent.
        load_seconds = [self._get(rank, ref, resend=None) for rank, ref in enumerate(refs)]
        self.last_sync_seconds = time.perf_counter() - start
        logger.info(
            "weights synced to %d engines in %.2f s (slowest engine load %.2f s)",
            len(self.actors), self.last_sync_seconds, max(s or 0.0 for s in load_seconds),
        )

    def health(self, timeout_s: float = 30.0) -> dict[str, object]:
        """Pings every actor; healthy when all answer within `timeout_s`.

        `engine_threads` are the torch thread counts the live actors report.
        """
        infos = []
        for actor in self.actors:
            try:
                infos.append(ray.get(actor.info.remote(), timeout=timeout_s))
            except (RayActorError, GetTimeoutError):
                pass
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

    def _run_sharded(self, n_items: int, submit: Callable[[Any, int, int], ray.ObjectRef]) -> list:
        """Runs `submit(actor, lo, hi)` on contiguous shards in parallel; concatenates in order."""
        bounds = shard_bounds(n_items, len(self.actors))
        refs = [submit(actor, lo, hi) if hi > lo else None for actor, (lo, hi) in zip(self.actors, bounds)]
        results = []
        for rank, (ref, (lo, hi)) in enumerate(zip(refs, bounds)):
            if ref is not None:
                # _get runs before the loop moves on, so the lambda sees this shard's lo, hi.
                results.extend(self._get(rank, ref, resend=lambda actor: submit(actor, lo, hi)))
        return results

    def _get(self, rank: int, ref: ray.ObjectRef, *, resend: Callable[[Any], ray.ObjectRef] | None) -> Any:
        """`ray.get(ref)`; if actor `rank` died, replaces it and re-submits with `resend(new_actor)`."""
        for attempt in range(self.max_restarts_per_call + 1):
            try:
                return ray.get(ref)
            except RayActorError as error:
                if attempt == self.max_restarts_per_call:
                    raise RuntimeError(
                        f"vLLM engine {rank} died {attempt + 1} times in one call; giving up"
                    ) from error
                logger.warning("vLLM engine %d died (%s); starting a replacement", rank, type(error).__name__)
                self._replace(rank)
                if resend is None:
                    return None
                ref = resend(self.actors[rank])
        raise AssertionError("unreachable")

    def _replace(self, rank: int) -> None:
        """Starts a new actor for `rank` and loads the current weights into it."""
        ray.kill(self.actors[rank])
        actor = self._actor_class.remote(self.model_path, self.config, rank)
        self._wait_started(rank, actor)
        restore = self.weight_sync.restore(actor)
        if restore is not None:
            ray.get(restore)
        self.actors[rank] = actor
        self.restarts += 1

    @staticmethod
    def _wait_started(rank: int, actor) -> None:
        try:
            ray.get(actor.info.remote())
        except RayActorError as error:
            raise RuntimeError(f"vLLM engine {rank} failed to start: {error}") from error

    def _check_prompts(self, sequences: Sequence[Sequence[int]], *, extra_tokens: int) -> None:
        check_token_ids(sequences, vocab_size=self.vocab_size, what="prompt")
        longest = max(len(s) for s in sequences) + extra_tokens
        if longest > self.config.max_model_len:
            raise ValueError(
                f"a sequence needs {longest} positions (prompt + new tokens), more than "
                f"max_model_len={self.config.max_model_len}"
            )
