"""Advantage estimation as step 4 of an iteration runs it (on each learner): the estimator registry,
the settings group, and the post-processing sequence around the pure estimators of `estimators.py`.

The registry gives every estimator, built-in or registered, one calling convention: pack the
tensors into an :class:`AdvantageInputs` and call ``compute_advantages(name, inputs, **hparams)``;
:data:`ADVANTAGE_ESTIMATORS` maps each name to an adapter ``fn(inputs, **hparams)`` over the pure
functions. The registry is per process: register in a module every learner process imports.

`AdvantageSettings` is the settings group (set with `StarPOConfig.training()`).

`estimate_advantages` runs, in this order:
1. the configured estimator (`compute_advantages`) -> advantages and returns [B, T];
2. whitening of critic advantages over the tokens that have them (M_adv), with
   the mean and variance over every learner's tokens when several learners
   train (`whiten_across_learners`);
3. length weighting (RAGEN-2's `grpo_advantage_length_weight`): each trajectory's
   advantages divided by its relative length to the power alpha
   (`length_weighted_advantages`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from rllib_ragen.checks import check_choice
from rllib_ragen.logits import masked_sum, masked_whiten, to_bool_mask
from rllib_ragen.training.advantages.estimators import (
    DEFAULT_DECAY,
    RAE,
    RoleBaselines,
    arpo,
    bi_level_gae,
    brpo,
    gae,
    grpo,
    restrict_to_advantage_mask,
    role_conditioned_advantages,
)
from rllib_ragen.training.distributed import all_reduce_sum, is_distributed
from rllib_ragen.user_registries import add_to_registry

Tensor = torch.Tensor
Estimator = Callable[..., tuple[Tensor, Tensor]]


@dataclasses.dataclass(frozen=True)
class AdvantageInputs:
    """The tensors any estimator may need (layout: `estimators.py`).

    ``values`` are required by the critic-based estimators, ``turn_ends`` by
    ``bi_level_gae``, ``group_ids`` by ``grpo``, ``roles`` [B] (each trajectory's
    role key) and ``role_baselines`` (the learner's, updated in place) by ``rae``. ``advantage_mask`` [B, T] 0/1
    selects the tokens that get advantages (VAGEN's M_adv; None = every
    generated token): GAE estimators run on :meth:`restricted_to_advantage_mask`,
    and :func:`compute_advantages` zeroes every estimator's output elsewhere.
    """

    rewards: Tensor
    generated_mask: Tensor
    values: Tensor | None = None
    turn_ends: Tensor | None = None
    group_ids: Tensor | None = None
    advantage_mask: Tensor | None = None
    roles: tuple[str, ...] | None = None
    role_baselines: RoleBaselines | None = None

    def __post_init__(self) -> None:
        if self.rewards.dim() != 2:
            raise ValueError(f"rewards must be [B, T], got shape {tuple(self.rewards.shape)}")
        to_bool_mask(self.generated_mask, shape=self.rewards.shape)
        for name in ("values", "turn_ends", "advantage_mask"):
            tensor = getattr(self, name)
            if tensor is not None and tensor.shape != self.rewards.shape:
                raise ValueError(f"{name} must have shape {tuple(self.rewards.shape)}, got {tuple(tensor.shape)}")
        if self.group_ids is not None and self.group_ids.shape != self.rewards.shape[:1]:
            raise ValueError(f"group_ids must have shape [{self.rewards.shape[0]}], got {tuple(self.group_ids.shape)}")
        if self.roles is not None and len(self.roles) != self.rewards.shape[0]:
            raise ValueError(f"roles must name {self.rewards.shape[0]} trajectories' roles, got {len(self.roles)}")

    @property
    def scores(self) -> Tensor:
        """[B] trajectory scores: the sum of each row's rewards over its response tokens."""
        return masked_sum(self.rewards.float(), self.generated_mask, dim=1)

    def restricted_to_advantage_mask(self) -> AdvantageInputs:
        """These inputs seen only at ``advantage_mask`` (:func:`restrict_to_advantage_mask`); themselves without one.

        The result's ``generated_mask`` holds the generated tokens inside the advantage mask.
        """
        if self.advantage_mask is None:
            return self
        rewards, kept, turn_ends = restrict_to_advantage_mask(
            self.rewards, self.generated_mask, self.advantage_mask, self.turn_ends
        )
        return dataclasses.replace(self, rewards=rewards, generated_mask=kept, turn_ends=turn_ends, advantage_mask=None)

    @property
    def advantage_tokens(self) -> Tensor:
        """[B, T] bool: the tokens that get advantages (every generated token without an ``advantage_mask``)."""
        generated = to_bool_mask(self.generated_mask, shape=self.rewards.shape)
        if self.advantage_mask is None:
            return generated
        return generated & to_bool_mask(self.advantage_mask, shape=generated.shape)

    def require(self, name: str, estimator: str) -> Tensor:
        """Returns the field ``name``, or raises if the estimator needs it and it is None."""
        tensor = getattr(self, name)
        if tensor is None:
            raise ValueError(f"advantage estimator {estimator!r} needs AdvantageInputs.{name}, got None")
        return tensor


def _gae_estimator(inputs: AdvantageInputs, *, gamma: float, lambda_: float) -> tuple[Tensor, Tensor]:
    inputs = inputs.restricted_to_advantage_mask()
    return gae(inputs.rewards, inputs.require("values", "gae"), inputs.generated_mask, gamma=gamma, lambda_=lambda_)


def _bi_level_gae_estimator(
    inputs: AdvantageInputs,
    *,
    gamma: float,
    lambda_: float,
    high_level_gamma: float,
    high_level_lambda: float | None = None,
) -> tuple[Tensor, Tensor]:
    inputs = inputs.restricted_to_advantage_mask()
    return bi_level_gae(
        inputs.rewards,
        inputs.require("values", "bi_level_gae"),
        inputs.generated_mask,
        inputs.require("turn_ends", "bi_level_gae"),
        gamma=gamma,
        lambda_=lambda_,
        high_level_gamma=high_level_gamma,
        high_level_lambda=high_level_lambda,
    )


def _grpo_estimator(
    inputs: AdvantageInputs, *, eps: float = 1e-6, grpo_norm_by_std: bool = True
) -> tuple[Tensor, Tensor]:
    group_ids = inputs.require("group_ids", "grpo")
    return grpo(inputs.scores, group_ids, inputs.generated_mask, eps=eps, grpo_norm_by_std=grpo_norm_by_std)


def _brpo_estimator(
    inputs: AdvantageInputs, *, eps: float = 1e-6, grpo_norm_by_std: bool = True
) -> tuple[Tensor, Tensor]:
    return brpo(inputs.scores, inputs.generated_mask, eps=eps, grpo_norm_by_std=grpo_norm_by_std)


def _arpo_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    return arpo(inputs.scores, inputs.generated_mask)


def _rae_estimator(inputs: AdvantageInputs, *, rae_decay: float = DEFAULT_DECAY) -> tuple[Tensor, Tensor]:
    """RAE: reads ``inputs.roles`` and updates ``inputs.role_baselines`` (the learner's) in place."""
    roles, state = inputs.roles, inputs.role_baselines
    if roles is None or state is None:
        raise ValueError(
            "advantage estimator 'rae' needs AdvantageInputs.roles and .role_baselines: it runs on two-player "
            "self-play rollouts (`StarPOConfig.self_play()`), whose trajectories name their role"
        )
    per_trajectory, state.values = role_conditioned_advantages(inputs.scores, roles, state.values, decay=rae_decay)
    return arpo(per_trajectory, inputs.generated_mask)  # ARPO broadcasts a trajectory's value over its tokens


ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {
    "gae": _gae_estimator,
    "bi_level_gae": _bi_level_gae_estimator,
    "grpo": _grpo_estimator,
    "brpo": _brpo_estimator,
    "arpo": _arpo_estimator,
    RAE: _rae_estimator,
}


# Estimators that read `AdvantageInputs.values`: the learner keeps a critic for them.
CRITIC_ESTIMATORS: set[str] = {"gae", "bi_level_gae"}


def register_advantage_estimator(
    name: str, estimator: Estimator, *, needs_critic: bool = False, overwrite: bool = False
) -> None:
    """Adds an estimator ``fn(inputs: AdvantageInputs, **hparams) -> (advantages, returns)``.

    Its hyper-parameters are the keyword parameters it declares; the learner
    passes the configured value of each (e.g. ``gamma``, ``lambda_``). The
    registry is per process: register in a module every learner process imports.

    Args:
        name: The name `.training(advantage_estimator=...)` selects it by.
        estimator: The function.
        needs_critic: It reads ``inputs.values``, so the module needs a critic.
        overwrite: Replace an estimator of the same name.
    """
    add_to_registry(ADVANTAGE_ESTIMATORS, "advantage estimator", name, estimator, overwrite=overwrite)
    (CRITIC_ESTIMATORS.add if needs_critic else CRITIC_ESTIMATORS.discard)(name)


def needs_critic(name: str) -> bool:
    """Estimator ``name`` reads ``AdvantageInputs.values``, so the module needs a critic."""
    get_advantage_estimator(name)
    return name in CRITIC_ESTIMATORS


def critic_free_estimators() -> list[str]:
    """The registered estimators that need no critic, sorted."""
    return sorted(set(ADVANTAGE_ESTIMATORS) - CRITIC_ESTIMATORS)


def unregister_advantage_estimator(name: str) -> None:
    """Removes a registered estimator (e.g. a test's)."""
    get_advantage_estimator(name)
    ADVANTAGE_ESTIMATORS.pop(name)
    CRITIC_ESTIMATORS.discard(name)


def estimator_hparam_names(name: str) -> tuple[str, ...]:
    """The keyword hyper-parameters estimator ``name`` declares (its defaults are declared there too)."""
    return tuple(p.name for p in list(inspect.signature(get_advantage_estimator(name)).parameters.values())[1:])


def get_advantage_estimator(name: str) -> Estimator:
    """Returns the estimator ``fn(inputs: AdvantageInputs, **hparams) -> (advantages, returns)``."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise KeyError(f"unknown advantage estimator {name!r}; choose one of {sorted(ADVANTAGE_ESTIMATORS)}") from None


def compute_advantages(name: str, inputs: AdvantageInputs, **hparams: float | bool | None) -> tuple[Tensor, Tensor]:
    """Runs the estimator ``name`` on ``inputs``; the learner's single entry point.

    Args:
        name: A key of :data:`ADVANTAGE_ESTIMATORS`.
        inputs: The batch tensors.
        **hparams: The estimator's keyword arguments, e.g. ``gamma=1.0, lambda_=1.0``.

    Returns:
        advantages [B, T], returns [B, T], both without gradient and 0 outside
        ``inputs.advantage_tokens``.
    """
    estimator = get_advantage_estimator(name)
    _check_hparams(name, estimator, hparams)
    # Advantages and critic targets are constants of the loss: never backpropagate into them.
    with torch.no_grad():
        advantages, returns = estimator(inputs, **hparams)
        if inputs.advantage_mask is not None:
            # Critic-free estimators broadcast over every generated token: M_adv keeps its own.
            kept = inputs.advantage_tokens
            advantages, returns = (torch.where(kept, x, torch.zeros_like(x)) for x in (advantages, returns))
    return advantages, returns


def _check_hparams(name: str, estimator: Estimator, hparams: Mapping[str, object]) -> None:
    params = list(inspect.signature(estimator).parameters.values())[1:]
    allowed = {p.name for p in params}
    required = {p.name for p in params if p.default is inspect.Parameter.empty}
    unknown = sorted(set(hparams) - allowed)
    missing = sorted(required - set(hparams))
    if unknown or missing:
        raise ValueError(
            f"advantage estimator {name!r}: unknown hparams {unknown}, missing hparams {missing}; "
            f"it takes {sorted(allowed)} (required: {sorted(required)})"
        )


@dataclasses.dataclass(frozen=True)
class AdvantageSettings:
    """How advantages are estimated (set with `StarPOConfig.training()`).

    The named settings are the hyper-parameters of the built-in estimators;
    `advantage_hparams` sets any other keyword an estimator declares (grpo's
    ``eps``, bi_level_gae's ``high_level_lambda``, a registered estimator's own),
    whose defaults stay declared once, in the estimator's signature.

    Each field is documented where `StarPOConfig.training()` sets it.
    """

    advantage_estimator: str = "gae"
    gamma: float = 1.0
    lambda_: float = 1.0
    high_level_gamma: float = 0.95
    whiten_advantages: bool = True
    grpo_norm_by_std: bool = True
    advantage_hparams: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        check_choice("advantage_estimator", self.advantage_estimator, sorted(ADVANTAGE_ESTIMATORS))
        declared = estimator_hparam_names(self.advantage_estimator)
        unknown = sorted(set(self.advantage_hparams) - set(declared))
        if unknown:
            raise ValueError(
                f"advantage_hparams {unknown} are not hyper-parameters of advantage estimator "
                f"{self.advantage_estimator!r}; it declares {list(declared)}"
            )

    def hparams(self) -> dict[str, Any]:
        """The configured value of every hyper-parameter the estimator declares and the config sets."""
        # The estimators' parameters carry the settings' own names, so a setting is passed as itself.
        named = ("gamma", "lambda_", "high_level_gamma", "grpo_norm_by_std")
        declared = estimator_hparam_names(self.advantage_estimator)
        return {name: getattr(self, name) for name in declared if name in named} | dict(self.advantage_hparams)

    @property
    def needs_critic(self) -> bool:
        return needs_critic(self.advantage_estimator)


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
