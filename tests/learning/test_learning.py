"""The whole StarPO loop learns: a bandit whose better arm must be found from reward.

The env is RAGEN v1's Phoenix/Dragon bandit: the state names the two arms and
nothing about their payouts, so the better arm can only be learnt from the
rewards (a random tiny model reads nothing anyway; one pair keeps the test to
two names). A supervised format warm start on well-formed answers whose arm is
chosen at random leaves success near 0.5. StarPO (GRPO, no critic) must then
raise success on the fixed evaluation seeds (eval_seed 123 on, 64 of them) to
>= 0.9 within a bounded number of iterations; training batches only say when to
evaluate. Two negative controls run the same loop and must not: learning rate 0,
and the advantage sign flipped.
"""

from __future__ import annotations

import pytest
import ray

from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.rollout.env_group import TurnBudgetSettings
from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings
from rllib_ragen.run.warm_start import WarmStartSettings, warm_start
from rllib_ragen.training.advantages import (
    ADVANTAGE_ESTIMATORS,
    register_advantage_estimator,
)

pytestmark = pytest.mark.learning

ENV = "bandit_phoenix_dragon"
ENV_CONFIG = {"high_prob": 1.0}  # the high arm (Dragon) always pays 1.0, the low arm 0.15
MAX_ITERS = 20
TARGET = 0.9  # evaluation success a learning run must reach
BUDGET = TurnBudgetSettings(max_turns=1, max_actions_per_traj=1)
PROTOCOL = ProtocolSettings(max_actions_per_turn=1, think=False, prefill=True)


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory, tiny_model_path) -> str:
    config = WarmStartSettings(
        env=ENV, env_config=ENV_CONFIG, protocol=PROTOCOL, budget=BUDGET,
        num_examples=64, answers_per_prompt=4, epochs=4, batch_size=8, lr=3e-3,
    )
    return str(warm_start(str(tiny_model_path), config, cache_dir=tmp_path_factory.mktemp("warm")))


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    register_advantage_estimator("flipped_grpo", lambda inputs: tuple(-x for x in ADVANTAGE_ESTIMATORS["grpo"](inputs)))
    yield
    ADVANTAGE_ESTIMATORS.pop("flipped_grpo")
    ray.shutdown()


def _config(model: str, *, lr: float, estimator: str = "grpo") -> StarPOConfig:
    return (
        StarPOConfig()
        .environment(ENV, env_config=ENV_CONFIG)
        .llm(model=model, critic="none")
        .rollouts(
            n_groups=8, group_size=8, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1,
            response_length=8, think=False, prefill=True,
        )
        .inference(engine="hf")
        .training(
            advantage_estimator=estimator, rollout_filter_ratio=1.0, mini_batch_size=64,
            micro_batch_size=16, actor_lr=lr, entropy_coeff=0.0,
        )
        .starpo_evaluation(eval_interval=0, eval_size=64, eval_temperature=1.0)
        .debugging(seed=0)
    )


def _train(config: StarPOConfig, iterations: int) -> tuple[float, list[float], list[float]]:
    """Up to `iterations` iterations; returns the evaluation success before training, the training
    success of each iteration, and the evaluation success of each evaluation after training began.

    The run evaluates after an iteration whose training success reached 0.95, and after the last
    one; it stops at the first evaluation that reaches `TARGET`.
    """
    algo = config.build_algo()
    try:
        initial = algo.evaluate_fixed_seeds()["success_rate"]
        curve, evaluations = [], []
        for _ in range(iterations):
            curve.append(float(algo.train()["env_runners"]["success_rate"]))
            if curve[-1] >= 0.95 or len(curve) == iterations:
                evaluations.append(algo.evaluate_fixed_seeds()["success_rate"])
                if evaluations[-1] >= TARGET:
                    break
        return initial, curve, evaluations
    finally:
        algo.stop()


def test_starpo_learns_the_better_arm(warm_model):
    initial, curve, evaluations = _train(_config(warm_model, lr=2e-3), MAX_ITERS)
    print("initial", initial, "training", curve, "evaluations", evaluations)
    assert 0.25 <= initial <= 0.75, f"warm start should leave the choice random, got success {initial}"
    assert evaluations[-1] >= TARGET, f"evaluation success {evaluations} < {TARGET} in {MAX_ITERS} iterations: {curve}"


@pytest.mark.parametrize("lr,estimator", [(0.0, "grpo"), (3e-3, "flipped_grpo")], ids=["lr0", "flipped"])
def test_negative_controls_do_not_learn(warm_model, lr, estimator):
    initial, curve, evaluations = _train(_config(warm_model, lr=lr, estimator=estimator), 6)
    print(estimator, lr, "initial", initial, "training", curve, "evaluations", evaluations)
    assert max(evaluations) < 0.75, f"a control run learned: evaluation success {evaluations}, training {curve}"
