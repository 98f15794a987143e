"""RLlib settings StarPO does not read, refused with the name of the StarPO setting that does their job."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

# RLlib settings StarPO does not read, and the StarPO setting that does their job.
IGNORED_RLLIB_SETTINGS = {
    "lr": "actor_lr and critic_lr (.training())",
    "minibatch_size": "mini_batch_size (.training())",
    "num_epochs": "rollout_frequency (.training())",
    "train_batch_size": "n_groups and group_size (.rollouts())",
    "train_batch_size_per_learner": "n_groups and group_size (.rollouts())",
}


def refuse_ignored_rllib_settings(settings: Mapping[str, Any]) -> None:
    """Raises ValueError if `settings` sets an RLlib knob StarPO ignores, naming StarPO's own."""
    for name in settings:
        if name in IGNORED_RLLIB_SETTINGS:
            raise ValueError(f"StarPO does not use RLlib's {name}; set {IGNORED_RLLIB_SETTINGS[name]} instead")


def check_no_ignored_rllib_settings(config: AlgorithmConfig) -> None:
    """`refuse_ignored_rllib_settings` for knobs set as attributes (e.g. `config.lr = ...`, a dict)."""
    refuse_ignored_rllib_settings(
        {name: value for name, value in _rllib_defaults().items() if getattr(config, name) != value}
    )


@functools.cache
def _rllib_defaults() -> dict[str, Any]:
    # train_batch_size_per_learner is derived from train_batch_size when unset (so it changes with num_learners).
    defaults = AlgorithmConfig()
    return {name: getattr(defaults, name) for name in IGNORED_RLLIB_SETTINGS if name != "train_batch_size_per_learner"}
