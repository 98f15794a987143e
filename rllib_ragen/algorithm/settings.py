"""StarPOConfig's settings groups not owned by one component, each default and check declared once.

The groups a component owns live beside it (`EngineConfig`, `LLMModuleConfig`,
`ScoringConfig`, `LoraSettings`, `ProtocolConfig`, `TurnBudget`,
`AdvantageSettings`, `FilterSettings`, `OffPolicyCorrection`, `AsyncRollouts`,
`RewardShaping`, `CollapseMetricsSettings`, `EchoTrapRule`). `StarPOConfig`
takes its defaults from the groups' fields and builds the groups (which checks
them) in `validate`; see `rllib_ragen.algorithm.starpo.SETTINGS_GROUPS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rllib_ragen.checks import check_choice
from rllib_ragen.rollout.env_group import DEFAULT_GROUP_RANDOMNESS, GROUP_RANDOMNESS
from rllib_ragen.training.losses import KL_KINDS, LOSS_AGGREGATIONS
from rllib_ragen.training.token_masks import ALL_TOKENS, TOKEN_MASKS


def _check_at_least_one(group: object, *names: str) -> None:
    for name in names:
        if int(getattr(group, name)) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(group, name)}")


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """How many trajectories an iteration samples, and how (`.rollouts()` documents each)."""

    n_groups: int = 8
    group_size: int = 16
    response_length: int = 400
    temperature: float = 1.0
    train_seed_start: int = 10_000
    env_step_timeout_s: float | None = 60.0
    group_randomness: str = DEFAULT_GROUP_RANDOMNESS

    def __post_init__(self) -> None:
        _check_at_least_one(self, "n_groups", "group_size", "response_length")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 for rollouts, got {self.temperature}")
        if self.env_step_timeout_s is not None and not self.env_step_timeout_s > 0:
            raise ValueError(f"env_step_timeout_s must be > 0 or None, got {self.env_step_timeout_s}")
        check_choice("group_randomness", self.group_randomness, GROUP_RANDOMNESS)


@dataclasses.dataclass(frozen=True)
class UpdateSettings:
    """How one rollout batch is cut into optimiser steps (`.training()` documents each)."""

    rollout_frequency: int = 1
    mini_batch_size: int = 32
    micro_batch_size: int = 4
    micro_batch_tokens: int | None = None
    torch_threads: int | None = None

    def __post_init__(self) -> None:
        _check_at_least_one(self, "rollout_frequency", "mini_batch_size", "micro_batch_size")
        if self.micro_batch_tokens is not None and int(self.micro_batch_tokens) < 1:
            raise ValueError(f"micro_batch_tokens must be >= 1 or None, got {self.micro_batch_tokens}")
        if self.torch_threads is not None and int(self.torch_threads) < 1:
            raise ValueError(f"torch_threads must be >= 1 or None, got {self.torch_threads}")
        if self.micro_batch_size > self.mini_batch_size:
            raise ValueError(
                f"micro_batch_size={self.micro_batch_size} is larger than mini_batch_size={self.mini_batch_size}"
            )


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """The terms of the StarPO loss and the tokens they cover (`.training()` documents each)."""

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
    adv_token_mask: str = ALL_TOKENS

    def __post_init__(self) -> None:
        check_choice("loss_agg_mode", self.loss_agg_mode, LOSS_AGGREGATIONS)
        check_choice("kl_type", self.kl_type, KL_KINDS)
        check_choice("loss_token_mask", self.loss_token_mask, sorted(TOKEN_MASKS))
        check_choice("adv_token_mask", self.adv_token_mask, sorted(TOKEN_MASKS))
        if self.kl_coeff < 0 or self.entropy_coeff < 0:
            raise ValueError(f"kl_coeff and entropy_coeff must be >= 0, got {self.kl_coeff}, {self.entropy_coeff}")

    @property
    def needs_token_spans(self) -> bool:
        """A token mask policy other than "all" is set: the learner labels tokens with protocol spans."""
        return (self.loss_token_mask, self.adv_token_mask) != (ALL_TOKENS, ALL_TOKENS)


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """AdamW for the policy and the critic (`.training()` documents each)."""

    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    adam_betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01

    def __post_init__(self) -> None:
        if self.actor_lr < 0 or self.critic_lr < 0:
            raise ValueError(f"actor_lr and critic_lr must be >= 0, got {self.actor_lr}, {self.critic_lr}")


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """Periodic evaluation on fixed seeds (`.starpo_evaluation()` documents each)."""

    eval_interval: int = 10
    eval_size: int = 256
    eval_temperature: float = 0.5
    eval_seed: int = 123

    def __post_init__(self) -> None:
        _check_at_least_one(self, "eval_size")
        if self.eval_interval < 0 or self.eval_temperature < 0:
            raise ValueError(
                f"eval_interval and eval_temperature must be >= 0, got {self.eval_interval}, {self.eval_temperature}"
            )


@dataclasses.dataclass(frozen=True)
class RecordingSettings:
    """Writing sampled rollouts to Parquet (`.rollout_recording()` documents each)."""

    rollout_parquet_dir: str | None = None
    write_rollouts_every: int = 1

    def __post_init__(self) -> None:
        _check_at_least_one(self, "write_rollouts_every")


@dataclasses.dataclass(frozen=True)
class SettingsBinding:
    """How a settings group maps onto `StarPOConfig`'s flat attributes (which RLlib and Tune need).

    Args:
        group: The frozen dataclass; its field defaults are the config's defaults.
        renames: field -> config attribute, where the names differ.
        derived: Fields the config fills from other settings (not attributes of their own).
    """

    group: type
    renames: Mapping[str, str] = dataclasses.field(default_factory=dict)
    derived: frozenset[str] = frozenset()

    def attributes(self) -> dict[str, str]:
        """field -> config attribute, for every field the config holds."""
        return {
            f.name: self.renames.get(f.name, f.name) for f in dataclasses.fields(self.group) if f.name not in self.derived
        }

    def defaults(self) -> dict[str, Any]:
        """config attribute -> default value, as the group declares it."""
        out = {}
        for f in dataclasses.fields(self.group):
            if f.name in self.derived:
                continue
            has_factory = f.default_factory is not dataclasses.MISSING
            out[self.renames.get(f.name, f.name)] = f.default_factory() if has_factory else f.default
        return out

    def build(self, config: Any, **derived: Any) -> Any:
        """The group of `config`'s current values (its checks run here)."""
        return self.group(**{field: getattr(config, attribute) for field, attribute in self.attributes().items()}, **derived)
