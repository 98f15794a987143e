"""The advantages of step 4 of an iteration, as one post-processing sequence (on each learner).

`estimate_advantages` runs, in this order:
1. the configured estimator (`user_registries.py`) -> advantages and returns [B, T];
2. whitening of critic advantages over the tokens that have them (M_adv), with
   the mean and variance over every learner's tokens when several learners
   train (`whiten_across_learners`);
3. length weighting (RAGEN-2's `grpo_advantage_length_weight`): each trajectory's
   advantages divided by its relative length to the power alpha
   (`length_weighted_advantages`).
The learner connector piece `GroupAdvantages` calls it on every learner.
"""

from __future__ import annotations

import dataclasses

import torch

from rllib_ragen.logits import masked_sum, masked_whiten, to_bool_mask
from rllib_ragen.training.advantages.advantage_settings import AdvantageSettings
from rllib_ragen.training.advantages.estimator_registry import AdvantageInputs, compute_advantages
from rllib_ragen.training.distributed import all_reduce_sum, is_distributed

Tensor = torch.Tensor


@dataclasses.dataclass(frozen=True)
class EstimatedAdvantages:
    """What `estimate_advantages` returns.

    Attributes:
        advantages: [B, T], 0 outside the advantage mask.
        returns: [B, T] the critic's targets (the estimator's, before whitening).
        length_weights: [B] each trajectory's length weight; None when length weighting is off.
    """

    advantages: Tensor
    returns: Tensor
    length_weights: Tensor | None = None


def estimate_advantages(
    inputs: AdvantageInputs, settings: AdvantageSettings, *, length_weight: float
) -> EstimatedAdvantages:
    """Estimates, whitens and length-weights the advantages of one batch (see the module docstring).

    Args:
        inputs: The batch's tensors ([B, T] each, one row per trajectory).
        settings: The estimator, its hyper-parameters and whether to whiten.
        length_weight: The exponent alpha of length weighting (`advantage_length_weight`); 0 = off.
    """
    advantages, returns = compute_advantages(settings.advantage_estimator, inputs, **settings.hparams())
    if settings.whiten_advantages and settings.needs_critic and _can_whiten(inputs.advantage_tokens):
        advantages = whiten_across_learners(advantages, inputs.advantage_tokens)
    if length_weight <= 0:
        return EstimatedAdvantages(advantages, returns)
    advantages, weights = length_weighted_advantages(advantages, inputs.generated_mask, alpha=length_weight)
    return EstimatedAdvantages(advantages, returns, weights)


def _can_whiten(advantage_tokens: Tensor) -> bool:
    """A selective M_adv (say "answer_only" before the model writes well-formed answers) may
    leave fewer than 2 tokens, whose zero advantages stay as they are. Several learners
    always whiten together (each takes part in the all-reduce; too few tokens overall is an error)."""
    return is_distributed() or int(advantage_tokens.sum()) >= 2


def whiten_across_learners(x: Tensor, mask: Tensor, *, eps: float = 1e-8) -> Tensor:
    """`masked_whiten` with the mean and unbiased variance over every learner's masked values.

    Args:
        x: [B, T] values.
        mask: [B, T] 0/1.

    Returns:
        [B, T] whitened values, 0 on padding.
    """
    if not is_distributed():
        return masked_whiten(x, mask, eps=eps)
    mask = to_bool_mask(mask, shape=x.shape)
    x = x.float()
    count = all_reduce_sum(mask.sum().float())
    if count < 2:
        raise ValueError(f"whitening needs >= 2 advantage tokens over all learners, got {int(count)}")
    mean = all_reduce_sum(masked_sum(x, mask)) / count
    var = all_reduce_sum(masked_sum((x - mean).square(), mask)) / (count - 1)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    return torch.where(mask, whitened, torch.zeros_like(whitened))


def length_weighted_advantages(advantages: Tensor, mask: Tensor, *, alpha: float) -> tuple[Tensor, Tensor]:
    """Divides each trajectory's advantages by its relative length to the power ``alpha``.

    ``w_i = (L_i / mean_j L_j) ** -alpha`` with ``L_i`` the masked tokens of
    row ``i``, over the rows that have any.

    Args:
        advantages: [B, T].
        mask: [B, T] 0/1, the generated tokens.
        alpha: Exponent >= 0; 0 leaves the advantages as they are.

    Returns:
        advantages * w [B, T] (0 on padding), and the weights w [B] (1 for empty rows).
    """
    mask = to_bool_mask(mask, shape=advantages.shape)
    lengths = mask.sum(dim=1).float()
    present = lengths > 0
    mean_length = lengths[present].mean() if present.any() else lengths.new_ones(())
    weights = torch.where(present, (lengths / mean_length).pow(-alpha), torch.ones_like(lengths))
    weighted = torch.where(mask, advantages * weights[:, None], torch.zeros_like(advantages))
    return weighted, weights
