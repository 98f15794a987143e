"""StarPO learns a multi-turn task whose reward comes only at the end.

The corridor (`envs.corridor`): the goal is 3 moves away, one move a turn, 3
turns, reward 1 only on reaching the goal. A random tiny model gets a format
warm start on random moves (success about 1/8 by chance); StarPO must then
lift success on held-out *evaluation* seeds to >= 0.9, with GAE and a critic,
with bi-level GAE and with GRPO, the last also with async rollouts on a remote
runner (at most one policy version stale, TIS-corrected). Two negative controls
run the same loop and must not learn: learning rate 0, and the advantage sign flipped.
"""

from __future__ import annotations

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen.algorithm.starpo import StarPOConfig, update_learners
from rllib_ragen.rollout.env_group import TurnBudgetSettings
from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings
from rllib_ragen.rollout.trajectory_record import trajectories_from_episodes
from rllib_ragen.run.warm_start import WarmStartSettings, warm_start
from rllib_ragen.training.advantages import (
    ADVANTAGE_ESTIMATORS,
    CRITIC_ESTIMATORS,
    register_advantage_estimator,
    unregister_advantage_estimator,
)
from rllib_ragen.training.learner_connector import score_rows
from rllib_ragen.training.token_batch import build_token_batch

pytestmark = pytest.mark.learning

DISTANCE = 3
MAX_ITERS = 25
# Evaluated every 5 iterations (one run), LoRA's evaluation reached 0.92 by iteration 5 and stayed
# within 0.92-0.98 to iteration 35: the frozen head's cap, reached early (see its test).
LORA_ITERS = 15
BUDGET = TurnBudgetSettings(max_turns=DISTANCE, max_actions_per_traj=DISTANCE)
PROTOCOL = ProtocolSettings(max_actions_per_turn=1, think=False, prefill=True)
EVAL_SEED = 900_000  # far from the training seeds (10_000 on)


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory, tiny_model_path) -> str:
    config = WarmStartSettings(
        env="corridor", protocol=PROTOCOL, budget=BUDGET,
        num_examples=32, answers_per_prompt=4, epochs=6, batch_size=8, lr=3e-3,
    )
    return str(warm_start(str(tiny_model_path), config, cache_dir=tmp_path_factory.mktemp("warm")))


@pytest.fixture(scope="module", autouse=True)
def flipped_estimators(ray_session):
    """The negative control: GAE with the advantage sign flipped (critic kept, registered as needing it)."""
    gae = ADVANTAGE_ESTIMATORS["gae"]
    register_advantage_estimator(
        "flipped_gae", lambda inputs, *, gamma, lambda_: _flip(gae(inputs, gamma=gamma, lambda_=lambda_)), needs_critic=True
    )
    yield
    unregister_advantage_estimator("flipped_gae")


def _flip(outputs):
    advantages, returns = outputs
    return -advantages, returns


def corridor_config(model: str, *, estimator: str, lr: float) -> StarPOConfig:
    critic = "head" if estimator in CRITIC_ESTIMATORS else "none"
    return (
        StarPOConfig()
        .environment("corridor", env_config={"distance": DISTANCE})
        .llm(model=model, critic=critic)
        .rollouts(
            n_groups=8, group_size=8, max_turns=DISTANCE, max_actions_per_turn=1, max_actions_per_traj=DISTANCE,
            response_length=8, think=False, prefill=True,
        )
        .inference(engine="hf")
        .training(
            advantage_estimator=estimator, rollout_filter_ratio=1.0, mini_batch_size=64, micro_batch_size=16,
            actor_lr=lr, critic_lr=1e-2, entropy_coeff=0.0, gamma=1.0, lambda_=1.0,
        )
        .starpo_evaluation(eval_interval=0, eval_size=64, eval_temperature=1.0, eval_seed=EVAL_SEED)
        .debugging(seed=0)
    )


def train_and_evaluate(
    config: StarPOConfig, iterations: int, *, stop_at: float = 0.93
) -> tuple[float, list[float], float]:
    """(evaluation success before RL, training success per iteration, evaluation success after).

    Training stops early once two iterations in a row reach `stop_at` training success.
    """
    algo = config.build_algo()
    try:
        before = algo.evaluate_fixed_seeds()["success_rate"]
        curve = []
        for _ in range(iterations):
            curve.append(float(algo.train()["env_runners"]["success_rate"]))
            if len(curve) >= 2 and min(curve[-2:]) >= stop_at:
                break
        return before, curve, algo.evaluate_fixed_seeds()["success_rate"]
    finally:
        algo.stop()


def asynchronous(config: StarPOConfig) -> StarPOConfig:
    """Async rollouts on one remote runner, one policy version behind at most, TIS-corrected."""
    return (
        config.env_runners(num_env_runners=1)
        .rollouts(async_rollouts=True, max_staleness=1)
        .training(off_policy_correction="tis")
    )


@pytest.mark.parametrize(
    "estimator,is_async",
    [("gae", False), ("bi_level_gae", False), ("grpo", False), ("grpo", True)],
    ids=["gae", "bi_level_gae", "grpo", "grpo-async-tis"],
)
def test_starpo_learns_the_corridor(warm_model, estimator, is_async):
    # At 4e-3 passing depended on the random stream: async GRPO overshot at 0.8 training success and fell
    # to 0, and after a change of the token sampler's stream bi-level GAE and GRPO fell to 0 within two
    # updates (invalid answers): no success left, so no signal to climb back. At 2e-3 all four rose
    # smoothly with the current sampler (17-22 iterations), async GRPO with the previous one too.
    config = corridor_config(warm_model, estimator=estimator, lr=2e-3)
    before, curve, after = train_and_evaluate(asynchronous(config) if is_async else config, MAX_ITERS)
    print(estimator, "async" if is_async else "sync", "eval before", before, "train curve", curve, "eval after", after)
    assert before <= 0.3, f"the warm start should move at random (success ~1/8), got {before}"
    assert after >= 0.9, f"{estimator}: evaluation success {after} < 0.9 after {len(curve)} iterations: {curve}"


