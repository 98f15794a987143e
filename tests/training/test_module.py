"""LLMRLModule: per-token log-probs, entropy and values on the generated tokens only."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from ray.rllib.core.columns import Columns

from rllib_ragen.columns import ATTENTION_MASK, GENERATED_MASK, INPUT_IDS, TOKEN_ENTROPY, TOKEN_LOGP
from rllib_ragen.training.module import LLMModuleSettings, LLMRLModule, module_config

SPACE = gym.spaces.Text(max_length=8)


def _module(model_path, *, logit_temperature=1.0, **settings):
    config = module_config(LLMModuleSettings(model=str(model_path), **settings), logit_temperature=logit_temperature)
    return LLMRLModule(observation_space=SPACE, action_space=SPACE, model_config=config)


def _batch():
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    loss_mask = torch.tensor([[0, 0, 1, 1, 0, 1], [0, 1, 1, 0, 0, 0]])
    return {INPUT_IDS: input_ids, ATTENTION_MASK: attention, GENERATED_MASK: loss_mask}


def test_logprobs_and_entropy_match_a_full_softmax(tiny_model_path):
    module = _module(tiny_model_path, critic="head", logit_temperature=0.7)
    batch = _batch()
    with torch.no_grad():
        out = module.forward_train(batch)
        logits = module.policy(input_ids=batch[INPUT_IDS], attention_mask=batch[ATTENTION_MASK]).logits / 0.7
    logp_all = torch.log_softmax(logits.float(), dim=-1)
    mask = batch[GENERATED_MASK]
    for b, t in mask.nonzero().tolist():
        token = batch[INPUT_IDS][b, t]
        torch.testing.assert_close(out[TOKEN_LOGP][b, t], logp_all[b, t - 1, token], atol=1e-5, rtol=1e-5)
        entropy = -(logp_all[b, t - 1].exp() * logp_all[b, t - 1]).sum()
        torch.testing.assert_close(out[TOKEN_ENTROPY][b, t], entropy, atol=1e-4, rtol=1e-4)
    assert (out[TOKEN_LOGP][mask == 0] == 0).all()
    assert (out[Columns.VF_PREDS][mask == 0] == 0).all()


def test_value_head_is_zero_at_start_and_does_not_move_the_policy(tiny_model_path):
    module = _module(tiny_model_path, critic="head")
    batch = _batch()
    values = module.compute_values(batch)
    assert torch.count_nonzero(values) == 0  # zero-initialised head
    module.forward_train(batch)[Columns.VF_PREDS].sum().backward()
    assert module.value_head.weight.grad is not None
    assert all(p.grad is None for p in module.policy.parameters())


def test_separate_critic_has_its_own_trunk_and_inference_state_drops_it(tiny_model_path):
    module = _module(tiny_model_path, critic="separate")
    assert module.critic_trunk is not module.policy.base_model
    state = module.get_state(inference_only=True)
    assert not any(k.startswith(("value_head", "critic_trunk")) for k in state)
    assert any(k.startswith("policy.") for k in state)


def test_no_critic_raises_a_clear_error(tiny_model_path):
    module = _module(tiny_model_path, critic="none")
    assert Columns.VF_PREDS not in module.forward_train(_batch())
    with pytest.raises(ValueError, match="no critic"):
        module.compute_values(_batch())


def test_config_errors():
    with pytest.raises(ValueError, match="critic"):
        LLMModuleSettings(critic="big")
    with pytest.raises(ValueError, match="dtype"):
        LLMModuleSettings(dtype="int8")
