"""LoRA (PEFT) policies: only adapters and the value head train, on one frozen trunk shared with a
separate critic; engines get the merged weights and score like the learner; checkpoints hold the
adapters and their optimiser state only and restore them; exports merge or write a PEFT adapter."""

from __future__ import annotations

import pickle

import pytest
import torch
from peft import PeftModel
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen.algorithm.starpo import StarPO, StarPOConfig
from rllib_ragen.lora import (
    LoraSettings,
    add_adapters,
    is_adapter_weight,
    merged_state_dict,
)
from rllib_ragen.models import load_causal_lm
from rllib_ragen.rllib_private import local_learner, named_optimizers
from rllib_ragen.run.checkpoints import save_checkpoint

RANK, ALPHA = 4, 8.0
# Tiny model: 2 layers, hidden 64, MLP 128, one 32-wide kv head. Adapter parameters per layer are
# r * (in + out) summed over q (64+64), k (64+32), v (64+32), o (64+64), gate, up, down (64+128 each).
ADAPTER_PARAMS = 2 * RANK * (128 + 96 + 96 + 128 + 3 * 192)
VALUE_HEAD_PARAMS = 64 + 1


def lora_config(model_path) -> StarPOConfig:
    return (
        StarPOConfig()
        .environment("bandit")
        .llm(model=str(model_path), critic="separate", lora_rank=RANK, lora_alpha=ALPHA)
        .rollouts(n_groups=2, group_size=2, max_turns=1, max_actions_per_turn=1, response_length=8)
        .inference(engine="hf")
        .training(mini_batch_size=4, micro_batch_size=2, actor_lr=1e-2, critic_lr=1e-2, rollout_filter_ratio=1.0)
        .starpo_evaluation(eval_interval=0)
        .debugging(seed=0)
    )


def _module(algo):
    return local_learner(algo.learner_group).module[DEFAULT_MODULE_ID].unwrapped()


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


PROBE = torch.randint(3, 49152, (1, 20), generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------------- settings and merging
@pytest.mark.parametrize(
    "settings,message",
    [
        ({"rank": -1}, "lora_rank"),
        ({"rank": 2.5}, "lora_rank"),
        ({"rank": 4, "alpha": 0}, "lora_alpha"),
        ({"rank": 4, "dropout": 1.0}, "lora_dropout"),
        ({"rank": 4, "target_modules": []}, "lora_target_modules"),
    ],
)
def test_bad_lora_settings_are_clear_errors(settings, message):
    with pytest.raises(ValueError, match=message):
        LoraSettings(**settings)


def test_target_modules_matching_nothing_is_a_clear_error(tiny_model_path):
    with pytest.raises(ValueError, match="not found in the base model"):
        add_adapters(load_causal_lm(tiny_model_path), LoraSettings(rank=2, target_modules=("no_such_proj",)))


def test_top_layers_adapts_the_last_layers_only_and_backward_stops_below_them(tiny_model_path):
    """Tiny model: 2 layers. With top_layers=1 only layer 1 holds adapters, and nothing below it has a
    gradient path: layer 0's output needs no grad, so autograd never runs layer 0's backward."""
    model = load_causal_lm(tiny_model_path)
    add_adapters(model, LoraSettings(rank=RANK, alpha=ALPHA, top_layers=1))
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained and all(name.startswith("model.layers.1.") and is_adapter_weight(name) for name in trained)
    assert len(trained) == 2 * 7  # A and B of q, k, v, o, gate, up, down
    outputs = {}
    hooks = [model.model.layers[i].register_forward_hook(lambda m, args, out, i=i: outputs.__setitem__(i, out))
             for i in (0, 1)]
    model(input_ids=PROBE).logits.sum().backward()
    for hook in hooks:
        hook.remove()
    first, second = (o[0] if isinstance(o, tuple) else o for o in (outputs[0], outputs[1]))
    assert not first.requires_grad and second.requires_grad
    with pytest.raises(ValueError, match="lora_top_layers=3 but the model has 2 layers"):
        add_adapters(load_causal_lm(tiny_model_path), LoraSettings(rank=RANK, top_layers=3))


def test_merged_weights_are_w_plus_scaled_b_a_and_leave_the_adapted_model_unchanged(tiny_model_path):
    base = load_causal_lm(tiny_model_path)
    model = add_adapters(load_causal_lm(tiny_model_path), LoraSettings(rank=RANK, alpha=ALPHA))
    assert torch.equal(_logits(model, PROBE), _logits(base, PROBE))  # B = 0 at the start
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    merged = merged_state_dict(model)

    q_proj = model.model.layers[0].self_attn.q_proj
    by_hand = q_proj.base_layer.weight + (ALPHA / RANK) * q_proj.lora_B["default"].weight @ q_proj.lora_A["default"].weight
    torch.testing.assert_close(merged["model.layers.0.self_attn.q_proj.weight"], by_hand)
    assert set(merged) == set(base.state_dict())  # plain HF names, nothing of the adapters' own
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())

    base.load_state_dict(merged)
    torch.testing.assert_close(_logits(base, PROBE), _logits(model, PROBE), atol=1e-5, rtol=0)
    assert (_logits(model, PROBE) - _logits(load_causal_lm(tiny_model_path), PROBE)).abs().max() > 0.1


# ---------------------------------------------------------------------- training, sync, checkpoint, export
@pytest.fixture(scope="module")
def trained(ray_session, tiny_model_path):
    """A LoRA algorithm (separate critic) after two iterations, with copies of its weights from before."""
    algo = lora_config(tiny_model_path).build_algo()
    module = _module(algo)
    initial = {name: tensor.clone() for name, tensor in module.state_dict().items()}
    results = [algo.train() for _ in range(2)]
    yield algo, initial, results
    algo.stop()


