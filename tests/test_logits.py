"""Token-level tensor math (`rllib_ragen/logits.py`): the masked helpers, against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rllib_ragen.logits import masked_mean, masked_var, masked_whiten


def t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_masked_whiten_by_hand():
    # masked x = [1, 2, 3, 4]: mean 2.5, unbiased var = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3
    x = t([1, 2, 50], [3, 4, -50])
    mask = t([1, 1, 0], [1, 1, 0])
    std = math.sqrt(5 / 3)
    expected = t([-1.5 / std, -0.5 / std, 0], [0.5 / std, 1.5 / std, 0])
    torch.testing.assert_close(masked_whiten(x, mask), expected, rtol=0, atol=1e-5)
    kept_mean = masked_whiten(x, mask, shift_mean=False)
    torch.testing.assert_close(kept_mean, (expected + 2.5) * mask, rtol=0, atol=1e-5)


def test_masked_mean_and_var():
    x = t([1, 2, 50], [3, 4, -50])
    mask = t([1, 1, 0], [1, 1, 0])
    assert masked_mean(x, mask).item() == 2.5
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([1.5, 3.5]))
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(1.25)  # 5 / 4
    with pytest.raises(ValueError, match=">= 2 masked elements"):
        masked_var(x, t([1, 0, 0], [0, 0, 0]))
