"""Advantage estimators as pure functions: GAE, bi-level GAE, GRPO, BRPO, ARPO, VAGEN's M_adv restriction,
the per-group statistics of trajectory scores (what GRPO normalises by and the StarPO-S filter ranks by),
and RAE (SPIRAL's role-conditioned advantages for two-player self-play) with its baselines' state.

Data layout (one row per trajectory): the response tokens of all turns of a
trajectory are concatenated in order and right-padded to ``T``.

- ``mask``      [B, T] 0/1: the tokens an estimator runs over: the generated
  tokens (`AdvantageInputs.generated_mask`), or those of the advantage mask
  after `restrict_to_advantage_mask`.
- ``rewards``   [B, T]: each turn's reward on that turn's last response token
  (a trajectory-level reward sits on the trajectory's last token).
- ``turn_ends`` [B, T] 0/1: the last response token of each turn.
- ``values``    [B, T]: critic value of each response token.
- ``group_ids`` [B] int: trajectories started from the same initial state share one.

Every estimator returns ``(advantages [B, T], returns [B, T])``, both 0 on
padding. ``returns`` are the critic's targets; critic-free estimators (GRPO,
BRPO, ARPO) have no critic and return their advantages as ``returns``.
The registry (`user_registries.py`) calls them by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rllib_ragen.logits import to_bool_mask

Tensor = torch.Tensor


def gae(rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lambda_: float) -> tuple[Tensor, Tensor]:
    """Token-level generalised advantage estimation over the masked tokens.

    Padding is skipped: the "next" token of a response token is the next
    *masked* token of its row, and the value after a row's last token is 0.
    ``delta_i = r_i + gamma * v_next - v_i``; ``A_i = delta_i + gamma * lambda_ * A_next``.

    Args:
        rewards: [B, T], zero on padding.
        values: [B, T] critic values.
        mask: [B, T] 0/1.
        gamma: Discount.
        lambda_: GAE lambda.

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
        adv = delta + gamma * lambda_ * next_adv
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
    lambda_: float,
    high_level_gamma: float,
    high_level_lambda: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Bi-level GAE (RAGEN / VAGEN): turn-level GAE whose result seeds a token-level GAE per turn.

    Rule, per row, with turns ``k = 1..K`` and ``e_k`` the last token of turn k:

    1. Turn level (``gh = high_level_gamma``, ``lh = high_level_lambda``):
       ``V_k = values[e_k]``, ``V_{K+1} = 0``, ``A_{K+1} = 0``,
       ``delta_k = r_k + gh * V_{k+1} - V_k``, ``A_k = delta_k + gh * lh * A_{k+1}``.
    2. ``advantage[e_k] = A_k``: the turn's last token sees a terminal reward equal
       to the turn-level return ``A_k + V_k`` and no value after it.
    3. Token level inside turn k, backward from ``e_k`` over the turn's other
       tokens ``i``: ``A_i = (gamma * v_{i+1} - v_i) + gamma * lambda_ * A_{i+1}``
       (no rewards inside a turn; ``i+1`` is the next masked token).
    4. ``returns = advantages + values`` on every token.

    With ``gamma = lambda_ = 1`` a token's advantage is its turn's return minus its value.

    Args:
        rewards: [B, T], non-zero only on turn ends.
        values: [B, T] critic values.
        mask: [B, T] 0/1.
        turn_ends: [B, T] 0/1, inside ``mask``; every row's last masked token is one.
        gamma, lambda_: Token-level discount and lambda.
        high_level_gamma: Turn-level discount (RAGEN: 0.95).
        high_level_lambda: Turn-level lambda; None uses ``lambda_`` (RAGEN's choice).

    Returns:
        advantages [B, T], returns [B, T]; 0 on padding.
    """
    mask = _check_token_tensors(rewards, values, mask)
    ends = _check_turn_ends(turn_ends, mask)
    _check_rewards_only_on(rewards, ends, "turn ends (turn_ends)")
    turn_lambda = lambda_ if high_level_lambda is None else high_level_lambda
    zero = rewards.new_zeros(rewards.shape[0])
    next_turn_value, next_turn_adv = zero, zero
    next_value, next_adv = zero, zero
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        live, end, value = mask[:, t], ends[:, t], values[:, t]
        turn_delta = rewards[:, t] + high_level_gamma * next_turn_value - value
        turn_adv = turn_delta + high_level_gamma * turn_lambda * next_turn_adv
        token_adv = gamma * next_value - value + gamma * lambda_ * next_adv
        adv = torch.where(end, turn_adv, token_adv)
        next_turn_value = torch.where(end, value, next_turn_value)
        next_turn_adv = torch.where(end, turn_adv, next_turn_adv)
        next_value = torch.where(live, value, next_value)
        next_adv = torch.where(live, adv, next_adv)
        advantages[:, t] = torch.where(live, adv, zero)
    return advantages, _returns(advantages, values, mask)


def grpo(
    scores: Tensor, group_ids: Tensor, mask: Tensor, *, eps: float = 1e-6, grpo_norm_by_std: bool = True
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
        grpo_norm_by_std: If False only the group mean is subtracted (Dr. GRPO).

    Returns:
        advantages [B, T], returns = advantages.
    """
    stats = group_statistics(scores, group_ids)
    centred = scores.to(stats.mean.dtype) - stats.mean[stats.index]
    per_traj = centred / (stats.std[stats.index] + eps) if grpo_norm_by_std else centred
    advantages = _broadcast_over_tokens(per_traj, mask)
    return advantages, advantages


def brpo(scores: Tensor, mask: Tensor, *, eps: float = 1e-6, grpo_norm_by_std: bool = True) -> tuple[Tensor, Tensor]:
    """BRPO: GRPO with the whole batch as one group (a batch of one gets 0).

    Args:
        scores: [B] trajectory scores.
        mask: [B, T] 0/1.

    Returns:
        advantages [B, T], returns = advantages.
    """
    return grpo(scores, torch.zeros_like(scores, dtype=torch.long), mask, eps=eps, grpo_norm_by_std=grpo_norm_by_std)


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


def restrict_to_advantage_mask(
    rewards: Tensor, mask: Tensor, advantage_mask: Tensor, turn_ends: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The token MDP seen only at the tokens of ``advantage_mask`` (VAGEN's M_adv).

    GAE on the result has values and advantages at those tokens only, and
    credit passes over the others: the "next" token of a kept token is the
    next kept one of its row. So that no reward is skipped with them, each
    reward moves to the last kept token at or before it (it follows that
    token's action); a reward before a row's first kept token has no state to
    follow and is dropped. A turn's last kept token becomes its end; a turn
    with none kept merges into the turn before it.

    Args:
        rewards: [B, T], zero on padding.
        mask: [B, T] 0/1, the response tokens.
        advantage_mask: [B, T] 0/1, the tokens that take part in advantage estimation.
        turn_ends: [B, T] 0/1, inside ``mask``, or None.

    Returns:
        rewards [B, T] (on kept tokens only), mask & advantage_mask [B, T] bool,
        turn ends [B, T] bool of the kept tokens (None if not given).
    """
    kept = to_bool_mask(mask, shape=rewards.shape) & to_bool_mask(
        advantage_mask, shape=rewards.shape, name="advantage_mask"
    )
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


# ---------------------------------------------------------------- RAE (SPIRAL's role-conditioned advantages)
# Self-play on a zero-sum game gives a game's two seats opposite rewards, and the seats are not alike
# (TicTacToe's first mover wins more often): a baseline shared by both, or GRPO's mean over the two, would
# mostly measure who moved first. RAE keeps one exponential moving average per role key ("<game>/<seat>",
# and "<game>/<seat>/vs_<module>" in a league's games against another player).
# Per batch, each role's baseline first moves towards the batch's mean reward of that role,
# b <- decay * b + (1 - decay) * mean_batch(R), then each of its trajectories gets A = R - b with the
# updated b: SPIRAL's Algorithm 1 order, which keeps the first batch from being measured against a baseline
# of 0 that knows nothing of the game. A role absent from a batch keeps its baseline. The baselines are
# learner state: the learner connector piece that estimates advantages holds them, and the learner's
# checkpoint saves them.
RAE = "rae"
DEFAULT_DECAY = 0.95


@dataclasses.dataclass
class RoleBaselines:
    """The moving-average baseline of each role key (a role never seen has baseline 0).

    Attributes:
        values: Role key -> its baseline.
    """

    values: dict[str, float] = dataclasses.field(default_factory=dict)

    def get_state(self) -> dict[str, float]:
        return dict(self.values)

    def set_state(self, state: Mapping[str, float]) -> None:
        self.values = {str(role): float(value) for role, value in state.items()}


def role_conditioned_advantages(
    scores: Tensor, roles: Sequence[str], baselines: Mapping[str, float], *, decay: float = DEFAULT_DECAY
) -> tuple[Tensor, dict[str, float]]:
    """RAE on one batch: the baselines updated by the batch, then each trajectory's score less its role's.

    Args:
        scores: [B] each trajectory's reward (the sum of its turns' rewards).
        roles: [B] each trajectory's role key, e.g. "TicTacToe-v0/player_0".
        baselines: Role key -> baseline before this batch (an absent key starts at 0).
        decay: The moving average's decay in [0, 1): the weight of the old baseline.

    Returns:
        advantages [B] (float32), and the updated baselines (every key of `baselines` and of `roles`).
    """
    if scores.dim() != 1 or len(roles) != scores.shape[0]:
        raise ValueError(f"need scores [B] and B role keys, got shape {tuple(scores.shape)} and {len(roles)} roles")
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"RAE's decay must be in [0, 1), got {decay}")
    scores = scores.float()
    updated = dict(baselines)
    baseline_of = torch.zeros_like(scores)
    for role in dict.fromkeys(roles):  # each role once, in order of appearance
        rows = torch.tensor([r == role for r in roles])
        batch_mean = float(scores[rows].mean())
        updated[role] = decay * updated.get(role, 0.0) + (1.0 - decay) * batch_mean
        baseline_of[rows] = updated[role]
    return scores - baseline_of, updated


def zero_advantage_trajectories(advantages: Tensor, generated_mask: Tensor) -> Tensor:
    """[B] bool: the trajectories whose every generated token has advantage 0 (SPIRAL drops them from the loss).

    Args:
        advantages: [B, T].
        generated_mask: [B, T] 0/1.
    """
    nonzero = (advantages != 0) & generated_mask.bool()
    return ~nonzero.any(dim=1)