def test_only_adapters_and_value_head_train_on_one_frozen_trunk(trained):
    algo, initial, _ = trained
    module, learner = _module(algo), local_learner(algo.learner_group)
    trainable = {name for name, param in module.named_parameters() if param.requires_grad}
    assert trainable == {name for name in initial if is_adapter_weight(name) or name.startswith("value_head.")}
    optimised = {id(p) for optimizer in named_optimizers(learner).values() for g in optimizer.param_groups
                 for p in g["params"]}
    assert optimised == {id(param) for name, param in module.named_parameters() if name in trainable}
    counts = {name: sum(p.numel() for g in optimizer.param_groups for p in g["params"])
              for name, optimizer in named_optimizers(learner).items()}
    assert counts == {"default_policy_policy": ADAPTER_PARAMS, "default_policy_critic": ADAPTER_PARAMS + VALUE_HEAD_PARAMS}

    state = module.state_dict()
    assert all(torch.equal(state[name], initial[name]) for name in state if name not in trainable)  # frozen
    assert all(not torch.equal(state[name], initial[name]) for name in trainable if "lora_B" in name or "value" in name)
    # The critic's adapters wrap the policy's base tensors: one trunk in memory.
    policy_q = module.policy.model.layers[0].self_attn.q_proj
    critic_q = module.critic_trunk.layers[0].self_attn.q_proj
    assert policy_q.base_layer.weight is critic_q.base_layer.weight
    assert not torch.equal(policy_q.lora_B["default"].weight, critic_q.lora_B["default"].weight)


def test_engine_gets_merged_weights_and_scores_like_the_adapted_learner(trained):
    algo, _, results = trained
    module = _module(algo)
    engine_weights = algo.env_runner.engine.model.state_dict()
    for name, tensor in merged_state_dict(module.policy).items():
        torch.testing.assert_close(engine_weights[name], tensor, msg=name)
    assert results[-1]["weight_sync"]["engine_logp_max_abs_diff"] < 1e-4
    # The second iteration sampled with the first one's merged weights and the learner scored them with adapters.
    assert results[-1]["learners"][DEFAULT_MODULE_ID]["train_inference_logp_gap_max"] < 1e-3


def test_checkpoint_holds_adapters_and_their_optimiser_state_and_restores_them(trained, tmp_path):
    algo, _, _ = trained
    checkpoint = save_checkpoint(algo, tmp_path, tracking={})
    module_file = checkpoint / "learner_group" / "learner" / "rl_module" / DEFAULT_MODULE_ID / "module_state.pkl"
    saved = pickle.loads(module_file.read_bytes())
    assert all(is_adapter_weight(name) or name.startswith("value_head.") for name in saved)
    assert sum(t.numel() for t in saved.values()) == 2 * ADAPTER_PARAMS + VALUE_HEAD_PARAMS
    learner_state = pickle.loads((checkpoint / "learner_group" / "learner" / "state.pkl").read_bytes())
    moments = [s["exp_avg"].numel() for o in learner_state["optimizer"].values() for s in o["state"]["state"].values()]
    assert sum(moments) == 2 * ADAPTER_PARAMS + VALUE_HEAD_PARAMS

    restored = StarPO.from_checkpoint(str(checkpoint))
    try:
        want, got = _module(algo).state_dict(), _module(restored).state_dict()
        assert all(torch.equal(got[name], want[name]) for name in want)
        optimizer = local_learner(restored.learner_group).get_optimizer(DEFAULT_MODULE_ID, "policy").state_dict()
        original = local_learner(algo.learner_group).get_optimizer(DEFAULT_MODULE_ID, "policy").state_dict()
        first = next(iter(original["state"]))
        torch.testing.assert_close(optimizer["state"][first]["exp_avg"], original["state"][first]["exp_avg"])
        assert restored.weight_sync.check() < 1e-4  # the engine serves the restored adapters
        restored.train()
    finally:
        restored.stop()


def test_a_full_fine_tuning_state_is_refused_by_a_lora_module(trained, tiny_model_path):
    algo, _, _ = trained
    full = {f"policy.{name}": tensor for name, tensor in load_causal_lm(tiny_model_path).state_dict().items()}
    with pytest.raises(ValueError, match="trained tensors missing"):
        _module(algo).set_state(full)


def test_export_writes_a_merged_model_and_on_request_a_peft_adapter(trained, tiny_model_path, tmp_path):
    algo, _, _ = trained
    expected = _logits(_module(algo).policy, PROBE)
    merged = load_causal_lm(algo.export_policy(tmp_path / "merged"))
    torch.testing.assert_close(_logits(merged, PROBE), expected, atol=1e-5, rtol=0)
    adapter_dir = algo.export_policy(tmp_path / "adapter", adapter=True)
    assert (adapter_dir / "adapter_config.json").is_file() and not (adapter_dir / "model.safetensors").exists()
    with_adapter = PeftModel.from_pretrained(load_causal_lm(tiny_model_path), adapter_dir)
    torch.testing.assert_close(_logits(with_adapter, PROBE), expected, atol=1e-5, rtol=0)


def test_adapter_export_of_a_full_fine_tuned_policy_is_a_clear_error(ray_session, tiny_model_path, tmp_path):
    algo = lora_config(tiny_model_path).llm(lora_rank=0).build_algo()
    try:
        with pytest.raises(ValueError, match="needs a LoRA policy"):
            algo.export_policy(tmp_path / "adapter", adapter=True)
    finally:
        algo.stop()
