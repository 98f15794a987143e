"""What one Tune trial of StarPO reserves, and whether the cluster can ever give it.

Tune starts a trial's `StarPO` actor in a placement group and captures every
actor the trial starts (env runners, learners, the vLLM engine actors of each
`VLLMEnginePool`) into that group. RLlib's `Algorithm.default_resource_request`
sizes the group for the algorithm, its remote env runners and learners only, so
an engine actor found no room in it and waited forever. `trial_placement` adds
one bundle per engine actor, and `StarPOTrial`, the sweep's trainable, asks Tune for
it; `check_trial_fits` refuses, before Tune starts, a trial the cluster cannot hold,
naming what it needs and what the cluster has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.utils.annotations import override
from ray.tune.execution.placement_groups import PlacementGroupFactory

from envs.user_errors import UserError
from rllib_ragen.algorithm.starpo import StarPO, StarPOConfig
from rllib_ragen.inference.engine_settings import resolve_kind

Resources = Mapping[str, float]


class TrialDoesNotFitError(UserError, ValueError):
    """One trial reserves more than the cluster has (in total, or in one bundle on any node)."""


def trial_placement(config: StarPOConfig | Mapping[str, Any]) -> PlacementGroupFactory:
    """The placement group of one trial: RLlib's bundles (algorithm, remote env runners,
    learners) and one bundle per vLLM engine actor (`num_cpus_per_engine`, `num_gpus_per_engine`).

    Takes a config or, as `tune.with_resources` passes it, a trial's config dict.
    """
    starpo_config = (
        config if isinstance(config, StarPOConfig) else StarPO.get_default_config().update_from_dict(dict(config))
    )
    rllib = StarPO.default_resource_request(starpo_config)
    bundles = ([{}] if rllib.head_bundle_is_empty else []) + rllib.bundles
    return PlacementGroupFactory(bundles + engine_bundles(starpo_config), strategy=rllib.strategy)


class StarPOTrial(StarPO):
    """StarPO as a Tune trial: its placement group holds every actor it starts (`trial_placement`)."""

    @classmethod
    @override(Algorithm)
    def default_resource_request(cls, config: StarPOConfig | Mapping[str, Any]) -> PlacementGroupFactory:
        return trial_placement(config)


def engine_bundles(config: StarPOConfig) -> list[dict[str, float]]:
    """One bundle per vLLM engine actor of the run (none for the in-process HF engine, nor for
    engines that reserve nothing): `num_engines` for each env runner that holds an engine."""
    if resolve_kind(config.rollout_engine.kind) != "vllm":
        return []
    requested = {
        "CPU": float(config.rollout_engine.num_cpus_per_engine),
        "GPU": float(config.rollout_engine.num_gpus_per_engine),
    }
    bundle = {key: amount for key, amount in requested.items() if amount > 0}
    if not bundle:
        return []
    runners = config.num_env_runners + (1 if config.create_local_env_runner else 0)
    return [dict(bundle) for _ in range(runners * config.rollout_engine.num_engines)]


def placement_parts(config: StarPOConfig) -> str:
    """What the bundles are for, in words: "the algorithm, 1 vLLM engine ({'CPU': 1.0} each)"."""
    parts = ["the algorithm"]
    if config.num_env_runners:
        parts.append(f"{config.num_env_runners} remote env runner(s)")
    if config.num_learners:
        parts.append(f"{config.num_learners} learner(s)")
    engines = engine_bundles(config)
    if engines:
        parts.append(f"{len(engines)} vLLM engine(s) ({_spelled(engines[0])} each: num_cpus_per_engine, ...)")
    return ", ".join(parts)


def check_trial_fits(
    placement: PlacementGroupFactory, *, parts: str, cluster: Resources, nodes: Sequence[Resources]
) -> None:
    """Raises `TrialDoesNotFitError`, in one line, unless the cluster's totals hold the whole
    group and some node holds each bundle (a bundle never spans nodes).

    Args:
        placement: A trial's placement group (`trial_placement`).
        parts: What its bundles are for (`placement_parts`), named in the error.
        cluster: The cluster's total resources (`ray.cluster_resources()`).
        nodes: Each live node's total resources.
    """
    needed = placement.required_resources
    if any(amount > cluster.get(key, 0.0) + 1e-9 for key, amount in needed.items()):
        raise TrialDoesNotFitError(
            f"one trial needs {_spelled(needed)} ({parts}; bundles {_bundles(placement)}) but the cluster has "
            f"{_spelled(cluster, keys=needed)}: lower num_cpus_per_engine (a fraction, or 0 to reserve none), "
            "the engines, runners or learners, or add resources"
        )
    for bundle in placement.bundles:
        if not any(_holds(node, bundle) for node in nodes):
            largest = max(nodes, key=lambda node: node.get("CPU", 0.0), default={})
            raise TrialDoesNotFitError(
                f"one trial has a bundle {_spelled(bundle)} that no node holds (the largest has "
                f"{_spelled(largest, keys=bundle)}; {parts}; bundles {_bundles(placement)})"
            )


def check_trial_fits_cluster(config: StarPOConfig) -> PlacementGroupFactory:
    """`check_trial_fits` of `config`'s trial against the running Ray cluster; returns its placement."""
    placement = trial_placement(config)
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    check_trial_fits(placement, parts=placement_parts(config), cluster=ray.cluster_resources(), nodes=nodes)
    return placement


def trials_at_once(placement: PlacementGroupFactory, cluster: Resources) -> int:
    """How many such trials the cluster's totals hold side by side."""
    needed = {key: amount for key, amount in placement.required_resources.items() if amount > 0}
    return int(min((cluster.get(key, 0.0) + 1e-9) // amount for key, amount in needed.items()))


def describe_placement(placement: PlacementGroupFactory) -> str:
    """`{'CPU': 2.0} in bundles [...]`, for the console."""
    return f"{_spelled(placement.required_resources)} in bundles {_bundles(placement)}"


def _holds(node: Resources, bundle: Resources) -> bool:
    return all(node.get(key, 0.0) + 1e-9 >= amount for key, amount in bundle.items())


def _spelled(resources: Resources, *, keys: Resources | None = None) -> str:
    """`{'CPU': 2.0, 'GPU': 1.0}`: the keys of `keys` (default: every key), zeros and all."""
    names = keys if keys is not None else resources
    return str({key: round(float(resources.get(key, 0.0)), 3) for key in names})


def _bundles(placement: PlacementGroupFactory) -> str:
    return "[" + ", ".join(_spelled(bundle) for bundle in placement.bundles) + "]"
