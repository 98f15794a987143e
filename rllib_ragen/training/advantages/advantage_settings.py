"""`AdvantageSettings`: the settings group of advantage estimation (set with `StarPOConfig.training()`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rllib_ragen.checks import check_choice
from rllib_ragen.training.advantages.estimator_registry import (
    ADVANTAGE_ESTIMATORS,
    estimator_hparam_names,
    needs_critic,
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
