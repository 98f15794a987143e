"""The per-row trunk pass and a loss's gradients: what the shared-prefix and shared-prompt passes are
checked against."""

from __future__ import annotations

import torch

from rllib_ragen.columns import ATTENTION_MASK, GENERATED_MASK, INPUT_IDS, TOKEN_LOGP
from rllib_ragen.training.module import score_generated_tokens, trunk_hidden


def per_row_hidden(trunk, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Last hidden states [R, L, H] with every row run whole."""
    return trunk(input_ids=batch[INPUT_IDS], attention_mask=batch[ATTENTION_MASK]).last_hidden_state


def loss_and_grads(model, batch: dict[str, torch.Tensor], hidden_of, *, position_weighted: bool = False):
    """(hidden, loss, gradients by parameter name) of the mean generated-token NLL with the trunk run by `hidden_of`.

    `position_weighted` weights each position differently (0.5 .. 1.5), so a hidden state moved to another
    position changes the loss.
    """
    model.zero_grad()
    hidden = hidden_of(model.base_model, batch)
    logp = score_generated_tokens(model.get_output_embeddings(), hidden, batch, 1.0, with_entropy=False)[TOKEN_LOGP]
    weights = torch.linspace(0.5, 1.5, logp.shape[1]) if position_weighted else torch.ones(logp.shape[1])
    loss = -(logp * batch[GENERATED_MASK] * weights).sum() / batch[GENERATED_MASK].sum()
    loss.backward()
    return (
        hidden.detach(),
        loss.detach(),
        {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
    )


def assert_bf16_trunk_hidden_is_per_row(model, batch: dict[str, torch.Tensor]) -> None:
    """`trunk_hidden` under bf16 autocast equals the per-row pass within bf16 tolerance, at every real token."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        shared = trunk_hidden(model.base_model, batch).float()
        rows = per_row_hidden(model.base_model, batch).float()
    real = batch[ATTENTION_MASK].bool()
    torch.testing.assert_close(shared[real], rows[real], rtol=0.05, atol=0.05)


def assert_equals_per_row_pass(model, batch: dict[str, torch.Tensor], hidden_of, *, position_weighted: bool = False):
    """`hidden_of` gives the per-row pass's hidden states (1e-5), loss (1e-6) and every gradient (1e-4) in
    float32; returns its gradients by parameter name."""
    hidden_rows, loss_rows, grads_rows = loss_and_grads(
        model, batch, per_row_hidden, position_weighted=position_weighted
    )
    hidden, loss, grads = loss_and_grads(model, batch, hidden_of, position_weighted=position_weighted)
    real = batch[ATTENTION_MASK].bool()
    torch.testing.assert_close(hidden[real], hidden_rows[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, loss_rows, rtol=1e-6, atol=1e-6)
    assert grads_rows.keys() == grads.keys() and len(grads_rows) > 10
    for name, grad in grads_rows.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    return grads
