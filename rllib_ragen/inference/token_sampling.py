"""Next-token sampling math shared by the in-process engine and its tests.

It follows vLLM's sampler with `logprobs_mode="processed_logprobs"`, so both
engines return the same log-probabilities for the same weights: the reported
log-prob of a token is taken under the distribution it was drawn from, i.e.
after temperature and the top-p cut. Greedy decoding (temperature 0) reports
plain `log_softmax(logits)` and ignores top-p, as vLLM does.
"""

from __future__ import annotations

import torch
from torch import Tensor


def mask_top_p(logits: Tensor, top_p: float) -> Tensor:
    """Keeps the smallest set of tokens whose probability mass reaches `top_p`.

    The rest get -inf. The most likely token always survives. Same rule as
    vLLM: a token is dropped when the cumulative mass of the tokens *less*
    likely than or as likely as it is <= 1 - top_p.

    Args:
        logits: [B, V] float logits (already temperature-scaled).
        top_p: Nucleus mass in (0, 1]; 1 returns `logits` unchanged.

    Returns:
        [B, V] logits with the dropped tokens at -inf.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= 1.0 - top_p
    drop[:, -1] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def processed_logprobs(logits: Tensor, *, temperature: float, top_p: float = 1.0) -> Tensor:
    """Log-probabilities of the distribution a token is sampled from.

    Args:
        logits: [B, V] raw next-token logits (any float dtype).
        temperature: Softmax temperature; 0 means greedy (reported at temperature 1).
        top_p: Nucleus mass; ignored when greedy.

    Returns:
        [B, V] float32 log-probabilities (-inf outside the nucleus).
    """
    logits = logits.float()
    if temperature == 0:
        return logits.log_softmax(dim=-1)
    return mask_top_p(logits / temperature, top_p).log_softmax(dim=-1)


def choose_tokens(logprobs: Tensor, *, greedy: bool, generator: torch.Generator | None = None) -> Tensor:
    """Picks one token per row: the argmax, or a draw from `exp(logprobs)`.

    Args:
        logprobs: [B, V] log-probabilities (from `processed_logprobs`).
        greedy: Take the argmax instead of sampling.
        generator: Random source for sampling (None = torch's global one).

    Returns:
        [B] int64 token ids.
    """
    if greedy:
        return logprobs.argmax(dim=-1)
    return draw_by_inverse_cdf(logprobs.exp(), generator=generator)


def draw_by_inverse_cdf(probs: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
    """One draw per row from `probs`: a single uniform number per row, located in the row's cumulative sum.

    The same distribution as `torch.multinomial(probs, 1)`, faster on CPU
    (`benchmarks/token_sampling.py`): multinomial spends its time on
    per-element random numbers. The sum runs in float64, so
    rare tokens keep their mass, and the right-sided search never returns a token
    of zero probability.

    Args:
        probs: [B, V] non-negative weights, each row with positive mass (need not sum to 1).
        generator: Random source (None = torch's global one), on `probs`'s device.

    Returns:
        [B] int64 token ids.
    """
    cumulative = probs.double().cumsum(dim=-1)
    uniform = torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64, device=probs.device)
    chosen = torch.searchsorted(cumulative, uniform * cumulative[:, -1:], right=True).squeeze(-1)
    past_end = chosen == probs.shape[-1]
    if past_end.any():  # the product rounded up to the row's total: the last token with mass is the draw
        has_mass = probs[past_end] > 0
        chosen[past_end] = probs.shape[-1] - 1 - has_mass.flip(-1).int().argmax(dim=-1)
    return chosen
