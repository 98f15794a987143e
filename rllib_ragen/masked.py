"""Masked-tensor helpers: sums, means, variances and whitening over the tokens a 0/1 mask selects.

Shared by advantages, losses, filters, diagnostics and the distributed reductions.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def to_bool_mask(mask: Tensor, *, shape: torch.Size, name: str = "mask") -> Tensor:
    """Checks a 0/1 mask of the given shape and returns it as bool.

    Args:
        mask: bool, integer or float tensor holding only 0 and 1.
        shape: The shape ``mask`` must have.
        name: Used in error messages.

    Returns:
        Bool tensor of ``shape``.
    """
    if mask.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        return mask
    if not torch.all((mask == 0) | (mask == 1)):
        raise ValueError(f"{name} must hold only 0 and 1")
    return mask.bool()


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over positions where ``mask`` is true (NaN/inf on padding ignored)."""
    zeros = torch.zeros((), dtype=x.dtype, device=x.device)
    masked = torch.where(mask.bool(), x, zeros)
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the masked positions (all of them, or along ``dim``).

    An empty selection gives 0 rather than NaN so that a row without tokens
    contributes nothing.
    """
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: Tensor, mask: Tensor, *, unbiased: bool = True) -> Tensor:
    """Variance of ``x`` over all masked positions (Bessel-corrected by default).

    Raises:
        ValueError: if fewer than 2 positions are masked and ``unbiased``.
    """
    count = int(mask.bool().sum())
    if unbiased and count < 2:
        raise ValueError(f"unbiased masked variance needs >= 2 masked elements, got {count}")
    centred = x - masked_mean(x, mask)
    var = masked_sum(centred.square(), mask) / max(count, 1)
    return var * count / (count - 1) if unbiased else var


def masked_whiten(x: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Normalises ``x`` to zero mean and unit variance over the masked positions.

    RAGEN (via veRL) whitens GAE advantages this way over the loss mask, with
    the unbiased variance. Padding is set to 0.

    Args:
        x: [B, T] values.
        mask: [B, T] 0/1.
        shift_mean: If False the mean is added back (only the scale changes).
        eps: Added to the variance.

    Returns:
        [B, T] whitened values, 0 on padding.
    """
    mask = to_bool_mask(mask, shape=x.shape)
    mean = masked_mean(x, mask)
    whitened = (x - mean) * torch.rsqrt(masked_var(x, mask) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask, whitened, torch.zeros_like(whitened))
