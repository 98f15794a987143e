"""Token-level tensor math: per-token log-probs from logits, chunked so no [B, T, V] float32 copy
exists; log-probs with entropies and their written-out gradient, for the learner's LM head; and
masked sums, means, variances and whitening over the tokens a 0/1 mask selects.

The chunked log-probs serve the engines that score sampled tokens (`rllib_ragen.inference.hf_engine`,
the weight-sync check), the ones with entropies the learner (`rllib_ragen.training.module`); the masked reductions by
advantages, losses, filters, diagnostics and the distributed reductions.
"""

from __future__ import annotations

from typing import Any

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


def logprobs_and_entropies(logits: Tensor, labels: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """Log-probability of each label and the entropy, under ``softmax(logits / temperature)``, per row.

    ``log p(y) = s[y] - logsumexp(s)`` and ``H = logsumexp(s) - sum(p * s)`` with ``s = logits / T``,
    in float32, with their gradient written out (`_LogpAndEntropy`): autograd's own graph of these
    formulas makes about five times as many passes over the [N, V] rows, the larger part of a
    learner's LM-head time on CPU.

    Args:
        logits: [N, V].
        labels: [N] token ids.
        temperature: > 0.

    Returns:
        ([N] log-probabilities, [N] entropies), float32.
    """
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"need logits [N, V] and labels [N], got {tuple(logits.shape)} and {tuple(labels.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return _LogpAndEntropy.apply(logits, labels, temperature)


class _LogpAndEntropy(torch.autograd.Function):
    """`logprobs_and_entropies`, whose backward is, with p = softmax(s) and E = sum(p * s):
    d log p(y) / d s = onehot(y) - p, and d H / d s = -p * (s - E); then / T for the logits."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, labels: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
        computed = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float32 at least
        scaled = computed / temperature if temperature != 1.0 else computed
        lse = torch.logsumexp(scaled, dim=-1)
        probs = torch.exp(scaled - lse[:, None])
        # sum(p * s) without an [N, V] temporary; outside the caller's autocast, which would run this bmm in
        # bf16 and move E (about the size of a logit, 10-30) by 0.1 or more: more than the entropy near collapse.
        with torch.autocast(logits.device.type, enabled=False):
            expected = torch.bmm(probs[:, None, :], scaled[:, :, None]).reshape(-1)
        logp = scaled.gather(-1, labels[:, None]).squeeze(-1) - lse
        ctx.save_for_backward(scaled, probs, labels, expected)
        ctx.temperature, ctx.logits_dtype = temperature, logits.dtype
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None, not zeros
        return logp, lse - expected

    @staticmethod
    def backward(ctx: Any, grad_logp: Tensor | None, grad_entropy: Tensor | None) -> tuple[Tensor | None, None, None]:
        scaled, probs, labels, expected = ctx.saved_tensors
        if grad_logp is None and grad_entropy is None:
            return None, None, None
        logp_weight = grad_logp if grad_logp is not None else torch.zeros_like(expected)
        if grad_entropy is None:
            grad = probs * -logp_weight[:, None]
        else:
            grad = (scaled - expected[:, None]).mul_(grad_entropy[:, None]).add_(logp_weight[:, None]).mul_(probs)
            grad.neg_()
        grad.scatter_add_(-1, labels[:, None], logp_weight[:, None])
        if ctx.temperature != 1.0:
            grad.div_(ctx.temperature)
        return grad.to(ctx.logits_dtype), None, None


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
