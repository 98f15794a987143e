"""Every EngineSettings field is reachable from StarPOConfig.inference(), with EngineSettings's default,
and the settings reach vLLM as vLLM names them."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.inference.engine_settings import EngineSettings
from rllib_ragen.inference.kv_cache import kv_bytes_per_token
from rllib_ragen.inference.vllm.actor import llm_kwargs
from rllib_ragen.lora import LoraSettings

# A value different from the default for every field .inference() sets (the seed comes from .debugging()).
NON_DEFAULTS = {
    "engine": ("kind", "hf"),
    "num_engines": ("num_engines", 3),
    "kv_cache_gb": ("kv_cache_gb", 0.5),
    "engine_dtype": ("dtype", "bfloat16"),
    "max_model_len": ("max_model_len", 1000),
    "enable_prefix_caching": ("enable_prefix_caching", False),
    "kv_block_size": ("kv_block_size", 64),
    "num_gpus_per_engine": ("num_gpus_per_engine", 2.0),
    "gpu_memory_utilization": ("gpu_memory_utilization", 0.4),
    "tensor_parallel_size": ("tensor_parallel_size", 2),
    "engine_threads": ("num_threads", 3),
    "num_cpus_per_engine": ("num_cpus_per_engine", 0.5),
    "max_batch_size": ("max_batch_size", 7),
    "enforce_eager": ("enforce_eager", False),
    "max_engine_restarts_per_call": ("max_restarts_per_call", 5),
    "engine_start_timeout_s": ("start_timeout_s", 11.0),
    "engine_call_timeout_s": ("call_timeout_s", 12.0),
    "weight_sync": ("weight_sync", "collective"),
    "weight_sync_timeout_s": ("weight_sync_timeout_s", 13.0),
    "lora_sync": ("lora_sync", "merged"),
}


def test_starpo_defaults_are_engine_config_defaults():
    assert StarPOConfig().rollout_engine == EngineSettings()


def test_every_engine_field_is_settable_from_inference():
    fields = {f.name for f in dataclasses.fields(EngineSettings)}
    assert {field for field, _ in NON_DEFAULTS.values()} == fields
    config = StarPOConfig().inference(**{attribute: value for attribute, (_, value) in NON_DEFAULTS.items()})
    engine = config.rollout_engine
    for attribute, (field, value) in NON_DEFAULTS.items():
        assert getattr(engine, field) == value != getattr(EngineSettings(), field), attribute


def test_settings_reach_vllm_under_its_names():
    cpu = llm_kwargs(EngineSettings(kv_cache_gb=0.25, enforce_eager=False), "/m", rank=1, seed=3)
    assert (cpu["kv_cache_memory_bytes"], cpu["enforce_eager"], cpu["seed"]) == (2**28, False, 4)
    assert "gpu_memory_utilization" not in cpu
    gpu = llm_kwargs(EngineSettings(num_gpus_per_engine=1, kv_cache_gb=None, gpu_memory_utilization=0.3), "/m", 0)
    assert gpu["gpu_memory_utilization"] == 0.3 and "kv_cache_memory_bytes" not in gpu
    both = llm_kwargs(EngineSettings(num_gpus_per_engine=1, kv_cache_gb=2.0, gpu_memory_utilization=0.3), "/m", 0)
    assert (both["kv_cache_memory_bytes"], both["gpu_memory_utilization"]) == (2 * 2**30, 0.3)


def test_kv_block_size_is_small_on_cpu_and_vllms_own_on_gpu():
    """Prefix caching shares whole blocks: on CPU the smallest block vLLM's kernel takes, unless set."""
    assert llm_kwargs(EngineSettings(kv_cache_gb=1.0), "/m", 0)["block_size"] == 32
    assert llm_kwargs(EngineSettings(kv_cache_gb=1.0, kv_block_size=64), "/m", 0)["block_size"] == 64
    assert "block_size" not in llm_kwargs(EngineSettings(num_gpus_per_engine=1), "/m", 0)
    assert llm_kwargs(EngineSettings(num_gpus_per_engine=1, kv_block_size=16), "/m", 0)["block_size"] == 16
    with pytest.raises(ValueError, match=r"kv_block_size=48 on a CPU engine: .* multiples of 32"):
        EngineSettings(kv_block_size=48)
    with pytest.raises(ValueError, match="kv_block_size"):
        EngineSettings(kv_block_size=0)


