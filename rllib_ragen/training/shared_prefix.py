"""The rows' common prefix run once: one trunk forward (and backward) for the prefix every row shares.

Every StarPO row starts with the same tokens: the chat template, the env's
instructions and the answer format, often most of a Markov prompt (about 150
of Sokoban's 200 prompt tokens). Running the trunk on `[R, L]` repeats that
prefix R times in forward and backward. Here the prefix `[1, P]` is run once
with its key/value cache, the cache is repeated to R rows, and only the rows'
suffixes `[R, L - P]` are run on top of it. Hidden states are equal to the
per-row pass (causal attention: a prefix position never sees what follows),
and so are gradients: autograd sums the R rows' gradients into the one prefix
pass. What RadixAttention does for inference, done for training (as the
shared-prefix GRPO methods do for a group's prompt).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rllib_ragen.columns import ATTENTION_MASK, INPUT_IDS

# A prefix shorter than this costs more in an extra forward call than it saves.
MIN_SHARED_PREFIX = 16


def common_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """Number of leading tokens that every row has, real (unpadded) and equal.

    Args:
        input_ids: [R, L] right-padded token ids.
        attention_mask: [R, L] 1 on real tokens.

    Returns:
        P in [0, L - 1]: at least one position is left for the rows' own pass.
    """
    real = attention_mask.bool()
    shared = ((input_ids == input_ids[:1]) & real).all(dim=0)  # [L]
    differing = (~shared).nonzero()
    length = int(differing[0]) if len(differing) else input_ids.shape[1]
    return min(length, input_ids.shape[1] - 1)


def shared_prefix_hidden(trunk: nn.Module, batch: dict[str, torch.Tensor], prefix_length: int) -> torch.Tensor:
    """Last hidden states [R, L, H] of a transformer trunk, the first `prefix_length` tokens run once.

    Args:
        trunk: A Hugging Face decoder trunk (e.g. `LlamaModel`) that returns `past_key_values`.
        batch: `input_ids` and `attention_mask`, [R, L], right-padded, rows equal on `[:, :prefix_length]`.
        prefix_length: P, 1 <= P < L (see `common_prefix_length`).
    """
    return run_with_cache(trunk, batch[INPUT_IDS], batch[ATTENTION_MASK], prefix_length)[0]


def run_with_cache(
    trunk: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix_length: int
) -> tuple[torch.Tensor, Any]:
    """Hidden states [R, L, H] and the key/value cache of rows [R, L], a common prefix of P > 0 run once."""
    rows = input_ids.shape[0]
    if prefix_length == 0:
        out = trunk(input_ids=input_ids, attention_mask=attention_mask, use_cache=True)
        return out.last_hidden_state, out.past_key_values
    prefix = trunk(
        input_ids=input_ids[:1, :prefix_length], attention_mask=attention_mask[:1, :prefix_length], use_cache=True
    )
    cache = prefix.past_key_values
    # Differentiable (repeat_interleave): backward sums the rows' gradients into the one prefix pass.
    cache.batch_repeat_interleave(rows)
    suffix = trunk(
        input_ids=input_ids[:, prefix_length:], attention_mask=attention_mask, past_key_values=cache, use_cache=True
    )
    hidden = torch.cat([prefix.last_hidden_state.expand(rows, -1, -1), suffix.last_hidden_state], dim=1)
    return hidden, suffix.past_key_values


def worth_sharing(trunk: nn.Module, rows: int, prefix_length: int) -> bool:
    """Whether the shared-prefix pass pays: several rows, a long enough prefix, and a cache to share.

    Under gradient checkpointing Hugging Face turns the key/value cache off in training, so the
    per-row pass stays.
    """
    checkpointing = bool(getattr(trunk, "gradient_checkpointing", False)) and trunk.training
    return rows > 1 and prefix_length >= MIN_SHARED_PREFIX and not checkpointing
