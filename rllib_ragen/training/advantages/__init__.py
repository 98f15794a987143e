"""Advantages: the pure estimators, their registry, their settings group and the post-processing sequence.

- `estimators.py`: GAE, bi-level GAE, GRPO, BRPO, ARPO as pure functions (shapes in each docstring),
  per-group score statistics (GRPO, the StarPO-S filter), and RAE (per-role baselines, two-player self-play);
- `advantage_estimation.py`: `AdvantageInputs`, the name -> estimator registry, `compute_advantages`;
  `AdvantageSettings`, set with `StarPOConfig.training()`; and `estimate_advantages`: estimate, whiten,
  length-weight, in one sequence.

This package's public API (custom estimators register here) is imported from it directly.
"""

from rllib_ragen.training.advantages.advantage_estimation import (
    ADVANTAGE_ESTIMATORS,
    CRITIC_ESTIMATORS,
    AdvantageInputs,
    AdvantageSettings,
    EstimatedAdvantages,
    Estimator,
    compute_advantages,
    critic_free_estimators,
    estimate_advantages,
    estimator_hparam_names,
    get_advantage_estimator,
    length_weighted_advantages,
    needs_critic,
    register_advantage_estimator,
    unregister_advantage_estimator,
    whiten_across_learners,
)
from rllib_ragen.training.advantages.estimators import (
    GroupStatistics,
    arpo,
    bi_level_gae,
    brpo,
    gae,
    group_statistics,
    grpo,
    restrict_to_advantage_mask,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "CRITIC_ESTIMATORS",
    "AdvantageInputs",
    "AdvantageSettings",
    "EstimatedAdvantages",
    "Estimator",
    "GroupStatistics",
    "arpo",
    "bi_level_gae",
    "brpo",
    "compute_advantages",
    "critic_free_estimators",
    "estimate_advantages",
    "estimator_hparam_names",
    "gae",
    "get_advantage_estimator",
    "group_statistics",
    "grpo",
    "length_weighted_advantages",
    "needs_critic",
    "register_advantage_estimator",
    "restrict_to_advantage_mask",
    "unregister_advantage_estimator",
    "whiten_across_learners",
]
