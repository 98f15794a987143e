"""The KV cache sized to the model and the batch, not to a share of RAM.

On CPU vLLM's KV cache is host RAM taken at start-up. Its need follows from
the model (layers x key/value heads x head size x bytes per value, twice: keys
and values) and the batch (sequences decoded together x the longest sequence
an engine serves, `max_model_len`). vLLM queues what does not fit, so a cache
for one batch is enough; one for more only holds RAM.
"""

from __future__ import annotations

import json
from pathlib import Path

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_bytes_per_token(model_config: dict, *, dtype: str) -> int:
    """Bytes of keys and values one token takes in every layer of a decoder with `model_config` (config.json)."""
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"KV cache dtype must be one of {sorted(_DTYPE_BYTES)}, got {dtype!r}")
    heads = model_config["num_attention_heads"]
    kv_heads = model_config.get("num_key_value_heads") or heads
    head_dim = model_config.get("head_dim") or model_config["hidden_size"] // heads
    return 2 * model_config["num_hidden_layers"] * kv_heads * head_dim * _DTYPE_BYTES[dtype]


def kv_cache_bytes(model_dir: str | Path, *, dtype: str, sequences: int, max_model_len: int, block_tokens: int) -> int:
    """KV-cache bytes for `sequences` sequences of up to `max_model_len` tokens of the model in `model_dir`.

    Args:
        model_dir: A Hugging Face model directory (its config.json is read).
        dtype: The engine's dtype ("float32", "bfloat16" or "float16").
        sequences: Sequences decoded together.
        max_model_len: Longest prompt + response of one sequence.
        block_tokens: Tokens per KV block; a sequence's last block is allocated whole.
    """
    config = json.loads((Path(model_dir) / "config.json").read_text())
    blocks = -(-max_model_len // block_tokens)
    return kv_bytes_per_token(config, dtype=dtype) * sequences * blocks * block_tokens
