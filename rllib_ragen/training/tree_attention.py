"""Attention over a token tree that computes only the scores its mask lets through.

A token tree's [N, N] mask is mostly False: a row's own nodes see the shared
prefix and their own ancestors, never another row's branch. SDPA computes
every masked score anyway, and at the warm start's trees of about a thousand
nodes that was a large share of a step (docs/results/warm_start_speed.md). Here the queries run in blocks, each
against only the keys some query of the block attends to, with the mask cut to
them: the same softmax over the same keys (a masked key adds exp(-inf) = 0),
so the same outputs and gradients, at a fraction of the scores.

On CPU a block runs the model's own eager attention (the `eager_attention_forward`
of its modeling file, so whatever a model adds there is kept): at a block's shape
(a hundred-odd queries, a few hundred keys) its backward is cheaper than that of
SDPA's flash kernel with a mask (docs/results/warm_start_speed.md). Elsewhere a
block runs transformers' sdpa attention.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

# The attention implementation a tree pass switches an sdpa trunk to (registered with transformers below).
TREE_ATTENTION = "token_tree_attention"
# Queries per block: small enough that a block spans few rows' branches (so few keys), large enough that
# a block's SDPA call is a matmul and not per-call overhead (64, 128, 256 timed on Sokoban's warm start).
QUERY_BLOCK = 128


@dataclasses.dataclass(frozen=True)
class AttentionBlock:
    """Queries `start`..`end` of a tree and the keys they attend to.

    Attributes:
        start: First query node.
        end: One past the last query node.
        keys: [K] the nodes any of the block's queries attends to, ascending.
        mask: [1, 1, end - start, K] bool, the tree's mask on those queries and keys.
    """

    start: int
    end: int
    keys: torch.Tensor
    mask: torch.Tensor


def attention_blocks(mask: torch.Tensor, query_block: int = QUERY_BLOCK) -> list[AttentionBlock]:
    """The blocks of `query_block` consecutive queries of a [1, 1, N, N] bool mask, each with its keys."""
    if query_block < 1:
        raise ValueError(f"query_block must be >= 1, got {query_block}")
    dense = mask[0, 0]
    blocks = []
    for start in range(0, dense.shape[0], query_block):
        rows = dense[start : start + query_block]
        keys = rows.any(dim=0).nonzero().squeeze(1)
        blocks.append(AttentionBlock(start, start + rows.shape[0], keys, rows[:, keys][None, None]))
    return blocks


def tree_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    tree_blocks: list[AttentionBlock] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, or block by block over `tree_blocks` when given.

    Args:
        module: The attention layer (its modeling file's eager attention runs the blocks on CPU).
        query: [1, heads, N, D]; key, value: [1, kv_heads, N, D].
        attention_mask: The tree's [1, 1, N, N] mask (read only without `tree_blocks`).
        tree_blocks: `attention_blocks` of that mask.
    Returns: the attention output [1, N, heads, D], and no weights.
    """
    if tree_blocks is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    block_attention = _block_attention(module, query.device)
    outputs = [
        block_attention(
            module,
            query[:, :, block.start : block.end],
            key[:, :, block.keys],
            value[:, :, block.keys],
            block.mask,
            **kwargs,
        )
        for block in tree_blocks
    ]
    return torch.cat(outputs, dim=1), None


def _block_attention(module: nn.Module, device: torch.device) -> Callable[..., torch.Tensor]:
    """One block's attention output [1, Q, heads, D] from (module, query, key, value, bool mask, **kwargs)."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if device.type != "cpu" or eager is None:
        return lambda *args, **kwargs: sdpa_attention_forward(*args, **kwargs)[0]

    def eager_block(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor,
        **kwargs: Any,
    ) -> torch.Tensor:
        # Eager attention adds its mask to the scores: 0 where a key is seen, the lowest value elsewhere.
        additive = torch.zeros(mask.shape, dtype=query.dtype, device=device).masked_fill(
            ~mask, torch.finfo(query.dtype).min
        )
        return eager(module, query, key, value, additive, **kwargs)[0]

    return eager_block


AttentionInterface.register(TREE_ATTENTION, tree_attention)
# A trunk under this implementation builds its padding masks as sdpa does (a tree pass passes its own 4D mask).
ALL_MASK_ATTENTION_FUNCTIONS.register(TREE_ATTENTION, sdpa_mask)
