"""Off-policy correction of the policy gradient against the rollout engine's sampling log-probs.

The engine samples with its own weights and numerics (a bf16 engine, or weights
some versions old with asynchronous rollouts), so the tokens come from
``pi_engine``, not from the learner's ``pi_old`` the PPO ratio starts from. The
per-token ratio ``r = pi_old / pi_engine = exp(old_logp - sampling_logp)``
corrects for that:

- "none": no correction (the ratio is only logged by the learner).
- "tis": truncated importance sampling, token level: the policy-gradient loss of
  each token is multiplied by ``min(r, tis_cap)``.
- "mis": masked importance sampling, sequence level: a row whose geometric-mean
  ratio ``exp(mean log r)`` over its tokens leaves ``[mis_low, mis_high]`` gets
  weight 0 (it stays in the token-mean's denominator), the others weight 1.

Defaults: TRL's importance-sampling cap is 2.0; the MIS band is that cap and its
reciprocal, symmetric in log space. The weights are constants of the loss (no
gradient flows through them). A token whose engine log-prob is unknown (NaN, e.g.
a demonstration) counts as on-policy (``log r = 0``).
"""

from __future__ import annotations

import dataclasses

import torch

from rllib_ragen.logits import masked_mean, masked_sum, to_bool_mask

Tensor = torch.Tensor

OFF_POLICY_CORRECTIONS = ("none", "tis", "mis")

# exp() of a log-ratio beyond this overflows float32 long before it is meaningful.
_MAX_LOG_RATIO = 20.0


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
