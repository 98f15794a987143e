"""Randomly initialised models with the shapes of SmolLM2-360M and Qwen2.5-0.5B, built locally.

An iteration's cost depends on a model's shapes (layers, widths, heads, vocabulary), not on its
weights' values, so a cost curve over model size needs no download: each model here is the
published architecture's config with seeded random weights, and SmolLM2's vendored tokenizer, built
once into the project's cache. Where the shape's vocabulary is larger than SmolLM2's 49,152 tokens
(Qwen2.5's 151,936), placeholder tokens fill the tokenizer up to it: random weights sample every id of
the vocabulary, and each must decode (and the model directory's check wants the two sizes equal).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PretrainedConfig, Qwen2Config

from rllib_ragen.models.cache import default_cache_dir
from rllib_ragen.models.model_directory import check_chatml_model_dir
from rllib_ragen.models.tiny_random import install_vendored_tokenizer

SHAPED_RANDOM_SEED = 0
# SmolLM2's special-token ids: the vendored tokenizer's, whatever the architecture.
SPECIAL_IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=2)


def smollm2_360m_config() -> LlamaConfig:
    """SmolLM2-360M's published shapes (32 layers of width 960, 15 heads over 5 key/value heads)."""
    return LlamaConfig(
        vocab_size=49152,
        hidden_size=960,
        intermediate_size=2560,
        num_hidden_layers=32,
        num_attention_heads=15,
        num_key_value_heads=5,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        **SPECIAL_IDS,
    )


def qwen25_05b_config() -> Qwen2Config:
    """Qwen2.5-0.5B's published shapes (24 layers of width 896, 14 heads over 2 key/value heads,
    a 151,936-token vocabulary)."""
    return Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        **SPECIAL_IDS,
    )


SHAPES = {"smollm2-360m-shape": smollm2_360m_config, "qwen2.5-0.5b-shape": qwen25_05b_config}


def shaped_random_model(name: str, *, cache_dir: Path | None = None) -> Path:
    """The directory of the random model `name` (a key of `SHAPES`), built there first if missing."""
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; choose one of {sorted(SHAPES)}")
    out_dir = (cache_dir or default_cache_dir()) / "shaped-random" / name
    if (out_dir / "config.json").is_file() and (out_dir / "tokenizer.json").is_file():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    config: PretrainedConfig = SHAPES[name]()
    with torch.random.fork_rng(devices=[]):  # seeded, without disturbing the caller's random stream
        torch.manual_seed(SHAPED_RANDOM_SEED)
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out_dir)
    install_tokenizer(out_dir, config.vocab_size)  # the tokenizer last: its presence marks a complete build
    check_chatml_model_dir(out_dir)
    return out_dir


def install_tokenizer(out_dir: Path, vocab_size: int) -> None:
    """SmolLM2's tokenizer in `out_dir`, with placeholder tokens `<|pad_N|>` for the ids from its size up
    to `vocab_size`; built aside and moved in with `tokenizer.json` last."""
    with tempfile.TemporaryDirectory(dir=out_dir) as staging:
        install_vendored_tokenizer(Path(staging))
        tokenizer = AutoTokenizer.from_pretrained(staging)
        tokenizer.add_tokens([f"<|pad_{i}|>" for i in range(len(tokenizer), vocab_size)])
        tokenizer.save_pretrained(staging)
        for name in sorted(os.listdir(staging), key=lambda name: name == "tokenizer.json"):
            os.replace(Path(staging) / name, out_dir / name)
