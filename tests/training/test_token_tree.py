"""Rows as one token tree: the trie counted by hand, and the tree pass equal to the per-row pass in
hidden states, loss and every gradient (with negative controls that would catch a misplaced node)."""


import dataclasses

import pytest
import torch
from trunk_passes import assert_bf16_trunk_hidden_is_per_row, assert_equals_per_row_pass, per_row_hidden

from rllib_ragen.columns import ATTENTION_MASK, GENERATED_MASK, INPUT_IDS
from rllib_ragen.models import load_causal_lm
from rllib_ragen.training.learner import micro_batch_weights
from rllib_ragen.training.module import computed_positions, tree_plan
from rllib_ragen.training.token_tree import (
    MAX_TREE_NODES,
    TREE_ATTENTION,
    AttentionBlock,
    attention_blocks,
    token_tree,
    tree_budget_groups,
    tree_hidden,
    use_tree_attention,
    worth_a_tree,
)


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
# 2-8 tokens: rows 0 and 4 are identical, rows 0 and 2 share A, and the last row is a whole trajectory
# (its later turn's observation, 3 3 3, follows its first answer).
PREFIX = list(range(100, 120))
A, B, C = PREFIX + [7] * 10, PREFIX + [8] * 6, PREFIX + [9] * 13
ROWS = [
    (A, [41, 42, 43]),
    (B, [44, 45]),
    (A, [46, 47, 48, 49, 50]),
    (C, [51, 52]),
    (A, [41, 42, 43]),
    (B, [53, 54, 55, 56, 57, 58]),
    (C, [59, 60, 61, 3, 3, 3, 62, 63]),
]
# Prefix 20, the prompts' own 10 + 6 + 13, then the distinct answers: A's 3 + 5, B's 2 + 6, C's 2 + 8.
TREE_NODES = 20 + 10 + 6 + 13 + 3 + 5 + 2 + 6 + 2 + 8


def test_token_tree_by_hand():
    ids = torch.tensor([[5, 6, 7, 0], [5, 6, 8, 9], [5, 6, 7, 0], [4, 6, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]])
    tree = token_tree(ids, attention)
    # Nodes in insertion order: 5 6 7 (row 0), 8 9 (row 1), row 2 = row 0, 4 6 (row 3).
    assert tree.token_ids.tolist() == [5, 6, 7, 8, 9, 4, 6]
    assert tree.position_ids.tolist() == [0, 1, 2, 2, 3, 0, 1]
    assert tree.parents.tolist() == [-1, 0, 1, 1, 3, -1, 5]
    assert tree.node_of_position.tolist() == [[0, 1, 2, 0], [0, 1, 3, 4], [0, 1, 2, 0], [5, 6, 0, 0]]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0],
            [1, 1, 0, 1, 0, 0, 0],  # 8 sees 5 6 and itself, not its sibling 7
            [1, 1, 0, 1, 1, 0, 0],
            [0, 0, 0, 0, 0, 1, 0],
            [0, 0, 0, 0, 0, 1, 1],  # row 3's 6 is its own node: it follows 4, not 5
        ],
        dtype=torch.bool,
    )
    assert torch.equal(tree.attention_mask()[0, 0], expected)


def test_the_tree_gives_the_per_row_hidden_states_loss_and_gradients(tiny_model_path):
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).train()
    batch = _batch(ROWS)
    tree = tree_plan(model.base_model, batch)
    assert tree is not None and tree.num_nodes == TREE_NODES
    grads = assert_equals_per_row_pass(model, batch, lambda trunk, b: tree_hidden(trunk, tree), position_weighted=True)
    # The shared prefix's embedding rows got gradient, summed over every row through its one pass.
    assert grads["model.embed_tokens.weight"][PREFIX].abs().sum() > 0


