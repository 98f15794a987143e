"""Training only the top layers: one StarPO update moves the last layer, the final norm and the value
head, and nothing else has gradients or optimiser state."""

from __future__ import annotations

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.models import load_causal_lm
from rllib_ragen.rllib_private import named_optimizers
from rllib_ragen.training.module import LLMModuleSettings
from rllib_ragen.training.top_layers import train_top_layers_only


def _config(model, **llm) -> StarPOConfig:
    return (
        StarPOConfig()
        .environment("corridor")
        .llm(model=str(model), critic="head", **llm)
        .rollouts(n_groups=2, group_size=4, max_turns=3, max_actions_per_turn=1, response_length=8)
        .inference(engine="hf")
        .training(advantage_estimator="gae", rollout_filter_ratio=1.0, micro_batch_size=4, actor_lr=1e-2)
        .starpo_evaluation(eval_interval=0)
        .debugging(seed=0)
    )


def _state(learner):
    """The module's weights, the parameters the optimisers hold state for, and those that train."""
    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    names = {id(p): name for name, p in module.named_parameters()}
    optimised = {names[id(p)] for optimizer in named_optimizers(learner).values() for p in optimizer.state}
    trainable = {name for name, p in module.named_parameters() if p.requires_grad}
    return {name: value.clone() for name, value in module.state_dict().items()}, optimised, trainable


def test_an_update_moves_only_the_top_layer_the_norm_and_the_value_head(tiny_model_path, ray_session):
    algo = _config(tiny_model_path, trained_top_layers=1).build_algo()
    try:
        [result] = algo.learner_group.foreach_learner(_state)
        before = result.get()[0]
        algo.train()
        [result] = algo.learner_group.foreach_learner(_state)
        state, optimised, trainable = result.get()
    finally:
        algo.stop()
    moved = {name for name, value in state.items() if not torch.equal(value, before[name])}
    top = ("policy.model.layers.1.", "policy.model.norm.", "value_head.")
    assert moved and all(name.startswith(top) for name in moved)
    assert any(name.startswith("policy.model.layers.1.") for name in moved)
    assert not any(name.startswith(("policy.model.layers.0.", "policy.model.embed_tokens.")) for name in moved)
    # Frozen weights get no AdamW moments: the optimiser's state covers exactly the trained parameters.
    assert optimised == trainable and all(name.startswith(top) for name in trainable)


def test_top_layers_are_checked():
    with pytest.raises(ValueError, match="trained_top_layers must be >= 1"):
        LLMModuleSettings(trained_top_layers=0)
    with pytest.raises(ValueError, match="lora_top_layers"):  # two groups: checked when the config is validated
        StarPOConfig().environment("bandit").llm(trained_top_layers=2, lora_rank=8).validate_starpo()


def test_as_many_top_layers_as_the_model_has_train_every_weight(tiny_model_path):
    policy = load_causal_lm(tiny_model_path)  # 2 layers
    train_top_layers_only(policy, 2)
    assert all(p.requires_grad for p in policy.parameters())
    train_top_layers_only(policy, 1)
    assert not policy.get_input_embeddings().weight.requires_grad
