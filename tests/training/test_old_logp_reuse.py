"""One on-policy optimiser step needs no scored old log-probs: the loss and its gradients are the same.

When each update is a single optimiser step on rows the current policy just
sampled, the PPO ratio's old policy *is* the current one, so the learner
connector skips that scoring forward pass and the loss uses its own log-probs,
detached. This checks that nothing changes: the scored old log-probs equal the
training forward's, and the loss and every gradient agree.
"""

from __future__ import annotations

import pytest
import torch
from ray.rllib.connectors.learner.learner_connector_pipeline import (
    LearnerConnectorPipeline,
)
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.columns import GENERATED_MASK, OLD_LOGP, TOKEN_LOGP


def _config(model, *, estimator="grpo", critic="none", mini_batch_size=8, rollout_frequency=1) -> StarPOConfig:
    return (
        StarPOConfig()
        .environment("corridor")
        .llm(model=str(model), critic=critic)
        .rollouts(n_groups=2, group_size=4, max_turns=3, max_actions_per_turn=1, response_length=8)
        .inference(engine="hf")
        .training(advantage_estimator=estimator, rollout_filter_ratio=1.0, mini_batch_size=mini_batch_size,
                  micro_batch_size=4, rollout_frequency=rollout_frequency, actor_lr=1e-3)
        .starpo_evaluation(eval_interval=0)
        .debugging(seed=0)
    )


def test_which_updates_skip_the_scoring_pass(tiny_model_path):
    assert _config(tiny_model_path).update_is_one_on_policy_step  # 8 rows, mini-batch 8, one epoch
    assert not _config(tiny_model_path, mini_batch_size=4).update_is_one_on_policy_step  # two steps
    assert not _config(tiny_model_path, rollout_frequency=2).update_is_one_on_policy_step  # two epochs


def _loss_and_grads(learner, connector, episodes):
    batch = connector(rl_module=learner.module, batch={}, episodes=episodes)
    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    module.zero_grad(set_to_none=True)
    fwd_out = {DEFAULT_MODULE_ID: module.forward_train(batch[DEFAULT_MODULE_ID])}
    loss = learner.compute_losses(fwd_out=fwd_out, batch=batch)[DEFAULT_MODULE_ID]
    loss.backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}
    return batch[DEFAULT_MODULE_ID], fwd_out[DEFAULT_MODULE_ID], loss.detach(), grads


@pytest.mark.parametrize("estimator,critic", [("grpo", "none"), ("gae", "head")])
def test_skipping_the_old_logp_pass_changes_nothing(tiny_model_path, ray_session, estimator, critic):
    config = _config(tiny_model_path, estimator=estimator, critic=critic)
    algo = config.build_algo()
    try:
        episodes = algo.env_runner.sample()

        def compare(learner):
            scored, reused = (
                _loss_and_grads(learner, LearnerConnectorPipeline(connectors=config.learner_connector_pieces(score_old_logp=s)), episodes)
                for s in (True, False)
            )
            return scored, reused

        [result] = algo.learner_group.foreach_learner(compare)
        (batch, fwd, loss, grads), (batch_r, _, loss_r, grads_r) = result.get()
    finally:
        algo.stop()
    assert OLD_LOGP not in batch_r
    mask = batch[GENERATED_MASK].bool()
    # Float32 rounding only: the two passes may group rows (so attention's sums) differently; log-probs
    # near -10 differ in their last bits (rtol 1e-6 is about 8 float32 ulps).
    torch.testing.assert_close(batch[OLD_LOGP][mask], fwd[TOKEN_LOGP].detach()[mask], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(loss_r, loss, atol=1e-6, rtol=0)
    assert grads.keys() == grads_r.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads_r[name], grads[name], atol=1e-6, rtol=1e-5, msg=name)
