"""`make_engine`: builds the rollout engine an `EngineSettings` asks for."""

from __future__ import annotations

from pathlib import Path

import torch

from rllib_ragen.inference.engine import InferenceEngine
from rllib_ragen.inference.engine_settings import EngineSettings, resolve_kind
from rllib_ragen.inference.hf_engine import HFEngine
from rllib_ragen.inference.vllm.pool import VLLMEnginePool
from rllib_ragen.lora import LoraSettings


def make_engine(
    config: EngineSettings, model_path: str | Path, *, seed: int = 0, lora: LoraSettings | None = None
) -> InferenceEngine:
    """Builds the engine `config` asks for around the model in `model_path` (a local dir): vLLM engines sample
    from `seed` (engine i from seed + i) and serve the policy's LoRA adapter when `config.serves_adapter(lora)`."""
    kind = resolve_kind(config.kind)
    model_path = Path(model_path)
    if not (model_path / "config.json").is_file():
        raise FileNotFoundError(f"{str(model_path)!r} is not a model directory (no config.json); resolve it first")
    if kind == "vllm":
        adapter = lora if lora is not None and config.serves_adapter(lora) else None
        return VLLMEnginePool(model_path, config, seed=seed, adapter=adapter)
    dtype = torch.float32 if config.dtype == "auto" else getattr(torch, config.dtype)
    return HFEngine(model_path, dtype=dtype, max_batch_size=config.max_batch_size, num_threads=config.num_threads)
