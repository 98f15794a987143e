"""Every private Ray / RLlib API this project touches, in one place.

RLlib's learner has no public seam for a custom mini-batch step (micro-batch
gradient accumulation), for a numpy-free optimiser state (bfloat16 AdamW moments)
or for swapping its connector pipeline after build; Ray has no public way to
find the cluster `ray.init` would attach to. Each is reached here, and nowhere
else, so an upgrade of Ray checks one file: `tests/test_rllib_private.py` fails
with the versions named when the installed Ray is not the one this file was
written for, and names any private attribute that has gone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import ray
import torch
from ray._common.utils import get_ray_address_file
from ray._private.services import canonicalize_bootstrap_address, parse_address
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.connectors.learner.learner_connector_pipeline import LearnerConnectorPipeline
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.env.env_runner_group import EnvRunnerGroup
from ray.rllib.utils.annotations import override

logger = logging.getLogger(__name__)

WRITTEN_FOR_RAY = "2.60.0"

__all__ = [
    "WRITTEN_FOR_RAY",
    "MiniBatchStepLearner",
    "actor_table",
    "canonicalize_bootstrap_address",
    "check_ray_version",
    "config_dict_value",
    "env_runner_actors",
    "get_ray_address_file",
    "learner_connector",
    "learner_optimizers",
    "learner_parameters",
    "local_learner",
    "mark_env_runner_healthy",
    "named_optimizers",
    "optimizer_module_id",
    "parse_address",
    "set_learner_connector",
]

# (owner, attribute) of every private name used below: the test checks each still exists.
PRIVATE_NAMES = (
    (TorchLearner, "_uncompiled_update"),
    (TorchLearner, "_get_optimizer_state"),
    (TorchLearner, "_params"),
    (TorchLearner, "_optimizer_parameters"),
    (TorchLearner, "_named_optimizers"),
    (TorchLearner, "_optimizer_name_to_module"),
    (TorchLearner, "_learner_connector"),
    (AlgorithmConfig, "_translate_special_keys"),
)


def check_ray_version(installed: str = ray.__version__) -> None:
    """Raises RuntimeError unless `installed` is the Ray version this adapter was written for."""
    if installed != WRITTEN_FOR_RAY:
        raise RuntimeError(
            f"rllib_ragen.rllib_private was written for ray {WRITTEN_FOR_RAY}, but ray {installed} is installed: "
            f"check every name in PRIVATE_NAMES against ray {installed}'s source (TorchLearner's update, "
            "optimiser state and parameter maps, AlgorithmConfig's key renaming), then update WRITTEN_FOR_RAY"
        )


class MiniBatchStepLearner(TorchLearner):
    """A `TorchLearner` whose mini-batch step and optimiser state are public methods to override.

    RLlib calls the private `_uncompiled_update` once per mini-batch and
    `_get_optimizer_state` when checkpointing; these forward to
    `update_minibatch` and `optimizer_state`.
    """

    def update_minibatch(self, batch: dict) -> tuple[Any, Any, Any]:
        """One optimiser step on a mini-batch: (forward outputs, losses per module, metrics)."""
        return super()._uncompiled_update(batch)

    def optimizer_state(self) -> dict:
        """The optimisers' state for checkpoints (RLlib's default converts it to numpy)."""
        return super()._get_optimizer_state()

    @override(TorchLearner)
    def apply_gradients(self, gradients_dict: dict) -> None:
        """RLlib's step, with the gradients checked for nan/inf once, through their global norm.

        RLlib's own checks every gradient tensor twice (two passes over all of them: about half a
        second an optimiser step for a 135M policy on 2 CPU cores). Finite gradients have a finite
        norm, so only a step whose norm is not finite (or one with a grad scaler or an LR scheduler
        class) goes through RLlib's checks and its handling of nan/inf, unchanged.
        """
        if self._grad_scalers is not None or self._lr_scheduler_classes is not None:
            super().apply_gradients(gradients_dict)
            return
        if not torch.isfinite(torch.nn.utils.get_total_norm(list(gradients_dict.values()))):
            super().apply_gradients(gradients_dict)
            return
        for reference, gradient in gradients_dict.items():
            self._params[reference].grad = gradient
        for optimizer in learner_optimizers(self):
            optimizer.step()

    @override(TorchLearner)
    def _uncompiled_update(self, batch: dict, **kwargs: Any) -> tuple[Any, Any, Any]:
        return self.update_minibatch(batch)

    @override(TorchLearner)
    def _get_optimizer_state(self) -> dict:
        return self.optimizer_state()


def learner_optimizers(learner: TorchLearner) -> Iterable[torch.optim.Optimizer]:
    """Every optimiser of `learner`."""
    return learner._optimizer_parameters.keys()


def learner_parameters(learner: TorchLearner) -> Mapping[Any, torch.nn.Parameter]:
    """Every optimised parameter of `learner`, by RLlib's parameter reference."""
    return learner._params


