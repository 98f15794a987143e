"""`make_engine`: builds the rollout engine an `EngineSettings` asks for."""

from __future__ import annotations

from pathlib import Path

import torch

from rllib_ragen.inference.engine import InferenceEngine
from rllib_ragen.inference.engine_settings import EngineSettings, resolve_kind
from rllib_ragen.inference.hf_engine import HFEngine
from rllib_ragen.inference.vllm.pool import VLLMEnginePool


def make_engine(config: EngineSettings, model_path: str | Path) -> InferenceEngine:
    """Builds the engine `config` asks for around the model in `model_path` (a local dir)."""
    kind = resolve_kind(config.kind)
    model_path = Path(model_path)
    if not (model_path / "config.json").is_file():
        raise FileNotFoundError(f"{str(model_path)!r} is not a model directory (no config.json); resolve it first")
    if kind == "vllm":
        return VLLMEnginePool(model_path, config)
    dtype = torch.float32 if config.dtype == "auto" else getattr(torch, config.dtype)
    return HFEngine(model_path, dtype=dtype, max_batch_size=config.max_batch_size, num_threads=config.num_threads)