def test_the_tree_holds_under_eager_attention(tiny_model_path):
    """Eager attention adds its mask to the scores (sdpa reads it as booleans): the tree gives it a float one."""
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).train()
    model.config._attn_implementation = "eager"
    batch = _batch(ROWS)
    assert tree_plan(model.base_model, batch) is not None
    assert_equals_per_row_pass(model, batch, lambda trunk, b: tree_hidden(trunk, token_tree(b[INPUT_IDS], b[ATTENTION_MASK])))


def test_the_tree_holds_under_gradient_checkpointing(tiny_model_path):
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).train()
    model.gradient_checkpointing_enable()
    batch = _batch(ROWS)
    assert tree_plan(model.base_model, batch) is not None
    assert_equals_per_row_pass(model, batch, lambda trunk, b: tree_hidden(trunk, token_tree(b[INPUT_IDS], b[ATTENTION_MASK])))


def test_a_misplaced_node_or_a_missing_mask_would_show(tiny_model_path):
    """Negative controls: a row read from another row's nodes, or the nodes run under a plain causal
    mask (siblings would see each other), change the rows' hidden states."""
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).eval()
    batch = _batch(ROWS)
    tree = token_tree(batch[INPUT_IDS], batch[ATTENTION_MASK])
    misplaced = dataclasses.replace(tree, node_of_position=tree.node_of_position[[0, 0, 2, 3, 4, 5, 6]])
    answer = batch[GENERATED_MASK][1].bool()
    with torch.no_grad():
        rows = per_row_hidden(model.base_model, batch)
        right = tree_hidden(model.base_model, tree)
        wrong = tree_hidden(model.base_model, misplaced)
        causal = model.base_model(input_ids=tree.token_ids[None], position_ids=tree.position_ids[None])
    torch.testing.assert_close(right[1, answer], rows[1, answer], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(wrong[1, answer], rows[1, answer], rtol=1e-3, atol=1e-3)
    unmasked = causal.last_hidden_state[0][tree.node_of_position]
    assert not torch.allclose(unmasked[1, answer], rows[1, answer], rtol=1e-3, atol=1e-3)


def test_trunk_hidden_runs_the_tree_under_bf16_autocast_within_bf16_tolerance(tiny_model_path):
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).train()
    assert_bf16_trunk_hidden_is_per_row(model, _batch(ROWS))


def test_a_tree_runs_only_where_it_pays_and_works(tiny_model_path):
    trunk = load_causal_lm(tiny_model_path, dtype=torch.float32).base_model
    shared = _batch(ROWS)
    assert computed_positions(trunk, shared) == TREE_NODES
    # Rows that share nothing run row by row, padded: 2 rows x 3 positions.
    distinct = {INPUT_IDS: torch.tensor([[5, 6, 7], [8, 9, 0]]), ATTENTION_MASK: torch.tensor([[1, 1, 1], [1, 1, 0]])}
    assert tree_plan(trunk, distinct) is None and computed_positions(trunk, distinct) == 6
    tree = token_tree(shared[INPUT_IDS], shared[ATTENTION_MASK])
    real = int(shared[ATTENTION_MASK].sum())
    assert worth_a_tree(trunk, tree, real)
    assert not worth_a_tree(trunk, dataclasses.replace(tree, token_ids=torch.zeros(MAX_TREE_NODES + 1)), 10**6)
    trunk.config._attn_implementation = "flash_attention_2"  # reads no 4D mask
    assert not worth_a_tree(trunk, tree, real)