# SmolLM2-135M's shape: 30 layers, 9 query heads over 3 key/value heads of 64 (576 hidden).
SMOLLM2_SHAPE = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}


def test_kv_bytes_per_token_by_hand():
    # keys and values (2) x 30 layers x 3 kv heads x 64 values x 2 bytes.
    assert kv_bytes_per_token(SMOLLM2_SHAPE, dtype="bfloat16") == 2 * 30 * 3 * 64 * 2 == 23040
    assert kv_bytes_per_token(SMOLLM2_SHAPE, dtype="float32") == 46080
    # No num_key_value_heads: every head has its own keys and values; an explicit head_dim wins.
    assert kv_bytes_per_token(
        {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32}, dtype="float32"
    ) == (2 * 2 * 4 * 8 * 4)
    assert kv_bytes_per_token({**SMOLLM2_SHAPE, "head_dim": 32}, dtype="float16") == 2 * 30 * 3 * 32 * 2
    with pytest.raises(ValueError, match="KV cache dtype must be one of"):
        kv_bytes_per_token(SMOLLM2_SHAPE, dtype="int8")


def test_a_cpu_engine_without_kv_cache_gb_gets_a_cache_for_its_batch(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**SMOLLM2_SHAPE, "dtype": "bfloat16"}))
    kwargs = llm_kwargs(EngineSettings(kv_cache_gb=None, max_batch_size=64, max_model_len=500), str(tmp_path), 0)
    # 500 tokens take 16 blocks of 32 (the CPU default): 512 token slots a sequence.
    assert kwargs["kv_cache_memory_bytes"] == 23040 * 64 * 512 and kwargs["max_num_seqs"] == 64
    assert kwargs["block_size"] == 32
    # 500 tokens in blocks of 128: 4 blocks, 512 slots; 520 tokens: 5 blocks, 640 slots.
    wide = llm_kwargs(
        EngineSettings(kv_cache_gb=None, max_batch_size=2, max_model_len=520, kv_block_size=128), str(tmp_path), 0
    )
    assert (wide["kv_cache_memory_bytes"], wide["block_size"]) == (23040 * 2 * 640, 128)
    fixed = llm_kwargs(EngineSettings(kv_cache_gb=0.5), str(tmp_path), 0)
    assert fixed["kv_cache_memory_bytes"] == 2**29 and "max_num_seqs" not in fixed


def test_auto_dtype_reaches_vllm_as_the_checkpoints_own(tmp_path):
    """vLLM's own "auto" would serve a float32 checkpoint in bfloat16 on CPU (emulated without AMX)."""
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({"dtype": "float32"}))
    assert llm_kwargs(EngineSettings(), str(tmp_path), 0)["dtype"] == "float32"
    assert llm_kwargs(EngineSettings(dtype="bfloat16"), str(tmp_path), 0)["dtype"] == "bfloat16"
    config_file.write_text(json.dumps({"torch_dtype": "bfloat16"}))  # the older transformers key
    assert llm_kwargs(EngineSettings(), str(tmp_path), 0)["dtype"] == "bfloat16"
    config_file.write_text(json.dumps({}))
    assert llm_kwargs(EngineSettings(), str(tmp_path), 0)["dtype"] == "auto"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gpu_memory_utilization": 0.5}, "num_gpus_per_engine=0 .a CPU engine"),
        ({"num_gpus_per_engine": 1, "gpu_memory_utilization": 1.5}, r"gpu_memory_utilization must be in \(0, 1\]"),
        ({"weight_sync": "nccl"}, "weight_sync must be one of"),
        ({"call_timeout_s": 0}, "engine_call_timeout_s must be > 0"),
        ({"weight_sync_timeout_s": -1}, "weight_sync_timeout_s must be > 0"),
        ({"start_timeout_s": 0}, "engine_start_timeout_s must be > 0"),
        ({"max_restarts_per_call": -1}, "max_engine_restarts_per_call must be >= 0"),
        ({"lora_sync": "sometimes"}, "lora_sync must be one of"),
    ],
)
def test_engine_config_rejects_bad_settings(overrides, message):
    with pytest.raises(ValueError, match=message):
        EngineSettings(**overrides)


