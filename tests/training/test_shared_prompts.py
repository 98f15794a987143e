"""Rows that share a whole prompt, the prompt run once: equal hidden states, loss and gradients to the
per-row pass, and the positions it runs counted by hand."""

import dataclasses

import pytest
import torch
from trunk_passes import assert_bf16_trunk_hidden_is_per_row, assert_equals_per_row_pass, per_row_hidden

from rllib_ragen.columns import ATTENTION_MASK, GENERATED_MASK, INPUT_IDS
from rllib_ragen.models import load_causal_lm
from rllib_ragen.training.learner import micro_batch_weights, token_budget_groups
from rllib_ragen.training.module import computed_positions, sharing_plan
from rllib_ragen.training.shared_prompts import PromptTree, prompt_order, prompt_tree, shared_prompt_hidden


def _row(prompt: list[int], answer: list[int], length: int) -> tuple[list[int], list[int], list[int]]:
    """(ids, attention, generated) of one right-padded row: prompt, then generated answer."""
    ids = prompt + answer
    pad = length - len(ids)
    return ids + [0] * pad, [1] * len(ids) + [0] * pad, [0] * len(prompt) + [1] * len(answer) + [0] * pad


def _batch(rows: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
    length = max(len(p) + len(a) for p, a in rows)
    ids, attention, generated = zip(*(_row(p, a, length) for p, a in rows))
    return {
        INPUT_IDS: torch.tensor(ids),
        ATTENTION_MASK: torch.tensor(attention),
        GENERATED_MASK: torch.tensor(generated),
    }


# A common 20-token prefix, then prompts A (30 tokens), B (26), C (33); 7 rows over 3 prompts, answers of
# 2-6 tokens, one row (the last) a whole trajectory: its later turn's observation follows its first answer.
PREFIX = list(range(100, 120))
A, B, C = PREFIX + [7] * 10, PREFIX + [8] * 6, PREFIX + [9] * 13
ROWS = [
    (A, [41, 42, 43]),
    (B, [44, 45]),
    (A, [46, 47, 48, 49, 50]),
    (C, [51, 52]),
    (A, [41, 42, 43]),
    (B, [53, 54, 55, 56, 57, 58]),
    (C, [59, 60, 61, 3, 3, 3, 62, 63]),  # answer, observation (3 3 3), answer
]


def test_prompt_tree_by_hand():
    batch = _batch(ROWS)
    # The last row's later turn: its observation tokens are not generated.
    batch[GENERATED_MASK][6, 33 + 3 : 33 + 6] = 0
    tree = prompt_tree(batch[INPUT_IDS], batch[ATTENTION_MASK], batch[GENERATED_MASK])
    assert tree.prompt_rows.tolist() == [0, 1, 3]
    assert tree.prompt_of_row.tolist() == [0, 1, 0, 2, 0, 1, 2]
    assert tree.prompt_lengths.tolist() == [30, 26, 30, 33, 30, 26, 33]
    assert tree.row_lengths.tolist() == [33, 28, 35, 35, 33, 32, 41]
    assert tree.prefix_length == 20
    # Prefix once, 3 prompts' 13 remaining slots (longest 33 - 20), 7 rows' 8 continuation slots (41 - 33).
    assert tree.computed_positions == 20 + 3 * 13 + 7 * 8
    # Rows ordered longest prompt first, a prompt's rows together, longest row first among them.
    assert prompt_order(batch).tolist() == [6, 3, 2, 0, 4, 5, 1]


def test_shared_prompts_give_the_per_row_hidden_states_loss_and_gradients(tiny_model_path):
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).train()
    batch = _batch(ROWS)
    tree = sharing_plan(model.base_model, batch)
    assert isinstance(tree, PromptTree) and tree.num_prompts == 3
    assert_equals_per_row_pass(
        model, batch, lambda trunk, b: shared_prompt_hidden(trunk, b[INPUT_IDS], tree), position_weighted=True
    )


def test_a_row_run_on_the_wrong_prompt_would_show(tiny_model_path):
    """Negative control: the comparison above catches a row whose continuation runs on another prompt."""
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).eval()
    batch = _batch(ROWS)
    tree = prompt_tree(batch[INPUT_IDS], batch[ATTENTION_MASK], batch[GENERATED_MASK])
    wrong = dataclasses.replace(tree, prompt_of_row=torch.tensor([0, 0, 0, 2, 0, 1, 2]))  # row 1 (B) on A
    with torch.no_grad():
        rows = per_row_hidden(model.base_model, batch)
        right = shared_prompt_hidden(model.base_model, batch[INPUT_IDS], tree)
        misplaced = shared_prompt_hidden(model.base_model, batch[INPUT_IDS], wrong)
    answer = batch[GENERATED_MASK][1].bool()
    torch.testing.assert_close(right[1, answer], rows[1, answer], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(misplaced[1, answer], rows[1, answer], rtol=1e-3, atol=1e-3)


def test_trunk_hidden_shares_prompts_under_bf16_autocast_within_bf16_tolerance(tiny_model_path):
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).train()
    assert_bf16_trunk_hidden_is_per_row(model, _batch(ROWS))


def test_distinct_prompts_keep_the_common_prefix_path(tiny_model_path):
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).train()
    batch = _batch([(A, [41]), (B, [42]), (C, [43])])
    assert sharing_plan(model.base_model, batch) == 20
    # Prefix once, each row's other 14 positions (the longest row: 34).
    assert computed_positions(model.base_model, batch) == 20 + 3 * 14


def test_micro_batches_keep_a_prompts_rows_together():
    batch = _batch(ROWS)
    # 2 rows of at most 41 tokens a micro-batch: [6, 3] (C), [2, 0] (A), [4, 5] ...
    groups = token_budget_groups(batch[ATTENTION_MASK].sum(dim=1), 82, order=prompt_order(batch))
    assert [g.tolist() for g in groups] == [[3, 6], [0, 2], [4, 5], [1]]
    # Filled in length order without one: rows of one prompt apart.
    assert [g.tolist() for g in token_budget_groups(batch[ATTENTION_MASK].sum(dim=1), 82)] == [
        [2, 6],
        [0, 3],
        [4, 5],
        [1],
    ]
    micro = micro_batch_weights(batch, 0, "token-mean", token_budget=3 * 41)
    assert [m[INPUT_IDS].shape[0] for m, _ in micro] == [3, 3, 1]
    assert sum(float(w) for _, w in micro) == pytest.approx(1.0)
