"""bfloat16 weights train end to end: rollout, update, weight sync, checkpoint, resume and export,
every state in its own dtype (RLlib's numpy conversion crashed on bfloat16 and turns float16
into float32)."""

from __future__ import annotations

import gymnasium as gym
import pytest
import ray
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from safetensors.torch import load_file

from rllib_ragen.algorithm.starpo import StarPO, StarPOConfig
from rllib_ragen.models import load_causal_lm
from rllib_ragen.rllib_private import local_learner
from rllib_ragen.run.checkpoints import latest_checkpoint, save_checkpoint
from rllib_ragen.training.module import LLMModuleSettings, LLMRLModule, module_config

SPACE = gym.spaces.Text(max_length=8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_module_state_keeps_each_dtype_and_is_a_snapshot(tiny_model_path, dtype):
    def module():
        settings = LLMModuleSettings(model=str(tiny_model_path), critic="separate", dtype=str(dtype).removeprefix("torch."))
        config = module_config(settings)
        return LLMRLModule(observation_space=SPACE, action_space=SPACE, model_config=config)

    source, target = module(), module()
    with torch.no_grad():
        source.value_head.bias.fill_(0.25)
        source.policy.model.norm.weight.fill_(1.5)
    state = source.get_state()
    assert {t.dtype for t in state.values()} == {dtype} and state["value_head.bias"].item() == 0.25
    with torch.no_grad():
        source.policy.model.norm.weight.fill_(3.0)
    assert torch.all(state["policy.model.norm.weight"] == 1.5)  # a copy, not a view of the live weights
    target.set_state(state)
    for name, tensor in target.state_dict().items():
        assert tensor.dtype == dtype and torch.equal(tensor, state[name]), name
    inference_state = source.get_state(inference_only=True)
    assert not any(name.startswith(("value_head", "critic_trunk")) for name in inference_state)
    assert "policy.lm_head.weight" in inference_state


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def learner_of(algo):
    return local_learner(algo.learner_group)


@pytest.mark.slow  # two algorithms, three bfloat16 iterations with a separate critic (slow without native bf16)
def test_bfloat16_policy_trains_saves_restores_and_exports(tiny_model_path, tmp_path, ray_cluster):
    config = (
        StarPOConfig()
        .environment("sokoban")
        .llm(model=str(tiny_model_path), critic="separate", dtype="bfloat16")
        .rollouts(n_groups=2, group_size=2, max_turns=2, max_actions_per_turn=2, response_length=12)
        .inference(engine="hf")
        .training(mini_batch_size=2, micro_batch_size=2, rollout_filter_ratio=1.0, actor_lr=1e-3, critic_lr=1e-3)
        .starpo_evaluation(eval_interval=0)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    initial = {k: v.clone() for k, v in learner_of(algo).module[DEFAULT_MODULE_ID].state_dict().items()}
    algo.train()
    result = algo.train()
    module = learner_of(algo).module[DEFAULT_MODULE_ID]
    weights = {k: v.clone() for k, v in module.state_dict().items()}
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert sum(not torch.equal(weights[k], initial[k]) for k in weights) > len(weights) // 2
    assert result["weight_sync"]["engine_logp_max_abs_diff"] < 0.01
    optimizer = learner_of(algo).get_optimizer(DEFAULT_MODULE_ID, "policy").state_dict()
    save_checkpoint(algo, tmp_path / "ckpt", tracking={})
    algo.stop()

    restored = StarPO.from_checkpoint(str(latest_checkpoint(tmp_path / "ckpt")))
    try:
        for name, tensor in learner_of(restored).module[DEFAULT_MODULE_ID].state_dict().items():
            assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, weights[name]), name
        restored_optimizer = learner_of(restored).get_optimizer(DEFAULT_MODULE_ID, "policy").state_dict()
        for key, moments in optimizer["state"].items():
            for moment in ("exp_avg", "exp_avg_sq"):
                got = restored_optimizer["state"][key][moment]
                assert got.dtype == torch.bfloat16 and torch.equal(got, moments[moment]), (key, moment)
        # The engine got the trained weights, not the checkpoint's: in its float32, exactly.
        engine = restored.env_runner.engine.model.state_dict()
        for name, tensor in learner_of(restored).module[DEFAULT_MODULE_ID].unwrapped().policy_state_dict().items():
            assert torch.equal(engine[name], tensor.float()), name
        assert restored.train()["weight_sync"]["engine_logp_max_abs_diff"] < 0.01

        exported = restored.export_policy(tmp_path / "policy")
        saved = load_file(exported / "model.safetensors")  # as written: bfloat16, not widened
        policy = learner_of(restored).module[DEFAULT_MODULE_ID].unwrapped().policy
        assert {t.dtype for t in saved.values()} == {torch.bfloat16}
        for name, tensor in load_causal_lm(exported, dtype=torch.bfloat16).state_dict().items():
            assert torch.equal(tensor, policy.state_dict()[name]), name
    finally:
        restored.stop()
