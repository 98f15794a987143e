"""Advantage estimators for StarPO: GAE, bi-level GAE, GRPO, BRPO, ARPO.

Data layout (one row per trajectory): the response tokens of all turns of a
trajectory are concatenated in order and right-padded to ``T``.

- ``mask``      [B, T] 0/1: real response tokens.
- ``rewards``   [B, T]: each turn's reward on that turn's last response token
  (a trajectory-level reward sits on the trajectory's last token).
- ``turn_ends`` [B, T] 0/1: the last response token of each turn.
- ``values``    [B, T]: critic value of each response token.
- ``group_ids`` [B] int: trajectories started from the same initial state share one.

Every estimator returns ``(advantages [B, T], returns [B, T])``, both 0 on
padding. ``returns`` are the critic's targets; critic-free estimators (GRPO,
BRPO, ARPO) have no critic and return their advantages as ``returns``.

Uniform calling convention for the learner: pack the tensors into an
:class:`AdvantageInputs` and call ``compute_advantages(name, inputs, **hparams)``;
the registry :data:`ADVANTAGE_ESTIMATORS` maps each name to an adapter
``fn(inputs, **hparams)``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from rllib_ragen.checks import check_choice
from rllib_ragen.masked import masked_sum, to_bool_mask
from rllib_ragen.registry import add_to_registry

Tensor = torch.Tensor
Estimator = Callable[..., tuple[Tensor, Tensor]]


# ------------------------------------------------------------------ group statistics


@dataclasses.dataclass(frozen=True)
class GroupStatistics:
    """Per-group statistics of trajectory scores.

    Attributes:
        ids: [G] sorted distinct group ids.
        index: [B] position in ``ids`` of each trajectory's group.
        count, mean, std, min, max: [G] per group. ``std`` is unbiased
            (``torch.std``'s default, as in veRL/RAGEN); it is 0 for a group of
            one trajectory, which has no spread.
    """

    ids: Tensor
    index: Tensor
    count: Tensor
    mean: Tensor
    std: Tensor
    min: Tensor
    max: Tensor


def group_statistics(scores: Tensor, group_ids: Tensor) -> GroupStatistics:
    """Computes :class:`GroupStatistics` of ``scores`` [B] grouped by ``group_ids`` [B]."""
    _check_scores_and_groups(scores, group_ids)
    ids, index = torch.unique(group_ids, sorted=True, return_inverse=True)
    n_groups = ids.numel()
    # At least float32, and every buffer in the scores' dtype: never the default dtype, which
    # `torch.set_default_dtype` may have made float64 while the scores are float32.
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    like: dict[str, Any] = {"dtype": scores.dtype, "device": scores.device}
    count = torch.zeros(n_groups, **like).index_add_(0, index, torch.ones_like(scores))
    total = torch.zeros(n_groups, **like).index_add_(0, index, scores)
    mean = total / count
    sq_dev = torch.zeros(n_groups, **like).index_add_(0, index, (scores - mean[index]).square())
    std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))
    low = torch.full((n_groups,), torch.inf, **like).scatter_reduce(0, index, scores, "amin")
    high = torch.full((n_groups,), -torch.inf, **like).scatter_reduce(0, index, scores, "amax")
    return GroupStatistics(ids=ids, index=index, count=count, mean=mean, std=std, min=low, max=high)


def _check_scores_and_groups(scores: Tensor, group_ids: Tensor) -> None:
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [B], got shape {tuple(scores.shape)}")
    if group_ids.shape != scores.shape:
        raise ValueError(f"group_ids must have shape {tuple(scores.shape)} like scores, got {tuple(group_ids.shape)}")
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    if scores.numel() == 0:
        raise ValueError("scores is empty: need at least one trajectory")


# ---------------------------------------------------------------------- estimators


def gae(rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Token-level generalised advantage estimation over the masked tokens.

    Padding is skipped: the "next" token of a response token is the next
    *masked* token of its row, and the value after a row's last token is 0.
    ``delta_i = r_i + gamma * v_next - v_i``; ``A_i = delta_i + gamma * lam * A_next``.

    Args:
        rewards: [B, T], zero on padding.
        values: [B, T] critic values.
        mask: [B, T] 0/1.
        gamma: Discount.
        lam: GAE lambda.

    Returns:
        advantages [B, T], returns = advantages + values [B, T]; 0 on padding.
    """
    mask = _check_token_tensors(rewards, values, mask)
    _check_rewards_only_on(rewards, mask, "response tokens (mask)")
    zero = rewards.new_zeros(rewards.shape[0])
    next_value, next_adv = zero, zero
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        live = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        next_value = torch.where(live, values[:, t], next_value)
        next_adv = torch.where(live, adv, next_adv)
        advantages[:, t] = torch.where(live, adv, zero)
    return advantages, _returns(advantages, values, mask)


def bi_level_gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    turn_ends: Tensor,
    *,
    gamma: float,
    lam: float,
    high_level_gamma: float,
    high_level_lam: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Bi-level GAE (RAGEN / VAGEN): turn-level GAE whose result seeds a token-level GAE per turn.

    Rule, per row, with turns ``k = 1..K`` and ``e_k`` the last token of turn k:

    1. Turn level (``gh = high_level_gamma``, ``lh = high_level_lam``):
       ``V_k = values[e_k]``, ``V_{K+1} = 0``, ``A_{K+1} = 0``,
       ``delta_k = r_k + gh * V_{k+1} - V_k``, ``A_k = delta_k + gh * lh * A_{k+1}``.
    2. ``advantage[e_k] = A_k``: the turn's last token sees a terminal reward equal
       to the turn-level return ``A_k + V_k`` and no value after it.
    3. Token level inside turn k, backward from ``e_k`` over the turn's other
       tokens ``i``: ``A_i = (gamma * v_{i+1} - v_i) + gamma * lam * A_{i+1}``
       (no rewards inside a turn; ``i+1`` is the next masked token).
    4. ``returns = advantages + values`` on every token.

    With ``gamma = lam = 1`` a token's advantage is its turn's return minus its value.

    Args:
        rewards: [B, T], non-zero only on turn ends.
        values: [B, T] critic values.
        mask: [B, T] 0/1.
        turn_ends: [B, T] 0/1, inside ``mask``; every row's last masked token is one.
        gamma, lam: Token-level discount and lambda.
        high_level_gamma: Turn-level discount (RAGEN: 0.95).
        high_level_lam: Turn-level lambda; None uses ``lam`` (RAGEN's choice).

    Returns:
        advantages [B, T], returns [B, T]; 0 on padding.
    """
    mask = _check_token_tensors(rewards, values, mask)
    ends = _check_turn_ends(turn_ends, mask)
    _check_rewards_only_on(rewards, ends, "turn ends (turn_ends)")
    turn_lam = lam if high_level_lam is None else high_level_lam
    zero = rewards.new_zeros(rewards.shape[0])
    next_turn_value, next_turn_adv = zero, zero
    next_value, next_adv = zero, zero
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        live, end, value = mask[:, t], ends[:, t], values[:, t]
        turn_delta = rewards[:, t] + high_level_gamma * next_turn_value - value
        turn_adv = turn_delta + high_level_gamma * turn_lam * next_turn_adv
        token_adv = gamma * next_value - value + gamma * lam * next_adv
        adv = torch.where(end, turn_adv, token_adv)
        next_turn_value = torch.where(end, value, next_turn_value)
        next_turn_adv = torch.where(end, turn_adv, next_turn_adv)
        next_value = torch.where(live, value, next_value)
        next_adv = torch.where(live, adv, next_adv)
        advantages[:, t] = torch.where(live, adv, zero)
    return advantages, _returns(advantages, values, mask)


def grpo(
    scores: Tensor, group_ids: Tensor, mask: Tensor, *, eps: float = 1e-6, norm_by_std: bool = True
) -> tuple[Tensor, Tensor]:
    """GRPO: each trajectory's score normalised within its group.

    ``A = (score - group mean) / (group std + eps)`` with the unbiased std
    (``torch.std``, as veRL/RAGEN), broadcast over the row's response tokens.
    A group of one trajectory gets advantage 0: it has nothing to be compared
    with (veRL instead passes its raw score through).

    Args:
        scores: [B] trajectory scores (sum of the trajectory's rewards).
        group_ids: [B] int group of each trajectory.
        mask: [B, T] 0/1.
        eps: Added to the std.
        norm_by_std: If False only the group mean is subtracted (Dr. GRPO).

    Returns:
        advantages [B, T], returns = advantages.
    """
    stats = group_statistics(scores, group_ids)
    centred = scores.to(stats.mean.dtype) - stats.mean[stats.index]
    per_traj = centred / (stats.std[stats.index] + eps) if norm_by_std else centred
    advantages = _broadcast_over_tokens(per_traj, mask)
    return advantages, advantages


def brpo(scores: Tensor, mask: Tensor, *, eps: float = 1e-6, norm_by_std: bool = True) -> tuple[Tensor, Tensor]:
    """BRPO: GRPO with the whole batch as one group (a batch of one gets 0).

    Args:
        scores: [B] trajectory scores.
        mask: [B, T] 0/1.

    Returns:
        advantages [B, T], returns = advantages.
    """
    return grpo(scores, torch.zeros_like(scores, dtype=torch.long), mask, eps=eps, norm_by_std=norm_by_std)


def arpo(scores: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """ARPO: the raw trajectory score as every response token's advantage.

    Args:
        scores: [B] trajectory scores.
        mask: [B, T] 0/1.

    Returns:
        advantages [B, T], returns = advantages.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [B], got shape {tuple(scores.shape)}")
    advantages = _broadcast_over_tokens(scores.float(), mask)
    return advantages, advantages


def restrict_to_selected(
    rewards: Tensor, mask: Tensor, selected: Tensor, turn_ends: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The token MDP seen only at ``selected`` positions (VAGEN's advantage mask M_adv).

    GAE on the result has values and advantages at the selected tokens only,
    and credit passes over the others: the "next" token of a selected token is
    the next selected one of its row. So that no reward is skipped with them,
    each reward moves to the last selected token at or before it (it follows
    that token's action); a reward before a row's first selected token has no
    state to follow and is dropped. A turn's last selected token becomes its
    end; a turn with none selected merges into the turn before it.

    Args:
        rewards: [B, T], zero on padding.
        mask: [B, T] 0/1, the response tokens.
        selected: [B, T] 0/1, the tokens that take part in advantage estimation.
        turn_ends: [B, T] 0/1, inside ``mask``, or None.

    Returns:
        rewards [B, T] (on selected tokens only), mask & selected [B, T] bool,
        turn ends [B, T] bool of the selected tokens (None if not given).
    """
    kept = to_bool_mask(mask, shape=rewards.shape) & to_bool_mask(selected, shape=rewards.shape, name="selected")
    positions = torch.arange(rewards.shape[1], device=rewards.device).expand_as(kept)
    last_kept = torch.where(kept, positions, -1).cummax(dim=1).values
    credited = torch.where(last_kept >= 0, rewards, torch.zeros_like(rewards))
    moved = torch.zeros_like(rewards).scatter_add_(1, last_kept.clamp(min=0), credited)
    if turn_ends is None:
        return moved, kept, None
    ends = to_bool_mask(turn_ends, shape=rewards.shape, name="turn_ends")
    turn_of = ends.long().cumsum(dim=1) - ends.long()
    width = rewards.shape[1]
    next_kept = torch.where(kept, positions, width).flip(1).cummin(dim=1).values.flip(1)
    after = torch.cat([next_kept[:, 1:], torch.full_like(next_kept[:, :1], width)], dim=1)
    next_turn = torch.cat([turn_of, torch.full_like(turn_of[:, :1], -1)], dim=1).gather(1, after)
    return moved, kept, kept & (next_turn != turn_of)


def _broadcast_over_tokens(per_traj: Tensor, mask: Tensor) -> Tensor:
    if mask.dim() != 2 or mask.shape[0] != per_traj.shape[0]:
        raise ValueError(f"mask must have shape [{per_traj.shape[0]}, T], got {tuple(mask.shape)}")
    mask = to_bool_mask(mask, shape=mask.shape)
    return torch.where(mask, per_traj[:, None], torch.zeros((), dtype=per_traj.dtype, device=per_traj.device))


def _returns(advantages: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, advantages + values, torch.zeros_like(advantages))


def _check_token_tensors(rewards: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [B, T], got shape {tuple(rewards.shape)}")
    if values.shape != rewards.shape:
        raise ValueError(f"values must have shape {tuple(rewards.shape)} like rewards, got {tuple(values.shape)}")
    return to_bool_mask(mask, shape=rewards.shape)


def _check_turn_ends(turn_ends: Tensor, mask: Tensor) -> Tensor:
    ends = to_bool_mask(turn_ends, shape=mask.shape, name="turn_ends")
    if torch.any(ends & ~mask):
        raise ValueError("turn_ends marks a padding token: every turn end must be a response token")
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=1).values
    rows = torch.nonzero(last >= 0).squeeze(1)
    if not torch.all(ends[rows, last[rows]]):
        raise ValueError("every row's last response token must be a turn end (an unfinished turn?)")
    return ends


def _check_rewards_only_on(rewards: Tensor, allowed: Tensor, where: str) -> None:
    if torch.any((rewards != 0) & ~allowed):
        raise ValueError(f"rewards must be 0 outside {where}; they would be silently ignored")


# ------------------------------------------------------------------------ registry


@dataclasses.dataclass(frozen=True)
class AdvantageInputs:
    """The tensors any estimator may need (see the module docstring for layout).

    ``values`` are required by the critic-based estimators, ``turn_ends`` by
    ``bi_level_gae`` and ``group_ids`` by ``grpo``. ``adv_mask`` [B, T] 0/1
    selects the tokens that get advantages (VAGEN's M_adv; None = all of
    ``mask``): GAE estimators run on :meth:`selected`, and
    :func:`compute_advantages` zeroes every estimator's output elsewhere.
    """

    rewards: Tensor
    mask: Tensor
    values: Tensor | None = None
    turn_ends: Tensor | None = None
    group_ids: Tensor | None = None
    adv_mask: Tensor | None = None

    def __post_init__(self) -> None:
        if self.rewards.dim() != 2:
            raise ValueError(f"rewards must be [B, T], got shape {tuple(self.rewards.shape)}")
        to_bool_mask(self.mask, shape=self.rewards.shape)
        for name in ("values", "turn_ends", "adv_mask"):
            tensor = getattr(self, name)
            if tensor is not None and tensor.shape != self.rewards.shape:
                raise ValueError(f"{name} must have shape {tuple(self.rewards.shape)}, got {tuple(tensor.shape)}")
        if self.group_ids is not None and self.group_ids.shape != self.rewards.shape[:1]:
            raise ValueError(f"group_ids must have shape [{self.rewards.shape[0]}], got {tuple(self.group_ids.shape)}")

    @property
    def scores(self) -> Tensor:
        """[B] trajectory scores: the sum of each row's rewards over its response tokens."""
        return masked_sum(self.rewards.float(), self.mask, dim=1)

    def selected(self) -> AdvantageInputs:
        """These inputs restricted to ``adv_mask`` (:func:`restrict_to_selected`); themselves without one."""
        if self.adv_mask is None:
            return self
        rewards, mask, turn_ends = restrict_to_selected(self.rewards, self.mask, self.adv_mask, self.turn_ends)
        return dataclasses.replace(self, rewards=rewards, mask=mask, turn_ends=turn_ends, adv_mask=None)

    @property
    def advantage_mask(self) -> Tensor:
        """[B, T] bool: the tokens that get advantages."""
        mask = to_bool_mask(self.mask, shape=self.rewards.shape)
        return mask if self.adv_mask is None else mask & to_bool_mask(self.adv_mask, shape=mask.shape)

    def require(self, name: str, estimator: str) -> Tensor:
        """Returns the field ``name``, or raises if the estimator needs it and it is None."""
        tensor = getattr(self, name)
        if tensor is None:
            raise ValueError(f"advantage estimator {estimator!r} needs AdvantageInputs.{name}, got None")
        return tensor


def _gae_estimator(inputs: AdvantageInputs, *, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    inputs = inputs.selected()
    return gae(inputs.rewards, inputs.require("values", "gae"), inputs.mask, gamma=gamma, lam=lam)


def _bi_level_gae_estimator(
    inputs: AdvantageInputs, *, gamma: float, lam: float, high_level_gamma: float, high_level_lam: float | None = None
) -> tuple[Tensor, Tensor]:
    inputs = inputs.selected()
    return bi_level_gae(
        inputs.rewards,
        inputs.require("values", "bi_level_gae"),
        inputs.mask,
        inputs.require("turn_ends", "bi_level_gae"),
        gamma=gamma,
        lam=lam,
        high_level_gamma=high_level_gamma,
        high_level_lam=high_level_lam,
    )


def _grpo_estimator(inputs: AdvantageInputs, *, eps: float = 1e-6, norm_by_std: bool = True) -> tuple[Tensor, Tensor]:
    group_ids = inputs.require("group_ids", "grpo")
    return grpo(inputs.scores, group_ids, inputs.mask, eps=eps, norm_by_std=norm_by_std)


def _brpo_estimator(inputs: AdvantageInputs, *, eps: float = 1e-6, norm_by_std: bool = True) -> tuple[Tensor, Tensor]:
    return brpo(inputs.scores, inputs.mask, eps=eps, norm_by_std=norm_by_std)


def _arpo_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    return arpo(inputs.scores, inputs.mask)


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
    passes the configured value of each (e.g. ``gamma``, ``lam``). The
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


@dataclasses.dataclass(frozen=True)
class AdvantageSettings:
    """How advantages are estimated (set with `StarPOConfig.training()`).

    The named settings are the hyper-parameters of the built-in estimators;
    `advantage_hparams` sets any other keyword an estimator declares (grpo's
    ``eps``, bi_level_gae's ``high_level_lam``, a registered estimator's own),
    whose defaults stay declared once, in the estimator's signature.

    Attributes:
        advantage_estimator: "gae" (PPO critic), "bi_level_gae" (turn-level
            GAE feeding token-level GAE), "grpo" (normalise in group),
            "brpo" (normalise over the batch), "arpo" (raw rewards) or a
            registered estimator.
        gamma: Token-level discount.
        lambda_: Token-level GAE lambda.
        high_level_gamma: Turn-level discount of bi-level GAE.
        whiten_advantages: Whiten GAE advantages over the tokens that have them (M_adv).
        grpo_norm_by_std: Divide grpo/brpo advantages by the std.
        advantage_hparams: Any other hyper-parameter the estimator declares, by
            name, e.g. {"eps": 1e-4} (grpo/brpo's std offset) or
            {"high_level_lam": 0.9} (bi_level_gae's turn-level lambda; None =
            lambda_); unset ones keep the estimator's own default.
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
        named = {
            "gamma": self.gamma,
            "lam": self.lambda_,
            "high_level_gamma": self.high_level_gamma,
            "norm_by_std": self.grpo_norm_by_std,
        }
        declared = estimator_hparam_names(self.advantage_estimator)
        return {name: named[name] for name in declared if name in named} | dict(self.advantage_hparams)

    @property
    def needs_critic(self) -> bool:
        return needs_critic(self.advantage_estimator)


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
        **hparams: The estimator's keyword arguments, e.g. ``gamma=1.0, lam=1.0``.

    Returns:
        advantages [B, T], returns [B, T], both without gradient and 0 outside
        ``inputs.advantage_mask``.
    """
    estimator = get_advantage_estimator(name)
    _check_hparams(name, estimator, hparams)
    # Advantages and critic targets are constants of the loss: never backpropagate into them.
    with torch.no_grad():
        advantages, returns = estimator(inputs, **hparams)
        if inputs.adv_mask is not None:
            # Critic-free estimators broadcast over every token: M_adv keeps the selected ones.
            selected = inputs.advantage_mask
            advantages, returns = (torch.where(selected, x, torch.zeros_like(x)) for x in (advantages, returns))
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