@pytest.mark.parametrize(
    "engine, lora, message",
    [
        ({"kind": "vllm"}, LoraSettings(), "lora_sync='adapter' .* lora_rank=0"),
        ({"kind": "hf"}, LoraSettings(rank=8), "needs vLLM engines .* 'hf'"),
        ({"kind": "vllm"}, LoraSettings(rank=1024), "lora_rank=1024 is larger"),
    ],
)
def test_adapter_sync_is_checked_against_the_policys_lora(engine, lora, message):
    with pytest.raises(ValueError, match=message):
        EngineSettings(**engine, lora_sync="adapter").check_lora_sync(lora)


def test_lora_sync_auto_sends_the_adapter_to_gpu_vllm_engines_only():
    lora, gpu = LoraSettings(rank=4), {"num_gpus_per_engine": 1, "kv_cache_gb": None}
    assert EngineSettings(kind="vllm", **gpu).serves_adapter(lora)
    assert not EngineSettings(kind="vllm").serves_adapter(lora)  # CPU: merged
    assert not EngineSettings(kind="hf", **gpu).serves_adapter(lora)
    assert not EngineSettings(kind="vllm", lora_sync="merged", **gpu).serves_adapter(lora)
    assert not EngineSettings(kind="vllm", **gpu).serves_adapter(LoraSettings())  # full fine-tuning
    assert EngineSettings(kind="vllm", lora_sync="adapter").serves_adapter(lora)


def test_an_adapter_serving_engine_gets_vllms_lora_settings():
    for rank, max_rank in ((4, 8), (16, 16), (17, 32)):
        kwargs = llm_kwargs(EngineSettings(kind="vllm", lora_sync="adapter"), "/m", 0, adapter=LoraSettings(rank=rank))
        assert (kwargs["enable_lora"], kwargs["max_lora_rank"], kwargs["max_loras"]) == (True, max_rank, 1)
    assert "enable_lora" not in llm_kwargs(EngineSettings(kind="vllm"), "/m", 0)


def test_adapter_sync_without_lora_is_refused_when_the_config_is_validated():
    config = StarPOConfig().environment("bandit").inference(engine="vllm", lora_sync="adapter")
    with pytest.raises(ValueError, match="lora_sync='adapter' .* lora_rank=0"):
        config.validate()
    with pytest.raises(ValueError, match="needs vLLM engines"):
        config.llm(lora_rank=8).inference(engine="hf").validate()


def test_float16_weights_are_rejected_before_any_update(tiny_model_path):
    config = StarPOConfig().environment("bandit").llm(model=str(tiny_model_path), critic="none", dtype="float16")
    config.training(advantage_estimator="grpo")
    with pytest.raises(ValueError, match="dtype='float16' runs AdamW in float16.*inf/NaN"):
        config.validate_starpo()


def test_small_learning_rate_on_bfloat16_weights_warns(tiny_model_path, caplog):
    config = StarPOConfig().environment("bandit").llm(model=str(tiny_model_path), critic="none", dtype="bfloat16")
    config.training(advantage_estimator="grpo", actor_lr=1e-6)
    config.validate_starpo()
    assert "most weights never move" in caplog.text
    caplog.clear()
    config.training(actor_lr=1e-3).validate_starpo()
    assert "most weights never move" not in caplog.text


def test_collective_sync_cannot_reach_an_hf_engine_in_the_driver_from_remote_learners(tiny_model_path):
    config = StarPOConfig().environment("bandit").llm(model=str(tiny_model_path), critic="none")
    config.training(advantage_estimator="grpo").inference(engine="hf", weight_sync="collective")
    config.learners(num_learners=1)
    with pytest.raises(ValueError, match="cannot reach engine='hf' in the driver"):
        config.validate_starpo()
