"""Asynchronous rollouts (`rllib_ragen.rollout.async_rollouts`) on real remote env runners (tiny model, HF engine).

- max_staleness=0 samples and updates exactly as the synchronous loop;
- a runner that dies with a shard in flight loses no finished group, its seeds are
  sampled again and the run goes on; when it comes back (restarted by RLlib with
  the initial weights) it missed the weight broadcasts, and the version tags of its
  groups show it: they are counted stale and dropped.
"""

from __future__ import annotations

import pytest
import ray
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen.rllib_private import env_runner_actors, mark_env_runner_healthy
from rllib_ragen.rollout.async_rollouts import staleness_counts
from rllib_ragen.rollout.env_runner import policy_weights
from tests.run_helpers import tiny_config

N_GROUPS, GROUP_SIZE = 2, 2


def _config(model_path, *, runners: int, **rollouts):
    return (
        tiny_config(model_path)
        .rollouts(n_groups=N_GROUPS, group_size=GROUP_SIZE, **rollouts)
        .training(rollout_filter_ratio=1.0)
        .starpo_evaluation(eval_interval=0)
        .env_runners(num_env_runners=runners)
    )


def _train(config, iterations: int) -> tuple[dict, list[dict]]:
    algo = config.build_algo()
    try:
        results = [algo.train() for _ in range(iterations)]
        return policy_weights(algo.learner_group.get_weights()[DEFAULT_MODULE_ID]), results
    finally:
        algo.stop()


def test_staleness_histogram_by_hand():
    assert staleness_counts([0, 1, 1, 3], max_staleness=1) == {
        "staleness_0": 1.0,
        "staleness_1": 2.0,
        "staleness_over_max": 1.0,
    }


def test_bad_async_settings_are_named(tiny_model_path):
    with pytest.raises(ValueError, match="num_env_runners"):
        tiny_config(tiny_model_path).rollouts(async_rollouts=True).validate_starpo()
    with pytest.raises(ValueError, match="max_staleness"):
        _config(tiny_model_path, runners=1, async_rollouts=True, max_staleness=-1).validate_starpo()


@pytest.mark.slow  # remote env runners, each loading the model in its own process
def test_max_staleness_zero_is_the_synchronous_update(tiny_model_path, ray_session):
    sync_weights, sync_results = _train(_config(tiny_model_path, runners=1), 2)
    async_weights, async_results = _train(_config(tiny_model_path, runners=1, async_rollouts=True, max_staleness=0), 2)
    for name, value in sync_weights.items():
        torch.testing.assert_close(async_weights[name], value, rtol=0, atol=0, msg=name)
    for sync, asynchronous in zip(sync_results, async_results):
        assert asynchronous["env_runners"]["episode_return_mean"] == sync["env_runners"]["episode_return_mean"]
        assert asynchronous["async_rollouts"]["staleness_0"] == N_GROUPS
        assert asynchronous["async_rollouts"]["stale_groups_dropped"] == 0


@pytest.mark.slow  # remote env runners, each loading the model in its own process
def test_a_dead_runner_loses_no_finished_group_and_the_run_goes_on(tiny_model_path, ray_session):
    config = _config(tiny_model_path, runners=2, async_rollouts=True, max_staleness=1)
    algo = config.build_algo()
    try:
        first = algo.train()["async_rollouts"]
        assert first["staleness_0"] == N_GROUPS  # batch 0 was sampled with the learner's weights
        # Batch 1 (one group from each runner) finished during the update; runner 2 now dies for good.
        ray.kill(env_runner_actors(algo.env_runner_group)[2], no_restart=True)
        second = algo.train()
        # Its group of batch 1 was already in the driver: both groups are trained.
        assert second["env_runners"]["num_trajectories"] == N_GROUPS * GROUP_SIZE
        assert second["async_rollouts"]["staleness_1"] == N_GROUPS
        # Its shard of batch 2 (issued to it before its death was known) is sampled by runner 1.
        third = algo.train()
        assert algo.env_runner_group.healthy_env_runner_ids() == [1]
        assert third["env_runners"]["num_trajectories"] == N_GROUPS * GROUP_SIZE
        assert third["async_rollouts"]["reissued_shards"] == 1
    finally:
        algo.stop()


@pytest.mark.slow  # remote env runners, each loading the model in its own process
def test_a_broadcast_that_missed_a_runner_is_caught_by_the_version_tags(tiny_model_path, ray_session):
    algo = _config(tiny_model_path, runners=2, async_rollouts=True, max_staleness=0).build_algo()
    try:
        # A sync while runner 2 is out of service (as RLlib marks a runner whose call failed)
        # reaches runner 1 only; then runner 2 answers again and is back in service.
        mark_env_runner_healthy(algo.env_runner_group, 2, False)
        algo.sync_engine_weights()
        mark_env_runner_healthy(algo.env_runner_group, 2, True)
        tags = algo.env_runner_group.foreach_env_runner(lambda runner: runner.policy_version, local_env_runner=False)
        assert tags == [algo.policy_version, algo.policy_version - 1]
        result = algo.train()
        # Runner 1 sampled seed 10000 with the learner's weights, runner 2 seed 10001 with the old ones.
        stats = result["async_rollouts"]
        assert (stats["staleness_0"], stats["staleness_over_max"], stats["stale_groups_dropped"]) == (1, 1, 1)
        assert result["env_runners"]["num_trajectories"] == N_GROUPS * GROUP_SIZE  # sampled
        assert result["learners"][DEFAULT_MODULE_ID]["num_trained_trajectories"] == GROUP_SIZE
    finally:
        algo.stop()
