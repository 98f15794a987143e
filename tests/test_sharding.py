"""Contiguous shards (seeds over runners, groups over learners, prompts over engines)."""

import pytest

from rllib_ragen.sharding import split_contiguous


def test_split_contiguous_keeps_order_and_balances():
    assert split_contiguous([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]
    assert split_contiguous([1], 3) == [[1], [], []]
    assert split_contiguous(range(0), 2) == [[], []]
    assert split_contiguous(range(5), 2) == [[0, 1, 2], [3, 4]]
    with pytest.raises(ValueError, match="num_shards"):
        split_contiguous([1], 0)
