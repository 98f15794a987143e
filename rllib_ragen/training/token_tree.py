"""Rows packed as one token tree: every token position that rows share run once, in one trunk call.

A group's members start from the same prompt, every prompt starts with the
same instructions, and members that act alike repeat each other's answers.
Rows `[R, L]` are therefore inserted into a trie: a row position is a node,
and two rows share a node as long as their tokens agree from the start. The
nodes run as one sequence `[1, N]` (N <= R x L, no padding) with a 4D mask
that lets each node attend to itself and its ancestors only, and position ids
that are each node's depth. A node's hidden state depends only on the tokens
at and before it in its row (causal attention), so each row's hidden states
equal the per-row pass, and autograd sums the gradients of the rows that
share a node into its one pass. Unlike a key/value cache repeated to the rows,
nothing is copied per row: activations grow with the distinct positions N.
Under sdpa the nodes attend in blocks, each against only the nodes its
queries see (`tree_attention`, below), not the masked N^2 scores.
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


# Attention implementations that read a custom 4D mask (flash-attention kernels do not).
TREE_ATTENTION_IMPLEMENTATIONS = ("sdpa", TREE_ATTENTION, "eager")
# Most nodes run as one tree: its [N, N] bool mask is N^2 bytes, 64 MiB at this size
# (the learner's micro-batches, bounded by `micro_batch_tokens` distinct positions, stay below it).
MAX_TREE_NODES = 8192


@dataclasses.dataclass(frozen=True)
class TokenTree:
    """The distinct positions of right-padded rows [R, L] as one sequence of N nodes.

    Attributes:
        token_ids: [N] each node's token.
        position_ids: [N] each node's position in its rows (its depth in the trie).
        parents: [N] each node's parent node, -1 for a row's first token.
        node_of_position: [R, L] the node of each row position (padding positions: node 0, never read).
    """

    token_ids: torch.Tensor
    position_ids: torch.Tensor
    parents: torch.Tensor
    node_of_position: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return int(self.token_ids.shape[0])

    def attention_mask(self) -> torch.Tensor:
        """[1, 1, N, N] bool: node i attends to node j iff j is i or an ancestor of i."""
        n = self.num_nodes
        mask = torch.zeros(n, n, dtype=torch.bool)
        # Nodes are numbered after their parents, so each row of the mask is its parent's plus itself.
        for node, parent in enumerate(self.parents.tolist()):
            if parent >= 0:
                mask[node] = mask[parent]
            mask[node, node] = True
        return mask.to(self.token_ids.device)[None, None]


def token_tree(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TokenTree:
    """The trie of rows [R, L] (right-padded; `attention_mask` 1 on real tokens)."""
    lengths = attention_mask.sum(dim=1).tolist()
    node_of: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    tokens: list[int] = []
    depths: list[int] = []
    parents: list[int] = []
    node_of_position = torch.zeros(input_ids.shape, dtype=torch.long)
    for row, (ids, length) in enumerate(zip(input_ids.tolist(), lengths)):
        parent = -1
        path = []
        for depth, token in enumerate(ids[:length]):
            node = node_of.get((parent, token))
            if node is None:
                node = node_of[(parent, token)] = len(tokens)
                tokens.append(token)
                depths.append(depth)
                parents.append(parent)
            path.append(node)
            parent = node
        node_of_position[row, : len(path)] = torch.tensor(path, dtype=torch.long)
    device = input_ids.device
    return TokenTree(
        token_ids=torch.tensor(tokens, dtype=input_ids.dtype, device=device),
        position_ids=torch.tensor(depths, dtype=torch.long, device=device),
        parents=torch.tensor(parents, dtype=torch.long),
        node_of_position=node_of_position.to(device),
    )


def _attention_implementation(trunk: nn.Module) -> str | None:
    return getattr(getattr(trunk, "config", None), "_attn_implementation", None)


def use_tree_attention(model: nn.Module) -> None:
    """Switches a Hugging Face model that attends with sdpa to the tree implementation, once, where it is
    loaded for training (transformers' public `set_attn_implementation`).

    A pass without `tree_blocks` (no tree, or generation) runs sdpa's own attention under it, so only tree
    passes change. It must hold for the whole life of the model, not for one pass: a recompute under
    gradient checkpointing runs the attention of the pass it recomputes.
    """
    if _attention_implementation(model) == "sdpa":
        model.set_attn_implementation(TREE_ATTENTION)  # type: ignore[operator]  # a PreTrainedModel method


def worth_a_tree(trunk: nn.Module, tree: TokenTree, real_tokens: int) -> bool:
    """Whether `tree` runs through `trunk`: its rows share positions, it is not too large, and the
    trunk's attention honours a custom 4D mask."""
    implementation = _attention_implementation(trunk)
    return (
        tree.num_nodes < real_tokens
        and tree.num_nodes <= MAX_TREE_NODES
        and (implementation in TREE_ATTENTION_IMPLEMENTATIONS)
    )


def tree_budget_groups(input_ids: torch.Tensor, lengths: torch.Tensor, token_budget: int) -> list[torch.Tensor]:
    """Row indices of micro-batches whose token trees have at most `token_budget` nodes each.

    Rows are taken in lexicographic order of their tokens, where a row adds to
    its micro-batch's tree exactly its length minus its common prefix with the
    row before it (a trie's size over sorted strings), and filled greedily; rows
    that share prompts land together. A row longer than the budget gets a
    micro-batch of its own.

    Args:
        input_ids: [R, L] right-padded token ids.
        lengths: [R] real tokens per row.
        token_budget: Most distinct token positions (tree nodes) per micro-batch.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    rows = [ids[:length] for ids, length in zip(input_ids.tolist(), lengths.tolist())]
    groups: list[list[int]] = []
    nodes = 0
    previous: list[int] = []
    for row in sorted(range(len(rows)), key=rows.__getitem__):
        added = len(rows[row]) - _common_prefix(rows[row], previous)
        if groups and nodes + added <= token_budget:
            groups[-1].append(row)
            nodes += added
        else:
            groups.append([row])
            nodes = len(rows[row])
        previous = rows[row]
    return [torch.tensor(sorted(group), dtype=torch.long) for group in groups]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def tree_hidden(trunk: nn.Module, tree: TokenTree, *, query_block: int = QUERY_BLOCK) -> torch.Tensor:
    """Last hidden states [R, L, H] of a Hugging Face decoder trunk, each node of `tree` run once.

    Under sdpa the nodes attend block by block, `query_block` queries against
    only the keys they see (`rllib_ragen.training.token_tree`).

    Args:
        trunk: A decoder trunk (e.g. `LlamaModel`) that takes `position_ids` and a 4D attention mask.
        tree: `token_tree` of the rows.
        query_block: Queries per attention block under sdpa.
    """
    mask = tree.attention_mask()
    blocks = {}
    if _attention_implementation(trunk) == TREE_ATTENTION:  # `use_tree_attention` switched it at load
        blocks["tree_blocks"] = attention_blocks(mask, query_block)
    elif _attention_implementation(trunk) == "eager":
        # Eager attention adds its mask to the scores: 0 where a node is seen, the lowest float elsewhere.
        lowest = torch.finfo(torch.float32).min
        mask = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, lowest)
    out = trunk(
        input_ids=tree.token_ids[None],
        attention_mask=mask,
        position_ids=tree.position_ids[None],
        use_cache=False,
        **blocks,
    )
    nodes = out.last_hidden_state[0]  # [N, H]
    # Differentiable gather: the rows sharing a node sum their gradients into its one pass.
    return nodes[tree.node_of_position]
