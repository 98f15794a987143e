"""Per-token log-probs and entropies from logits, chunked so no [B, T, V] float32 copy exists.

Shared by the learner (`rllib_ragen.training.module`) and the engines that
score sampled tokens (`rllib_ragen.inference.hf_engine`, the weight-sync check).
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