def test_lora_adapters_learn_the_corridor(warm_model):
    """GRPO training LoRA r=8 adapters only (base and tied LM head frozen) learns the corridor too.

    The only LoRA learning case (the Bandit's, which the corridor's multi-turn case
    covers, was dropped to keep the slow tier short). The tiny random model's frozen
    head caps a move's probability: its token embeddings are drawn with std 0.02, and
    LoRA leaves them frozen, so its Left/Right embeddings
    allow a logit lead of at most about 1.7 after the frozen final norm, p <= 0.84
    a move at temperature 1, 0.84**3 = 0.6 over the three moves. Evaluated at
    temperature 0.25 (cap 0.999 a move), before RL as after, the test asks
    whether the adapters learned the way to the goal. Training success at
    temperature 1 therefore never reaches the other cases' early stop: it
    stops at 0.5, which needs p >= 0.79 a move (a logit lead of 1.35 over
    the other move), so p >= 0.995 a move and success >= 0.98 at temperature 0.25.
    """
    config = corridor_config(warm_model, estimator="grpo", lr=1e-2)
    config.llm(lora_rank=8).starpo_evaluation(eval_temperature=0.25, eval_size=128)
    before, curve, after = train_and_evaluate(config, LORA_ITERS, stop_at=0.5)
    print("grpo lora8 eval before", before, "train curve", curve, "eval after", after)
    assert before <= 0.3, f"the warm start should move at random, got {before} at temperature 0.25"
    assert after >= 0.9, f"LoRA: evaluation success {after} < 0.9 after {len(curve)} iterations: {curve}"


@pytest.mark.parametrize("estimator,lr", [("gae", 0.0), ("flipped_gae", 4e-3)], ids=["lr0", "flipped"])
def test_negative_controls_do_not_learn(warm_model, estimator, lr):
    before, curve, after = train_and_evaluate(corridor_config(warm_model, estimator=estimator, lr=lr), 6)
    print(estimator, lr, "eval before", before, "train curve", curve, "eval after", after)
    assert after <= 0.3, f"control {estimator} (lr {lr}) learned: evaluation success {after}, curve {curve}"


def _turn_one_logp(learner, episodes) -> torch.Tensor:
    """[B] summed log-prob of each trajectory's first-turn tokens under the learner's weights."""
    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    tokens = build_token_batch(trajectories_from_episodes(episodes, history_window=None), pad_token_id=0)
    logp, _ = score_rows(module, tokens, micro_batch_size=16, with_values=False)
    logp = tokens.to_trajectories(logp)
    # Tokens up to and including the first turn's last one.
    first_turn = torch.cumsum(tokens.trajectories.turn_ends.long(), dim=1) - tokens.trajectories.turn_ends.long() == 0
    return (logp * (first_turn & tokens.trajectories.generated_mask)).sum(dim=1)


def _success_and_left_opening(algo, *, seeds) -> tuple[list, list[bool], list[str]]:
    """The first group of two where one member succeeded and the other opened with `Left`."""
    for seed in seeds:
        episodes = algo.env_runner.sample(seeds=[seed])
        agents = list(episodes[0].agent_episodes.values())
        success = [bool(a.get_infos()[-1]["success"]) for a in agents]
        first = [(a.get_infos()[1]["parsed_actions"] or [""])[0] for a in agents]
        if sorted(zip(success, first))[0][1] == "Left" and any(success):
            return episodes, success, first
    raise AssertionError(f"no group among seeds {seeds} had a success beside a Left opening")


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_credit_reaches_the_first_turn(warm_model, estimator):
    """One update on a group whose reward arrives after turn 3 moves turn 1's tokens the right way.

    The group: a success (it opened with Right) and a trajectory that opened
    with Left (it can no longer reach the goal in time). Neither saw a reward
    before its last turn, yet turn 1 must become more likely in the success
    and less likely in the failure.
    """
    config = corridor_config(warm_model, estimator=estimator, lr=1e-3).rollouts(n_groups=1, group_size=2)
    algo = config.build_algo()
    try:
        episodes, success, first = _success_and_left_opening(algo, seeds=range(100, 400))
        [before] = algo.learner_group.foreach_learner(lambda learner: _turn_one_logp(learner, episodes))
        config = algo.config
        update_learners(
            algo.learner_group,
            episodes,
            config.update,
            history_window=config.protocol.history_window,
            iteration=algo.iteration + 1,
        )
        [after] = algo.learner_group.foreach_learner(lambda learner: _turn_one_logp(learner, episodes))
    finally:
        algo.stop()
    delta = (after.get() - before.get()).tolist()
    print(estimator, "success", success, "first", first, "delta", delta)
    for won, change in zip(success, delta):
        if won:
            assert change > 0, f"{estimator}: the success's first-turn log-prob fell by {-change}"
        else:
            assert change < 0, f"{estimator}: the Left opening's first-turn log-prob rose by {change}"
