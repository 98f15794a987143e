"""Token-level tensor math: per-token log-probs and entropies from logits, chunked so no [B, T, V]
float32 copy exists, and masked sums, means, variances and whitening over the tokens a 0/1 mask selects.

The log-probs are shared by the learner (`rllib_ragen.training.module`) and the engines that score
sampled tokens (`rllib_ragen.inference.hf_engine`, the weight-sync check); the masked reductions by
advantages, losses, filters, diagnostics and the distributed reductions.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def token_logprobs(logits: Tensor, labels: Tensor, *, chunk_size: int = 512) -> Tensor:
    """Log-probability of each label under ``logits``, without a [B, T, V] log-softmax copy.

    ``log p(y) = logits[y] - logsumexp(logits)``, computed in float32 over
    chunks of ``chunk_size`` positions along T so that the float32 upcast of
    bf16 logits never exists for the whole sequence at once.

    Args:
        logits: [B, T, V].
        labels: [B, T] token ids.
        chunk_size: Positions per chunk.

    Returns:
        [B, T] float32 log-probabilities.
    """
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(
            f"need logits [B, T, V] and labels [B, T], got {tuple(logits.shape)} and {tuple(labels.shape)}"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    chunks = []
    for start in range(0, logits.shape[1], chunk_size):
        part = logits[:, start : start + chunk_size].float()
        picked = part.gather(-1, labels[:, start : start + chunk_size, None]).squeeze(-1)
        chunks.append(picked - torch.logsumexp(part, dim=-1))
    return torch.cat(chunks, dim=1)


def entropy_from_logits(logits: Tensor, *, chunk_size: int = 512) -> Tensor:
    """Entropy of the softmax of ``logits`` [..., V], per position.

    ``H = logsumexp(l) - sum(softmax(l) * l)``, in float32, over chunks of
    ``chunk_size`` positions so that the probabilities of only one chunk exist
    at a time.

    Returns:
        [...] float32 entropies.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    flat = logits.reshape(-1, logits.shape[-1])
    chunks = []
    for start in range(0, flat.shape[0], chunk_size):
        part = flat[start : start + chunk_size].float()
        chunks.append(torch.logsumexp(part, dim=-1) - (torch.softmax(part, dim=-1) * part).sum(-1))
    return torch.cat(chunks).reshape(logits.shape[:-1])


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