def named_optimizers(learner: TorchLearner) -> Mapping[str, torch.optim.Optimizer]:
    """`learner`'s optimisers by their registered name."""
    return learner._named_optimizers


def optimizer_module_id(learner: TorchLearner, optimizer_name: str) -> str:
    """The module id the optimiser `optimizer_name` was registered for."""
    return learner._optimizer_name_to_module[optimizer_name]


def learner_connector(learner: TorchLearner) -> LearnerConnectorPipeline:
    """The learner connector pipeline of `learner` (episodes -> train batch)."""
    return learner._learner_connector


def set_learner_connector(learner: TorchLearner, pipeline: LearnerConnectorPipeline) -> None:
    """Replaces the learner connector pipeline `learner` built from its config."""
    learner._learner_connector = pipeline


def local_learner(learner_group: LearnerGroup) -> TorchLearner:
    """The learner of a learner group without remote learners (num_learners=0)."""
    if learner_group._learner is None:
        raise ValueError("this learner group has remote learners (num_learners >= 1): no local learner")
    return learner_group._learner


def env_runner_actors(env_runner_group: EnvRunnerGroup) -> dict[int, Any]:
    """The remote env-runner actor handles of an `EnvRunnerGroup`, by runner id."""
    return env_runner_group._worker_manager.actors()


def mark_env_runner_healthy(env_runner_group: EnvRunnerGroup, runner_id: int, healthy: bool) -> None:
    """Marks remote env runner `runner_id` in or out of service, as RLlib does after a failed call."""
    env_runner_group._worker_manager.set_actor_state(runner_id, healthy=healthy)


def actor_table() -> list[dict[str, Any]]:
    """Every actor of the cluster as its GCS lists them (`ActorID`, `ActorClassName`, `JobID`, `State`,
    `Pid`, `Address`, `OwnerAddress`); `ray.util.state` would need the dashboard, which `init_ray` leaves off."""
    from ray._private import state

    return list(state.actors().values())


def config_dict_key(config_dict: Mapping[str, Any], attribute: str) -> str:
    """The key of config attribute `attribute` in an `AlgorithmConfig.to_dict()` dict (e.g. a Tune
    trial's config), whose keys RLlib renames for some attributes ("lambda" for `lambda_`)."""
    for key in (attribute.rstrip("_"), attribute):
        if key in config_dict and AlgorithmConfig._translate_special_keys(key, warn_deprecated=False) == attribute:
            return key
    raise KeyError(f"the config's dict has no key for attribute {attribute!r}")


def config_dict_value(config_dict: Mapping[str, Any], attribute: str) -> Any:
    """The value of config attribute `attribute` in an `AlgorithmConfig.to_dict()` dict; None if it has none."""
    try:
        return config_dict[config_dict_key(config_dict, attribute)]
    except KeyError:
        return None
