"""Advantages: the pure estimators, their registry, their settings group and the post-processing sequence.

- `estimators.py`: GAE, bi-level GAE, GRPO, BRPO, ARPO as pure functions (shapes in each docstring);
- `group_statistics.py`: per-group score statistics (GRPO, the StarPO-S filter);
- `user_registries.py`: `AdvantageInputs`, the name -> estimator registry, `compute_advantages`;
- `settings.py`: `AdvantageSettings`, set with `StarPOConfig.training()`;
- `postprocess.py`: `estimate_advantages`: estimate, whiten, length-weight, in one sequence.

This package's public API (custom estimators register here) is imported from it directly.
"""

from rllib_ragen.training.advantages.advantage_settings import AdvantageSettings
from rllib_ragen.training.advantages.estimator_registry import (
    ADVANTAGE_ESTIMATORS,
    CRITIC_ESTIMATORS,
    AdvantageInputs,
    Estimator,
    compute_advantages,
    critic_free_estimators,
    estimator_hparam_names,
    get_advantage_estimator,
    needs_critic,
    register_advantage_estimator,
    unregister_advantage_estimator,
)
from rllib_ragen.training.advantages.estimators import arpo, bi_level_gae, brpo, gae, grpo, restrict_to_advantage_mask
from rllib_ragen.training.advantages.group_statistics import GroupStatistics, group_statistics
from rllib_ragen.training.advantages.postprocess import (
    EstimatedAdvantages,
    estimate_advantages,
    length_weighted_advantages,
    whiten_across_learners,
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
