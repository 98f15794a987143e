"""Token-id batches: validation and left padding."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def check_token_ids(sequences: Sequence[Sequence[int]], *, vocab_size: int, what: str = "prompt") -> None:
    """Raises ValueError naming the first empty sequence or out-of-vocabulary token id."""
    for index, sequence in enumerate(sequences):
        if len(sequence) == 0:
            raise ValueError(f"{what} {index} is empty")
        if min(sequence) < 0 or max(sequence) >= vocab_size:
            raise ValueError(f"{what} {index} has token ids outside [0, {vocab_size})")


def check_score_inputs(
    prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], *, vocab_size: int
) -> list[list[int]]:
    """Validates `score` arguments; returns each prompt + continuation as one sequence."""
    if len(prompts) != len(continuations):
        raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuations")
    check_token_ids(continuations, vocab_size=vocab_size, what="continuation")
    return [list(p) + list(c) for p, c in zip(prompts, continuations)]


def left_pad(sequences: Sequence[Sequence[int]], *, pad_token_id: int) -> tuple[Tensor, Tensor]:
    """Left-pads token-id sequences to one length.

    Returns:
        input_ids [B, L] int64 and attention_mask [B, L] int64 (0 on padding),
        L = the longest sequence.
    """
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        if sequence:
            input_ids[row, width - len(sequence) :] = torch.as_tensor(sequence, dtype=torch.long)
            mask[row, width - len(sequence) :] = 1
    return input_ids, mask
