"""StarPO losses: clipped policy loss, clipped value loss, entropy, KL, and the off-policy correction
of the policy gradient against the rollout engine's sampling log-probs (TIS: `truncated_importance_weights`,
MIS: `masked_importance_weights`).

Per-token log-probs and entropies of logits are in `rllib_ragen.logits` (engines score with them too).

All per-token tensors are [B, T] with a 0/1 ``mask`` of the tokens that count
(the learner passes the loss mask M_loss, or the advantage mask M_adv for the
value loss). Stats are detached 0-d tensors so that the learner can log them
without a device sync.
"""

from __future__ import annotations

import dataclasses

import torch

from rllib_ragen.checks import check_choice
from rllib_ragen.logits import masked_mean, masked_sum, masked_var, to_bool_mask
from rllib_ragen.training.token_batch import ALL_TOKENS, TOKEN_MASKS

Tensor = torch.Tensor

LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_KINDS = ("k1", "k3", "abs", "mse")


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """The terms of the StarPO loss and the tokens they cover (set with `StarPOConfig.training()`).

    Each field is documented where `StarPOConfig.training()` sets it.
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_dual: float | None = 3.0
    entropy_coeff: float = 0.001
    kl_coeff: float = 0.0
    kl_type: str = "k3"
    value_clip: float | None = 0.5
    vf_loss_coeff: float = 1.0
    loss_agg_mode: str = "token-mean"
    loss_token_mask: str = ALL_TOKENS
    advantage_token_mask: str = ALL_TOKENS

    def __post_init__(self) -> None:
        check_choice("loss_agg_mode", self.loss_agg_mode, LOSS_AGGREGATIONS)
        check_choice("kl_type", self.kl_type, KL_KINDS)
        check_choice("loss_token_mask", self.loss_token_mask, sorted(TOKEN_MASKS))
        check_choice("advantage_token_mask", self.advantage_token_mask, sorted(TOKEN_MASKS))
        if self.kl_coeff < 0 or self.entropy_coeff < 0:
            raise ValueError(f"kl_coeff and entropy_coeff must be >= 0, got {self.kl_coeff}, {self.entropy_coeff}")

    @property
    def needs_token_spans(self) -> bool:
        """A token mask policy other than "all" is set: the learner labels tokens with protocol spans."""
        return (self.loss_token_mask, self.advantage_token_mask) != (ALL_TOKENS, ALL_TOKENS)


# exp() of a log-ratio beyond this overflows float32 long before it is meaningful.
_MAX_LOG_RATIO = 20.0


def aggregate_loss(loss: Tensor, mask: Tensor, *, loss_agg_mode: str = "token-mean") -> Tensor:
    """Reduces a per-token loss [B, T] to a scalar.

    - "token-mean": mean over every masked token of the batch (long
      responses weigh more; RAGEN's default).
    - "seq-mean-token-mean": mean per row, then mean over rows.
    - "seq-mean-token-sum": sum per row, then mean over rows.

    Rows without masked tokens are left out of the row mean.
    """
    if loss_agg_mode not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {loss_agg_mode!r}; choose one of {list(LOSS_AGGREGATIONS)}")
    mask = to_bool_mask(mask, shape=loss.shape)
    if loss_agg_mode == "token-mean":
        return masked_mean(loss, mask)
    per_row = masked_sum(loss, mask, dim=1)
    if loss_agg_mode == "seq-mean-token-mean":
        per_row = per_row / mask.sum(dim=1).clamp(min=1)
    return masked_mean(per_row, mask.any(dim=1))


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_dual: float | None = 3.0,
    loss_agg_mode: str = "token-mean",
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO policy loss with decoupled clipping and dual clipping (StarPO-S).

    ``ratio = exp(logp - old_logp)``;
    ``pg = max(-A * ratio, -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))``;
    for ``A < 0`` the dual clip bounds it: ``pg = min(pg, -A * clip_ratio_dual)``.

    Args:
        logp, old_logp, advantages, mask: [B, T].
        clip_ratio_low: Lower clip range, in [0, 1).
        clip_ratio_high: Upper clip range, >= 0.
        clip_ratio_dual: Dual-clip constant, > 1; None disables dual clipping.
        loss_agg_mode: See :func:`aggregate_loss`.
        weights: [B, T] constant per-token factors of the clipped loss before
            aggregation (off-policy correction, `rllib_ragen.training.losses`); None = 1.

    Returns:
        The scalar loss and stats: ``clip_frac_low`` (A < 0, ratio < 1 - low),
        ``clip_frac_high`` (A > 0, ratio > 1 + high), ``clip_frac_dual``
        (A < 0, ratio > clip_ratio_dual), ``approx_kl`` (mean old_logp - logp) and
        ``ratio_mean``, all over the masked tokens.
    """
    _check_clips(clip_ratio_low, clip_ratio_high, clip_ratio_dual)
    mask = to_bool_mask(mask, shape=logp.shape)
    _check_same_shape(logp, old_logp=old_logp, advantages=advantages)
    log_ratio = (logp - old_logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    clipped = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high))
    negative = advantages < 0
    if clip_ratio_dual is not None:
        clipped = torch.where(negative, torch.minimum(clipped, -advantages * clip_ratio_dual), clipped)
    if weights is not None:
        _check_same_shape(logp, weights=weights)
        clipped = clipped * weights.detach()
    with torch.no_grad():
        dual = negative & (ratio > clip_ratio_dual) if clip_ratio_dual is not None else torch.zeros_like(mask)
        stats = {
            "clip_frac_low": masked_mean((negative & (ratio < 1 - clip_ratio_low)).float(), mask),
            "clip_frac_high": masked_mean(((advantages > 0) & (ratio > 1 + clip_ratio_high)).float(), mask),
            "clip_frac_dual": masked_mean(dual.float(), mask),
            "approx_kl": masked_mean(-log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return aggregate_loss(clipped, mask, loss_agg_mode=loss_agg_mode), stats


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    value_clip: float | None = 0.5,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss: ``0.5 * max((v - R)^2, (old_v + clip(v - old_v, -c, c) - R)^2)``.

    Args:
        values: [B, T] current critic values.
        old_values: [B, T] critic values at rollout time.
        returns: [B, T] targets.
        mask: [B, T] 0/1.
        value_clip: Clip range ``c`` > 0; None gives the plain ``0.5 * (v - R)^2``.
        loss_agg_mode: See :func:`aggregate_loss`.

    Returns:
        The scalar loss and stats: ``vf_clip_frac`` (tokens where the clipped
        term is the larger) and ``vf_explained_var`` (``1 - Var(R - v) / Var(R)``
        over the masked tokens, floored at -1).
    """
    if value_clip is not None and value_clip <= 0:
        raise ValueError(f"value_clip must be > 0 or None, got {value_clip}")
    mask = to_bool_mask(mask, shape=values.shape)
    _check_same_shape(values, old_values=old_values, returns=returns)
    unclipped = (values - returns).square()
    loss = unclipped
    if value_clip is not None:
        clipped_values = old_values + (values - old_values).clamp(-value_clip, value_clip)
        clipped = (clipped_values - returns).square()
        loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        clip_frac = masked_mean((loss > unclipped).float(), mask)
        explained = 1 - masked_var(returns - values, mask, unbiased=False) / masked_var(
            returns, mask, unbiased=False
        ).clamp(min=1e-8)
        stats = {"vf_clip_frac": clip_frac, "vf_explained_var": explained.clamp(min=-1.0)}
    return 0.5 * aggregate_loss(loss, mask, loss_agg_mode=loss_agg_mode), stats


def kl_penalty(logp: Tensor, ref_logp: Tensor, *, kl_type: str = "k3") -> Tensor:
    """Per-token estimate of KL(policy || reference) from sampled-token log-probs.

    - "k1": ``logp - ref_logp`` (unbiased, high variance, can be negative).
    - "k3": ``exp(ref - logp) - (ref - logp) - 1`` (unbiased, >= 0, low
      variance), clamped to [-10, 10] as veRL does against outliers.
    - "abs": ``|logp - ref_logp|``.
    - "mse": ``0.5 * (logp - ref_logp)^2``.

    Returns:
        [B, T] penalties (aggregate with :func:`aggregate_loss`).
    """
    _check_same_shape(logp, ref_logp=ref_logp)
    diff = logp - ref_logp
    if kl_type == "k1":
        return diff
    if kl_type == "k3":
        return (torch.exp(-diff) + diff - 1).clamp(-10.0, 10.0)
    if kl_type == "abs":
        return diff.abs()
    if kl_type == "mse":
        return 0.5 * diff.square()
    raise ValueError(f"unknown kl_type {kl_type!r}; choose one of {list(KL_KINDS)}")


def _check_clips(clip_ratio_low: float, clip_ratio_high: float, clip_ratio_dual: float | None) -> None:
    if not 0 <= clip_ratio_low < 1:
        raise ValueError(f"clip_ratio_low must be in [0, 1), got {clip_ratio_low}")
    if clip_ratio_high < 0:
        raise ValueError(f"clip_ratio_high must be >= 0, got {clip_ratio_high}")
    if clip_ratio_dual is not None and clip_ratio_dual <= 1:
        raise ValueError(f"clip_ratio_dual (dual clip) must be > 1 or None to disable it, got {clip_ratio_dual}")


def _check_same_shape(reference: Tensor, **others: Tensor) -> None:
    for name, tensor in others.items():
        if tensor.shape != reference.shape:
            raise ValueError(f"{name} must have shape {tuple(reference.shape)}, got {tuple(tensor.shape)}")


OFF_POLICY_CORRECTIONS = ("none", "tis", "mis")


@dataclasses.dataclass(frozen=True)
class OffPolicyCorrectionSettings:
    """How the policy gradient is corrected for the engine's sampling distribution (set with
    `StarPOConfig.training()`).

    Each field is documented where `StarPOConfig.training()` sets it.
    """

    off_policy_correction: str = "none"
    tis_cap: float = 2.0
    mis_low: float = 0.5
    mis_high: float = 2.0

    def __post_init__(self) -> None:
        if self.off_policy_correction not in OFF_POLICY_CORRECTIONS:
            raise ValueError(
                f"off_policy_correction must be one of {list(OFF_POLICY_CORRECTIONS)}, "
                f"got {self.off_policy_correction!r}"
            )
        if not self.tis_cap > 0:
            raise ValueError(f"tis_cap must be > 0, got {self.tis_cap}")
        if not 0 < self.mis_low <= 1 <= self.mis_high:
            raise ValueError(f"need 0 < mis_low <= 1 <= mis_high, got mis_low={self.mis_low}, mis_high={self.mis_high}")

    def weights(self, old_logp: Tensor, sampling_logp: Tensor, mask: Tensor) -> tuple[Tensor | None, dict[str, Tensor]]:
        """The [B, T] loss weights of the configured mode (None for "none") and their stats."""
        if self.off_policy_correction == "tis":
            return truncated_importance_weights(old_logp, sampling_logp, mask, tis_cap=self.tis_cap)
        if self.off_policy_correction == "mis":
            return masked_importance_weights(
                old_logp, sampling_logp, mask, mis_low=self.mis_low, mis_high=self.mis_high
            )
        return None, {}


def importance_log_ratio(old_logp: Tensor, sampling_logp: Tensor) -> Tensor:
    """``log(pi_old / pi_engine)`` per token, [B, T]; 0 where the engine log-prob is NaN, bounded by +-20."""
    log_ratio = torch.where(torch.isnan(sampling_logp), torch.zeros_like(old_logp), old_logp - sampling_logp)
    return log_ratio.detach().clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)


@torch.no_grad()
def truncated_importance_weights(
    old_logp: Tensor, sampling_logp: Tensor, mask: Tensor, *, tis_cap: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level truncated importance weights ``min(exp(old_logp - sampling_logp), tis_cap)``.

    Args:
        old_logp: [B, T] learner log-probs of the sampled tokens (the PPO ratio's old policy).
        sampling_logp: [B, T] the engine's log-probs of the same tokens.
        mask: [B, T] 0/1, the tokens in the loss.
        tis_cap: Upper bound of a weight.

    Returns:
        [B, T] weights (0 off the mask) and stats over the masked tokens:
        ``is_ratio_mean``, ``is_ratio_max`` (before truncation) and
        ``is_clipped_frac`` (tokens whose ratio exceeded ``tis_cap``).
    """
    mask = to_bool_mask(mask, shape=old_logp.shape)
    ratio = torch.exp(importance_log_ratio(old_logp, sampling_logp))
    weights = torch.where(mask, ratio.clamp(max=tis_cap), torch.zeros_like(ratio))
    return weights, {**_ratio_stats(ratio, mask), "is_clipped_frac": masked_mean((ratio > tis_cap).float(), mask)}


@torch.no_grad()
def masked_importance_weights(
    old_logp: Tensor, sampling_logp: Tensor, mask: Tensor, *, mis_low: float, mis_high: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Sequence-level masking by the geometric-mean importance ratio of each row.

    ``g_b = exp(sum_t mask * log r / sum_t mask)``; row ``b`` keeps weight 1 on its
    masked tokens when ``mis_low <= g_b <= mis_high``, else 0.

    Args:
        old_logp, sampling_logp, mask: [B, T] as in :func:`truncated_importance_weights`.
        mis_low, mis_high: The band of kept geometric-mean ratios.

    Returns:
        [B, T] 0/1 weights and stats: ``is_ratio_mean`` and ``is_ratio_max`` over
        the masked tokens (per token) and ``is_masked_frac`` (rows with tokens
        whose geometric mean left the band).
    """
    mask = to_bool_mask(mask, shape=old_logp.shape)
    log_ratio = importance_log_ratio(old_logp, sampling_logp)
    rows = mask.any(dim=1)
    geometric = torch.exp(masked_sum(log_ratio, mask, dim=1) / mask.sum(dim=1).clamp(min=1))
    kept = (geometric >= mis_low) & (geometric <= mis_high)
    weights = (mask & kept[:, None]).to(old_logp.dtype)
    stats = {**_ratio_stats(torch.exp(log_ratio), mask), "is_masked_frac": masked_mean((~kept).float(), rows)}
    return weights, stats


def _ratio_stats(ratio: Tensor, mask: Tensor) -> dict[str, Tensor]:
    largest = ratio[mask].max() if mask.any() else ratio.new_ones(())
    return {"is_ratio_mean": masked_mean(ratio, mask), "is_ratio_max": largest}
