"""The rows' common prefix run once: equal hidden states, loss and gradients to the per-row pass."""

import pytest
import torch
from trunk_passes import assert_bf16_trunk_hidden_is_per_row, assert_equals_per_row_pass, per_row_hidden

from rllib_ragen.columns import ATTENTION_MASK, GENERATED_MASK, INPUT_IDS
from rllib_ragen.models import load_causal_lm
from rllib_ragen.training.module import trunk_hidden
from rllib_ragen.training.shared_prefix import (
    MIN_SHARED_PREFIX,
    common_prefix_length,
    shared_prefix_hidden,
    worth_sharing,
)


def test_common_prefix_length_by_hand():
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 1, 0], [5, 6, 2, 3, 4]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    assert common_prefix_length(ids, mask) == 2
    assert common_prefix_length(ids[:2], mask[:2]) == 3
    # Identical rows: one position is left for the rows' own pass.
    assert common_prefix_length(ids[:1].repeat(3, 1), torch.ones(3, 5, dtype=torch.long)) == 4
    # Padding never counts as shared, even where the padded ids agree.
    pad = torch.tensor([[5, 6, 0, 0], [5, 6, 0, 0]])
    assert common_prefix_length(pad, torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])) == 2


def _rows(prefix: int, total: int, rows: int = 4) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 500, (rows, total), generator=generator)
    ids[:, :prefix] = ids[0, :prefix]
    attention = torch.ones(rows, total, dtype=torch.long)
    attention[1, total - 5 :] = 0  # right padding of different lengths
    attention[2, total - 2 :] = 0
    loss = torch.zeros(rows, total, dtype=torch.long)
    loss[:, prefix + 4 :] = attention[:, prefix + 4 :]
    return {INPUT_IDS: ids, ATTENTION_MASK: attention, GENERATED_MASK: loss}


def test_shared_prefix_gives_the_per_row_hidden_states_loss_and_gradients(tiny_model_path):
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).train()
    batch = _rows(prefix=24, total=40)
    assert common_prefix_length(batch[INPUT_IDS], batch[ATTENTION_MASK]) == 24
    grads_shared = assert_equals_per_row_pass(model, batch, lambda trunk, b: shared_prefix_hidden(trunk, b, 24))
    # The prefix's own weights got gradient from every row: the embedding rows of prefix tokens moved.
    assert grads_shared["model.embed_tokens.weight"][batch[INPUT_IDS][0, :24]].abs().sum() > 0


def test_trunk_hidden_shares_the_prefix_under_bf16_autocast_within_bf16_tolerance(tiny_model_path):
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).train()
    assert_bf16_trunk_hidden_is_per_row(model, _rows(prefix=24, total=40))


def test_a_wrong_prefix_length_would_be_caught(tiny_model_path):
    """Negative control: sharing more tokens than the rows share changes the hidden states."""
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).eval()
    batch = _rows(prefix=20, total=40)
    with torch.no_grad():
        right, wrong = (
            shared_prefix_hidden(model.base_model, batch, 20),
            shared_prefix_hidden(model.base_model, batch, 30),
        )
    assert not torch.allclose(right[1:, 20:], wrong[1:, 20:], atol=1e-3)


def test_sharing_is_skipped_where_it_cannot_pay_or_work(tiny_model_path):
    trunk = load_causal_lm(tiny_model_path, dtype=torch.float32).base_model
    assert worth_sharing(trunk, rows=4, prefix_length=MIN_SHARED_PREFIX)
    assert not worth_sharing(trunk, rows=1, prefix_length=100)
    assert not worth_sharing(trunk, rows=4, prefix_length=MIN_SHARED_PREFIX - 1)
    trunk.gradient_checkpointing_enable()
    trunk.train()
    assert not worth_sharing(trunk, rows=4, prefix_length=100)


@pytest.mark.parametrize("prefix", [0, 8, 24])
def test_trunk_hidden_equals_the_per_row_pass_for_any_prefix(tiny_model_path, prefix):
    model = load_causal_lm(tiny_model_path, dtype=torch.float32).eval()
    batch = _rows(prefix=prefix, total=40)
    with torch.no_grad():
        shared, rows = trunk_hidden(model.base_model, batch), per_row_hidden(model.base_model, batch)
    real = batch[ATTENTION_MASK].bool()
    torch.testing.assert_close(shared[real], rows[real], rtol=1e-5, atol=1e-5)