def test_micro_batches_are_budgeted_by_tree_nodes():
    batch = _batch(ROWS)
    lengths = batch[ATTENTION_MASK].sum(dim=1)
    # Lexicographic order: A rows 0, 4 (identical), 2; B rows 1, 5; C rows 3, 6. With 45 nodes a micro-batch:
    # A's 33 + 0 + 5 = 38 (B's first row would add its own 6 + 2: 46), B's 28 + 6 = 34, C's 35 + 8 = 43.
    groups = tree_budget_groups(batch[INPUT_IDS], lengths, 45)
    assert [g.tolist() for g in groups] == [[0, 2, 4], [1, 5], [3, 6]]
    # One budget for all: one micro-batch, as many nodes as the whole tree.
    assert [g.tolist() for g in tree_budget_groups(batch[INPUT_IDS], lengths, TREE_NODES)] == [list(range(7))]
    assert len(tree_budget_groups(batch[INPUT_IDS], lengths, TREE_NODES - 1)) == 2
    # A row longer than the budget gets a micro-batch of its own.
    assert [g.tolist() for g in tree_budget_groups(batch[INPUT_IDS], lengths, 10)] == [[0], [4], [2], [1], [5], [3], [6]]
    micro = micro_batch_weights(batch, 0, "token-mean", token_budget=45)
    assert [m[INPUT_IDS].shape[0] for m, _ in micro] == [3, 2, 2]
    assert sum(float(w) for _, w in micro) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="token_budget"):
        tree_budget_groups(batch[INPUT_IDS], lengths, 0)


def test_each_block_attends_to_the_nodes_its_queries_see():
    # The hand-counted tree of test_token_tree: nodes 5 6 7 | 8 9 | 4 6; 8 sees 5 6, and row 3 sees only itself.
    ids = torch.tensor([[5, 6, 7, 0], [5, 6, 8, 9], [5, 6, 7, 0], [4, 6, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]])
    mask = token_tree(ids, attention).attention_mask()
    blocks = attention_blocks(mask, query_block=3)
    assert [(b.start, b.end, b.keys.tolist()) for b in blocks] == [
        (0, 3, [0, 1, 2]),
        (3, 6, [0, 1, 3, 4, 5]),
        (6, 7, [5, 6]),
    ]
    # Node 8 (query 3) sees 5 6 and itself, not 9 or 4, which its block's keys hold for the others.
    assert blocks[1].mask[0, 0].tolist()[0] == [True, True, True, False, False]
    assert blocks[2].mask[0, 0].tolist() == [[True, True]]
    with pytest.raises(ValueError, match="query_block"):
        attention_blocks(mask, query_block=0)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_tree_in_blocks_gives_the_per_row_hidden_states_loss_and_gradients(tiny_model_path, checkpointing):
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).train()
    use_tree_attention(model)
    assert model.config._attn_implementation == TREE_ATTENTION
    if checkpointing:
        model.gradient_checkpointing_enable()
    batch = _batch(ROWS)
    tree = token_tree(batch[INPUT_IDS], batch[ATTENTION_MASK])
    blocks = attention_blocks(tree.attention_mask(), query_block=8)
    # Blocks see fewer keys than the whole tree: most scores are skipped.
    assert len(blocks) == 10 and sum(len(b.keys) for b in blocks) < len(blocks) * tree.num_nodes / 2
    assert_equals_per_row_pass(
        model, batch, lambda trunk, b: tree_hidden(trunk, tree, query_block=8), position_weighted=True
    )


def test_a_block_missing_a_key_would_show(tiny_model_path, monkeypatch):
    """Negative control: a block that drops the first key it needs (the shared prefix's first token)
    changes the rows' hidden states."""
    from rllib_ragen.training import token_tree as module

    def dropping_first_key(mask, query_block):
        return [
            AttentionBlock(b.start, b.end, b.keys[1:], b.mask[..., 1:]) for b in attention_blocks(mask, query_block)
        ]

    model = load_causal_lm(tiny_model_path, dtype=torch.float32).eval()
    use_tree_attention(model)
    batch = _batch(ROWS)
    tree = token_tree(batch[INPUT_IDS], batch[ATTENTION_MASK])
    answer = batch[GENERATED_MASK].bool()
    with torch.no_grad():
        rows = per_row_hidden(model.base_model, batch)
        right = tree_hidden(model.base_model, tree, query_block=8)
        monkeypatch.setattr(module, "attention_blocks", dropping_first_key)
        wrong = tree_hidden(model.base_model, tree, query_block=8)
    torch.testing.assert_close(right[answer], rows[answer], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(wrong[answer], rows[answer], rtol=1e-3, atol=1e-3)
