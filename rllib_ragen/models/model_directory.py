"""A local Hugging Face model directory: what it must hold, and loading its tokenizer and causal LM."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from envs.user_errors import UserError


class ModelNotFoundError(UserError, FileNotFoundError):
    """A model name or path that does not resolve to a usable local model directory."""


def validated_model_dir(path: str | Path) -> Path:
    """Check that `path` is a model directory (config.json + weights); return it absolute.

    Raises:
        ModelNotFoundError: naming what is missing.
    """
    path = Path(path).expanduser().resolve()
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise ModelNotFoundError(f"Model directory {str(path)!r} {what}.")
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"{str(path)!r} is not a Hugging Face model directory: it has no config.json.")
    if not any(path.glob("*.safetensors")) and not any(path.glob("pytorch_model*.bin")):
        raise ModelNotFoundError(
            f"Model directory {str(path)!r} has config.json but no weights (*.safetensors or pytorch_model*.bin)."
        )
    for weights in sorted(path.glob("*.safetensors")):
        check_safetensors_complete(weights)
    return path


def check_safetensors_complete(path: Path) -> None:
    """Check, from its header alone, that a safetensors file holds every byte its tensors need.

    A copy or download cut short loads only deep inside an engine or learner, with the
    library's error; this names the file at once.

    Raises:
        ModelNotFoundError: the file is shorter than its header says, or has no valid header.
    """
    size = path.stat().st_size
    try:
        with open(path, "rb") as file:
            (header_length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(header_length)) if 8 + header_length <= size else None
    except (struct.error, ValueError):
        header = None
    if not isinstance(header, dict):
        raise ModelNotFoundError(
            f"{str(path)!r} is not a complete safetensors file: its header is cut short or invalid."
        )
    ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
    needed = 8 + header_length + max(ends, default=0)
    if size < needed:
        raise ModelNotFoundError(
            f"{str(path)!r} is cut short: {size} bytes, its tensors need {needed}; copy or download it again."
        )


def check_chat_tokenizer_files(path: Path) -> Path:
    """Check, without loading it, that `path` holds a tokenizer with a chat template; return `path`.

    Cheap enough for config validation: only the tokenizer files are read.

    Raises:
        ModelNotFoundError: no tokenizer.json / tokenizer_config.json.
        ValueError: neither tokenizer_config.json nor a chat_template.jinja/.json file has a chat template.
    """
    _check_tokenizer_files_exist(path)
    config_file = path / "tokenizer_config.json"
    template_files = ("chat_template.jinja", "chat_template.json", "additional_chat_templates")
    if any((path / name).exists() for name in template_files):
        return path
    if config_file.is_file() and json.loads(config_file.read_text()).get("chat_template"):
        return path
    raise ValueError(
        f"The tokenizer in {str(path)!r} has no chat template (none in tokenizer_config.json, no "
        "chat_template.jinja); prompts are built with one: use an instruct/chat model."
    )


def _check_tokenizer_files_exist(path: Path) -> None:
    if not (path / "tokenizer_config.json").is_file() and not (path / "tokenizer.json").is_file():
        raise ModelNotFoundError(f"{str(path)!r} has no tokenizer files (tokenizer.json / tokenizer_config.json).")


def check_chatml_model_dir(model_dir: Path) -> None:
    """Check what the rest of the library relies on for the built-in SmolLM2 family.

    Raises:
        RuntimeError: the chat template is not ChatML, eos is not `<|im_end|>`, the
            config and tokenizer disagree on special ids, or embeddings are untied.
    """
    tokenizer = load_tokenizer(model_dir)
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    problems = []
    if "<|im_start|>" not in tokenizer.chat_template:
        problems.append("the chat template is not ChatML (no <|im_start|>)")
    if tokenizer.eos_token != "<|im_end|>":
        problems.append(f"eos is {tokenizer.eos_token!r}, not '<|im_end|>'")
    if (config.eos_token_id, config.pad_token_id) != (tokenizer.eos_token_id, tokenizer.pad_token_id):
        problems.append(
            f"config eos/pad ids {(config.eos_token_id, config.pad_token_id)} differ from the "
            f"tokenizer's {(tokenizer.eos_token_id, tokenizer.pad_token_id)}"
        )
    if config.vocab_size != len(tokenizer):
        problems.append(f"config vocab_size {config.vocab_size} != tokenizer size {len(tokenizer)}")
    if not config.tie_word_embeddings:
        problems.append("tie_word_embeddings was lost")
    if problems:
        raise RuntimeError(f"Built model in {str(model_dir)!r} is wrong: " + "; ".join(problems) + ".")


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a local model directory (never touches the hub).

    Raises:
        ModelNotFoundError: `path` is not a model directory.
        ValueError: the tokenizer has no chat template (prompts need one).
    """
    path = Path(path).expanduser().resolve()
    _check_tokenizer_files_exist(path)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if not tokenizer.chat_template:
        raise ValueError(f"The tokenizer in {str(path)!r} has no chat template; prompts are built with one.")
    return tokenizer


def load_causal_lm(path: str | Path, *, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """Load the causal LM of a local model directory (never touches the hub), in eval mode."""
    model = AutoModelForCausalLM.from_pretrained(validated_model_dir(path), dtype=dtype, local_files_only=True)
    return model.eval()
