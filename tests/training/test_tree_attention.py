"""Token-tree attention block by block: each block's keys counted by hand, and the tree pass in blocks
equal to the per-row pass in hidden states, loss and every gradient, with and without gradient
checkpointing (a negative control shows a block missing a key would be caught)."""

import pytest
import torch
from test_token_tree import ROWS, _batch
from trunk_passes import assert_equals_per_row_pass, per_row_hidden

from rllib_ragen.columns import ATTENTION_MASK, GENERATED_MASK, INPUT_IDS
from rllib_ragen.models import load_causal_lm
from rllib_ragen.training.token_tree import token_tree, tree_hidden
from rllib_ragen.training.tree_attention import TREE_ATTENTION, AttentionBlock, attention_blocks


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
    assert model.config._attn_implementation == TREE_ATTENTION


def test_a_block_missing_a_key_would_show(tiny_model_path, monkeypatch):
    """Negative control: a block that drops the first key it needs (the shared prefix's first token)
    changes the rows' hidden states."""
    from rllib_ragen.training import token_tree as module

    def dropping_first_key(mask, query_block):
        return [
            AttentionBlock(b.start, b.end, b.keys[1:], b.mask[..., 1:]) for b in attention_blocks(mask, query_block)
        ]

    model = load_causal_lm(tiny_model_path, dtype=torch.float32).eval()
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
