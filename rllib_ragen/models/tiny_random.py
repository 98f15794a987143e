"""`tiny-random`: SmolLM2's architecture, tokenizer and chat template with 2 tiny layers of
seeded random weights, built offline in a second, for tests."""

from __future__ import annotations

import gzip
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rllib_ragen.models.model_directory import check_chatml_model_dir

TOKENIZER_ASSETS = Path(__file__).resolve().parents[1] / "assets" / "smollm2_tokenizer"
TINY_RANDOM_SEED = 0


def tiny_random_config() -> LlamaConfig:
    """SmolLM2's architecture and special-token ids, shrunk to 2 layers of width 64."""
    return LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        # head_dim 32: the smallest head size vLLM's CPU attention supports.
        num_attention_heads=2,
        num_key_value_heads=1,  # grouped-query attention, as SmolLM2 (9 heads, 3 kv heads)
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )


def install_vendored_tokenizer(out_dir: Path) -> None:
    """Write SmolLM2's tokenizer files (vendored in `assets/`) into `out_dir`."""
    with gzip.open(TOKENIZER_ASSETS / "tokenizer.json.gz", "rb") as packed:
        (out_dir / "tokenizer.json").write_bytes(packed.read())
    shutil.copyfile(TOKENIZER_ASSETS / "tokenizer_config.json", out_dir / "tokenizer_config.json")


def build_tiny_random(out_dir: Path, report: Callable[[str], None]) -> None:
    """The `BuiltinModel.build` of `tiny-random` (2 steps)."""
    # fork_rng: seed the init without disturbing the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_RANDOM_SEED)
        model = LlamaForCausalLM(tiny_random_config())
    model.save_pretrained(out_dir)
    report("saved seeded random weights")
    install_vendored_tokenizer(out_dir)
    check_chatml_model_dir(out_dir)
    report("installed and checked the tokenizer")
