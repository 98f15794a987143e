"""Rows that share a whole prompt: each distinct prompt run once, its continuations on top of it.

A group's members all start from the same observation, and members that act
alike meet the same states again: with a Markov prompt (one row a turn) about
half of a FrozenLake batch's rows repeat another row's prompt, and only their
12-token answers differ. Here each distinct prompt (the tokens before a row's
first generated token) runs once, with the batch's common prefix once below it
(`shared_prefix`); its key/value cache is then gathered to the rows that share
it, and only the rows' continuations run on top, at their own positions. Keys,
values and hidden states equal the per-row pass (causal attention: a prompt
position never sees what follows), and autograd sums each prompt's rows'
gradients into its one pass.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from rllib_ragen.columns import ATTENTION_MASK, GENERATED_MASK, INPUT_IDS
from rllib_ragen.training.shared_prefix import MIN_SHARED_PREFIX, common_prefix_length, run_with_cache


@dataclasses.dataclass(frozen=True)
class PromptTree:
    """Which rows of a right-padded batch [R, L] share a prompt.

    Attributes:
        prompt_rows: [U] the first row holding each distinct prompt.
        prompt_of_row: [R] each row's prompt, an index into `prompt_rows`.
        prompt_lengths: [R] tokens before each row's first generated token (the whole row if none).
        row_lengths: [R] real tokens per row.
        prefix_length: P, the tokens every distinct prompt starts with, run once below them (0: not worth it).
    """

    prompt_rows: torch.Tensor
    prompt_of_row: torch.Tensor
    prompt_lengths: torch.Tensor
    row_lengths: torch.Tensor
    prefix_length: int

    @property
    def num_prompts(self) -> int:
        return int(self.prompt_rows.shape[0])

    @property
    def computed_positions(self) -> int:
        """Token positions the shared pass runs: prefix once, each distinct prompt's rest, each row's continuation."""
        longest_prompt = int(self.prompt_lengths.max())
        longest_continuation = int((self.row_lengths - self.prompt_lengths).max())
        rows = int(self.prompt_of_row.shape[0])
        return (
            self.prefix_length + self.num_prompts * (longest_prompt - self.prefix_length) + rows * longest_continuation
        )

    def prompts(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The distinct prompts' ids and attention mask, [U, G] each (G: the longest prompt), right-padded."""
        longest = int(self.prompt_lengths.max())
        lengths = self.prompt_lengths[self.prompt_rows]
        mask = (torch.arange(longest, device=input_ids.device) < lengths[:, None]).long()
        return input_ids[self.prompt_rows, :longest], mask


def prompt_tree(input_ids: torch.Tensor, attention_mask: torch.Tensor, generated: torch.Tensor) -> PromptTree:
    """The distinct prompts of rows [R, L] (right-padded; `generated` marks generated tokens, 0/1)."""
    row_lengths = attention_mask.sum(dim=1)
    generated = generated.bool() & attention_mask.bool()
    prompt_lengths = torch.where(generated.any(dim=1), generated.int().argmax(dim=1), row_lengths)
    index_of: dict[tuple[int, ...], int] = {}
    prompt_rows: list[int] = []
    prompt_of_row: list[int] = []
    for row, (ids, length) in enumerate(zip(input_ids.tolist(), prompt_lengths.tolist())):
        key = tuple(ids[:length])
        if key not in index_of:
            index_of[key] = len(prompt_rows)
            prompt_rows.append(row)
        prompt_of_row.append(index_of[key])
    tree = PromptTree(
        prompt_rows=torch.tensor(prompt_rows, dtype=torch.long, device=input_ids.device),
        prompt_of_row=torch.tensor(prompt_of_row, dtype=torch.long, device=input_ids.device),
        prompt_lengths=prompt_lengths,
        row_lengths=row_lengths,
        prefix_length=0,
    )
    prefix = common_prefix_length(*tree.prompts(input_ids))
    if len(prompt_rows) < 2 or prefix < MIN_SHARED_PREFIX:
        return tree
    return dataclasses.replace(tree, prefix_length=prefix)


def prompt_order(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Rows [R] ordered longest prompt first, the rows of one prompt together (longest row first among them)."""
    tree = prompt_tree(batch[INPUT_IDS], batch[ATTENTION_MASK], batch[GENERATED_MASK])
    keys = list(zip((-tree.prompt_lengths).tolist(), tree.prompt_of_row.tolist(), (-tree.row_lengths).tolist()))
    return torch.tensor(sorted(range(len(keys)), key=keys.__getitem__), dtype=torch.long)


def worth_sharing_prompts(trunk: nn.Module, tree: PromptTree) -> bool:
    """Whether some rows repeat a prompt (and the trunk keeps a cache: not under gradient checkpointing)."""
    checkpointing = bool(getattr(trunk, "gradient_checkpointing", False)) and trunk.training
    return tree.num_prompts < tree.prompt_of_row.shape[0] and not checkpointing


def shared_prompt_hidden(trunk: nn.Module, input_ids: torch.Tensor, tree: PromptTree) -> torch.Tensor:
    """Last hidden states [R, L, H] of a transformer trunk, each distinct prompt of `tree` run once.

    Args:
        trunk: A Hugging Face decoder trunk (e.g. `LlamaModel`) that takes `past_key_values` and `position_ids`.
        input_ids: [R, L] right-padded token ids (positions past a row's length are never read).
        tree: `prompt_tree` of these rows.
    """
    prompt_ids, prompt_mask = tree.prompts(input_ids)  # [U, G]
    longest_prompt = prompt_ids.shape[1]
    prompt_hidden, cache = run_with_cache(trunk, prompt_ids, prompt_mask, tree.prefix_length)
    # Differentiable (index_select): each prompt's rows' gradients sum into its one pass.
    cache.reorder_cache(tree.prompt_of_row)
    slots = prompt_hidden.index_select(0, tree.prompt_of_row)  # [R, G, H]
    continuation_lengths = tree.row_lengths - tree.prompt_lengths  # [R]
    longest_continuation = int(continuation_lengths.max())
    if longest_continuation > 0:
        steps = torch.arange(longest_continuation, device=input_ids.device)
        real = steps < continuation_lengths[:, None]  # [R, C]
        positions = tree.prompt_lengths[:, None] + steps  # [R, C]: each row's own positions
        ids = input_ids.gather(1, positions.clamp(max=input_ids.shape[1] - 1)).masked_fill(~real, 0)
        continuation = trunk(
            input_ids=ids,
            attention_mask=torch.cat([prompt_mask.index_select(0, tree.prompt_of_row), real.long()], dim=1),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
        slots = torch.cat([slots, continuation.last_hidden_state], dim=1)  # [R, G + C, H]
    # Row position t is prompt slot t before the row's first generated token, continuation slot after.
    t = torch.arange(input_ids.shape[1], device=input_ids.device)
    slot = torch.where(t < tree.prompt_lengths[:, None], t, longest_prompt + t - tree.prompt_lengths[:, None])
    slot = slot.clamp(max=slots.shape[1] - 1)  # padding positions: any slot, never read
    return slots.gather(1, slot[:, :, None].expand(-1, -1, slots.shape[2]))
