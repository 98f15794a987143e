"""The advantage-estimator registry: one calling convention for every estimator, built-in or registered.

Pack the tensors into an :class:`AdvantageInputs` and call
``compute_advantages(name, inputs, **hparams)``; :data:`ADVANTAGE_ESTIMATORS`
maps each name to an adapter ``fn(inputs, **hparams)`` over the pure functions
of `estimators.py`. The registry is per process: register in a module every
learner process imports.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping

import torch

from rllib_ragen.logits import masked_sum, to_bool_mask
from rllib_ragen.training.advantages.estimators import arpo, bi_level_gae, brpo, gae, grpo, restrict_to_advantage_mask
from rllib_ragen.user_registries import add_to_registry

Tensor = torch.Tensor
Estimator = Callable[..., tuple[Tensor, Tensor]]


@dataclasses.dataclass(frozen=True)
class AdvantageInputs:
    """The tensors any estimator may need (layout: `estimators.py`).

    ``values`` are required by the critic-based estimators, ``turn_ends`` by
    ``bi_level_gae`` and ``group_ids`` by ``grpo``. ``advantage_mask`` [B, T] 0/1
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


ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {
    "gae": _gae_estimator,
    "bi_level_gae": _bi_level_gae_estimator,
    "grpo": _grpo_estimator,
    "brpo": _brpo_estimator,
    "arpo": _arpo_estimator,
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
