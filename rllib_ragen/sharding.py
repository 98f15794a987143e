"""Contiguous shards: seeds over env runners, groups over learners, prompts over engines.

Contiguous runs keep a StarPO group (same prompt, adjacent) on one worker, where
prefix caching can share its prompt and a learner gets whole groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def split_contiguous(items: Sequence[T], num_shards: int) -> list[list[T]]:
    """`items` in `num_shards` contiguous runs, lengths differing by at most one (longer ones first).

    Concatenating the runs gives `items` back in order.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    size, extra = divmod(len(items), num_shards)
    out, start = [], 0
    for shard in range(num_shards):
        end = start + size + (1 if shard < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return out
