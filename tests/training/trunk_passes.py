"""The per-row trunk pass and a loss's gradients: what the shared-prefix and shared-prompt passes are
checked against."""

from __future__ import annotations

import torch
from ray.rllib.core.columns import Columns

from rllib_ragen.columns import ATTENTION_MASK, INPUT_IDS, TOKEN_LOGP
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
    loss = -(logp * batch[Columns.LOSS_MASK] * weights).sum() / batch[Columns.LOSS_MASK].sum()
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
