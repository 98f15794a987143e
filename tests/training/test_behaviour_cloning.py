"""The warm start's supervised loop: the answer NLL, its micro-batch split, and an expert's answers learned."""

import dataclasses

import pytest
import torch

from rllib_ragen.columns import ATTENTION_MASK, GENERATED_MASK, INPUT_IDS
from rllib_ragen.models import load_causal_lm
from rllib_ragen.rollout.env_group import TurnBudgetSettings
from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings
from rllib_ragen.rollout.trajectory_record import trajectories_from_episodes
from rllib_ragen.run.warm_start import WarmStartSettings, demonstrations
from rllib_ragen.training.behaviour_cloning import (
    SupervisedSettings,
    answer_nll,
    cloning_passes,
    supervised_step,
)
from rllib_ragen.training.learner import micro_batch_weights

EXPERT = WarmStartSettings(
    env="frozenlake",
    env_config={"is_slippery": False, "render": "words"},
    protocol=ProtocolSettings(max_actions_per_turn=1, think=False, prefill=True, history_window=0),
    budget=TurnBudgetSettings(max_turns=5, max_actions_per_traj=5),
    num_examples=8,
    player="expert",
)


def _trajectories(tokenizer, config=EXPERT):
    return trajectories_from_episodes(demonstrations(tokenizer, config), history_window=0)


def test_answer_nll_is_the_mean_nll_of_the_generated_tokens_by_hand(tiny_model_path):
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 10, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    loss_mask = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 1, 0]])
    batch = {INPUT_IDS: ids, ATTENTION_MASK: attention, GENERATED_MASK: loss_mask}
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits.float(), -1)
        expected = -(logp[0, 2, 8] + logp[0, 3, 9] + logp[1, 2, 10]) / 3
        got = answer_nll(model, batch, SupervisedSettings(lr=1e-3))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_step_takes_the_same_update_for_any_micro_batch_split(tiny_model_path, tiny_tokenizer):
    rows = next(iter(cloning_passes(_trajectories(tiny_tokenizer), trajectories_per_pass=4, rows_per_step=12,
                                    epochs=1)))[0]
    after = []
    for budget in (100_000, 300):  # one micro-batch, then several
        splits = len(micro_batch_weights(rows, 0, "token-mean", token_budget=budget))
        assert splits == 1 if budget > 300 else splits >= 2
        model = load_causal_lm(tiny_model_path, dtype=torch.float32).train()
        settings = SupervisedSettings(lr=1e-3, micro_batch_tokens=budget)
        nll = supervised_step(model, settings.optimizer(model), rows, settings)
        after.append((nll, torch.cat([p.detach().flatten() for p in model.parameters()])))
    assert after[0][0] == pytest.approx(after[1][0], rel=1e-5)
    # AdamW's first step is about lr x sign(gradient): where a gradient is ~0, float32 summation order (one tree
    # or several) can move a weight by a fraction of lr (1e-3); a wrongly weighted split moves many by ~lr.
    torch.testing.assert_close(after[0][1], after[1][1], rtol=1e-4, atol=5e-5)


def test_the_passes_cover_every_row_once_an_epoch_in_steps_of_the_given_rows(tiny_tokenizer):
    trajectories = _trajectories(tiny_tokenizer)
    n_rows = sum(len(t.history.training_rows()) for t in trajectories)
    passes = list(cloning_passes(trajectories, trajectories_per_pass=3, rows_per_step=4, epochs=2))
    assert len(passes) == 2 * 3  # 8 trajectories in passes of 3, twice
    steps = [step for one_pass in passes for step in one_pass]
    assert all(step[INPUT_IDS].shape[0] <= 4 for step in steps)
    assert sum(step[INPUT_IDS].shape[0] for step in steps) == 2 * n_rows


@pytest.mark.slow  # 30 optimiser steps of the tiny model
def test_the_supervised_loop_learns_the_experts_answers_with_falling_nll(tiny_model_path, tiny_tokenizer):
    trajectories = _trajectories(tiny_tokenizer)
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).train()
    settings = SupervisedSettings(lr=3e-3, rows_per_step=8)
    optimizer = settings.optimizer(model)
    nlls = [
        supervised_step(model, optimizer, rows, settings)
        for one_pass in cloning_passes(trajectories, trajectories_per_pass=8, rows_per_step=8, epochs=6)
        for rows in one_pass
    ]
    assert nlls[0] > 5 and nlls[-1] < 0.5 * nlls[0], nlls
    # Held-out states of the same expert: the answers generalise, not just the rows seen.
    held_out = _trajectories(tiny_tokenizer, dataclasses.replace(EXPERT, seed=7))
    rows = next(iter(cloning_passes(held_out, trajectories_per_pass=8, rows_per_step=1000, epochs=1)))[0]
    fresh = load_causal_lm(tiny_model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        assert answer_nll(model.eval(), rows, settings) < 0.5 * answer_nll(fresh, rows, settings)
