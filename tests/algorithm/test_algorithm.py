"""StarPO on RLlib end to end with the tiny model: config errors, multi-turn
rollouts on real envs, metrics, checkpoints and policy export."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns

from rllib_ragen.algorithm.starpo import StarPO, StarPOConfig
from rllib_ragen.columns import GENERATED_MASK, TOKEN_LOGP
from rllib_ragen.models import load_causal_lm
from rllib_ragen.rllib_private import learner_connector, local_learner
from rllib_ragen.rollout.env_runner import policy_weights
from rllib_ragen.rollout.trajectory_record import trajectories_from_episodes


def sokoban_config(model_path, **training) -> StarPOConfig:
    return (
        StarPOConfig()
        .environment("sokoban")
        .llm(model=str(model_path), critic="head")
        .rollouts(n_groups=2, group_size=2, max_turns=2, max_actions_per_turn=2, response_length=12)
        .inference(engine="hf")
        .training(mini_batch_size=4, micro_batch_size=2, actor_lr=1e-3, critic_lr=1e-3, **training)
        .starpo_evaluation(eval_interval=1, eval_size=2)
        .debugging(seed=0)
    )


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda c: c.environment("sokobann"), "unknown env"),
        (lambda c: c.training(advantage_estimator="ppo"), "advantage_estimator"),
        (lambda c: c.llm(critic="none"), "needs a critic"),
        (lambda c: c.training(rollout_filter_ratio=0.0), "rollout_filter_ratio"),
        (lambda c: c.training(rollout_filter_strategy="top_k"), "rollout_filter_strategy must be one of"),
        (lambda c: c.training(rollout_filter_top_p=1.5), "rollout_filter_top_p must be in"),
        (lambda c: c.diagnostics(collapse_metrics_interval=-1), "collapse_metrics_interval must be >= 0"),
        (lambda c: c.diagnostics(echo_trap_patience=0), "echo_trap_patience must be >= 1"),
        (lambda c: c.training(rollout_filter_strategy="top_p").learners(num_learners=2), "keeps as few as one group"),
        (lambda c: c.rollouts(group_size=0), "group_size"),
        (lambda c: c.rollouts(temperature=0.0), "temperature"),
        (lambda c: c.training(loss_agg_mode="sum"), "loss_agg_mode"),
        (lambda c: c.inference(engine="tgi"), "engine must be one of"),
    ],
)
def test_bad_config_is_a_clear_error(tiny_model_path, change, message):
    """At the builder call (a group's own check) or at validation (a check across groups or the env's)."""
    config = sokoban_config(tiny_model_path)
    with pytest.raises(ValueError, match=message):
        change(config)
        config.validate_starpo()


def test_multi_turn_rollout_keeps_exact_tokens_and_batches_one_call_per_turn(ray_session, tiny_model_path):
    algo = sokoban_config(tiny_model_path).build_algo()
    try:
        runner = algo.env_runner
        calls = []
        generate = runner.engine.generate
        runner.engine.generate = lambda prompts, params: calls.append(len(prompts)) or generate(prompts, params)
        episodes = algo.sampler.sample(iteration=1)
        assert len(episodes) == 2 and all(len(e.agent_episodes) == 2 for e in episodes)
        # All 4 trajectories share each engine call; a random model never solves Sokoban,
        # so every trajectory runs both turns.
        assert calls == [4, 4]
        trajectories = trajectories_from_episodes(episodes, history_window=None)
        for (episode, agent), trajectory in zip(
            [(e, a) for e in episodes for a in e.agent_episodes], trajectories
        ):
            sa = episode.agent_episodes[agent]
            turns = trajectory.history.answered_turns()
            assert [t.response_ids for t in turns] == [list(a) for a in sa.get_actions()]
            assert all(len(t.response_ids) == len(t.response_logprobs) for t in turns)
            assert trajectory.turn_rewards == pytest.approx(list(sa.get_rewards()))
        # Groups share a seed inside and differ across groups; training seeds advance.
        seeds = [[info["seed"] for info in e.get_infos(0).values()] for e in episodes]
        assert seeds == [[10_000, 10_000], [10_001, 10_001]]
        assert algo.get_state(components=[])["next_train_seed"] == 10_002
    finally:
        algo.stop()


def test_training_iteration_reports_starpo_metrics(ray_session, tiny_model_path):
    algo = sokoban_config(tiny_model_path, advantage_estimator="bi_level_gae").build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    runners = result["env_runners"]
    for key in ("success_rate", "episode_return_mean", "in_group_reward_std", "response_length_mean",
                "valid_action_ratio", "rollout_tokens_per_s", "rollout_framework_overhead"):
        assert key in runners, key
    learner = result["learners"][DEFAULT_MODULE_ID]
    for key in ("policy_loss", "vf_loss", "entropy", "clip_frac_low", "clip_frac_high", "approx_kl",
                "gradients_policy_global_norm", "train_inference_logp_gap_mean", "num_trained_tokens"):
        assert key in learner, key
    # Same weights, same temperature: the engine and the learner agree on every log-prob.
    assert learner["train_inference_logp_gap_max"] < 1e-3
    assert {"in_group_reward_std_before", "in_group_reward_std_after"} <= set(result["starpo_filter"])
    assert "success_rate" in result["evaluation"]
    assert {"rollout", "update", "weight_sync"} <= set(result["timers"])
    # Each phase's own peak of the driver (the local learner's process): at least the weights it holds.
    peaks = result["driver_peak_rss_gb"]
    assert {"rollout", "update", "weight_sync", "evaluation"} <= set(peaks)
    assert all(0.05 < peak < 64 for peak in peaks.values()), peaks


def test_top_p_filter_skips_a_batch_without_spread(ray_session, tiny_model_path):
    """RAGEN-2's top-p keeps no group of a batch without in-group reward spread (a random tiny model
    earns the same format penalty every turn), and such an iteration makes no update."""
    config = sokoban_config(tiny_model_path, rollout_filter_strategy="top_p").starpo_evaluation(eval_interval=0)
    algo = config.build_algo()
    try:
        before = {k: v.clone() for k, v in _learner_module(algo).policy.state_dict().items()}
        result = algo.train()
        after = _learner_module(algo).policy.state_dict()
    finally:
        algo.stop()
    assert result["env_runners"]["in_group_reward_std"] == 0.0
    assert result["starpo_filter"]["groups_before"] == 2 and result["starpo_filter"]["groups_after"] == 0
    assert DEFAULT_MODULE_ID not in result.get("learners", {}) and "update" not in result["timers"]
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, msg=name)
    # The first iteration measures the collapse diagnostics, but the random model wrote no thought.
    assert result["collapse"] == {"candidates": 0.0}
    assert result["echo_trap"] == {"reward_variance": 0.0, "conditional_entropy": 0.0, "mutual_information": 0.0}


def _learner_module(algo):
    return local_learner(algo.learner_group).module[DEFAULT_MODULE_ID]


def test_checkpoint_round_trip_restores_weights_optimizer_and_seed(ray_session, tiny_model_path, tmp_path):
    algo = sokoban_config(tiny_model_path).build_algo()
    algo.train()
    algo.save_to_path(str(tmp_path / "ckpt"))
    weights = {k: v.clone() for k, v in _learner_module(algo).state_dict().items()}
    optimizer_state = local_learner(algo.learner_group).get_optimizer(DEFAULT_MODULE_ID, "policy").state_dict()
    algo.stop()

    restored = StarPO.from_checkpoint(str(tmp_path / "ckpt"))
    try:
        module = _learner_module(restored)
        for key, value in module.state_dict().items():
            torch.testing.assert_close(value, weights[key])
        restored_opt = local_learner(restored.learner_group).get_optimizer(DEFAULT_MODULE_ID, "policy").state_dict()
        first = next(iter(optimizer_state["state"]))
        torch.testing.assert_close(restored_opt["state"][first]["exp_avg"], optimizer_state["state"][first]["exp_avg"])
        assert restored.get_state(components=[])["next_train_seed"] == 10_002
        # The rollout engine got the trained weights, not the initial ones.
        engine_weights = restored.env_runner.engine.model.state_dict()
        for key, value in policy_weights({f"policy.{k}": v for k, v in module.policy.state_dict().items()}).items():
            torch.testing.assert_close(engine_weights[key], value)
        restored.train()  # and training goes on
    finally:
        restored.stop()


def test_export_policy_writes_a_plain_hf_model(ray_session, tiny_model_path, tmp_path):
    algo = sokoban_config(tiny_model_path).build_algo()
    try:
        algo.train()
        out = algo.export_policy(tmp_path / "policy")
        exported = load_causal_lm(out)
        trained = _learner_module(algo).policy
        for (name, a), (_, b) in zip(exported.state_dict().items(), trained.state_dict().items()):
            torch.testing.assert_close(a, b, msg=name)
        assert (out / "tokenizer_config.json").is_file()
    finally:
        algo.stop()


def test_learner_scores_match_the_engines_sampling_logprobs(ray_session, tiny_model_path):
    """Right after a rollout (no update yet), the learner's recomputed log-probs of
    the sampled tokens equal the engine's sampling log-probs (same weights, same temperature)."""
    algo = sokoban_config(tiny_model_path).rollouts(temperature=0.7).build_algo()
    try:
        episodes = algo.env_runner.sample()
        learner = local_learner(algo.learner_group)
        batch = learner_connector(learner)(
            rl_module=learner.module, batch={}, episodes=episodes, shared_data={}, metrics=None
        )[DEFAULT_MODULE_ID]
        mask = batch[GENERATED_MASK].bool()
        # One on-policy update scores no old log-probs: the learner's forward gives its own.
        with torch.no_grad():
            learner_logp = learner.module[DEFAULT_MODULE_ID].unwrapped().forward_train(batch)[TOKEN_LOGP]
        gap = (learner_logp - batch["sampling_logp"]).abs()[mask]
        assert gap.max().item() < 1e-3
        assert np.isfinite(batch[Columns.ADVANTAGES][mask].numpy()).all()
    finally:
        algo.stop()


@pytest.mark.parametrize(
    "llm,rollouts,training,expected",
    [
        ({"critic": "head"}, {}, {"kl_coeff": 0.05, "kl_type": "k3"}, "kl"),
        ({"critic": "separate"}, {"history_window": 1}, {"rollout_frequency": 2, "loss_agg_mode": "seq-mean-token-mean"}, "vf_loss"),
        ({"critic": "none"}, {"think": False, "prefill": True}, {"advantage_estimator": "brpo"}, "policy_loss"),
    ],
    ids=["kl-to-reference", "separate-critic-window-two-passes", "critic-free-no-think"],
)
def test_config_variants_train(ray_session, tiny_model_path, llm, rollouts, training, expected):
    config = sokoban_config(tiny_model_path)
    config.llm(**llm).rollouts(**rollouts).training(**training)
    algo = config.build_algo()
    try:
        learners = [algo.train()["learners"][DEFAULT_MODULE_ID] for _ in range(2 if expected == "kl" else 1)]
    finally:
        algo.stop()
    assert expected in learners[0]
    assert np.isfinite(learners[0]["total_loss"])
    if expected == "kl":
        # The first update starts at the reference policy (k3 = 0 there), the second from the moved one.
        assert learners[0]["kl"] == pytest.approx(0.0, abs=1e-6) and learners[1]["kl"] > 1e-6, learners


@pytest.mark.vllm
def test_training_with_the_vllm_pool_syncs_weights_in_place(ray_session, tiny_model_path):
    config = sokoban_config(tiny_model_path).inference(
        engine="vllm", num_engines=1, kv_cache_gb=0.05, max_model_len=1024, engine_dtype="float32", engine_threads=1
    )
    algo = config.build_algo()
    try:
        pool = algo.env_runner.engine
        sync_seconds = []  # the wall time of each sync, measured around the pool's own timing
        sync = algo.weight_sync.sync

        def timed_sync(**kwargs):
            start = time.perf_counter()
            report = sync(**kwargs)
            sync_seconds.append(time.perf_counter() - start)
            return report

        algo.weight_sync.sync = timed_sync
        first = algo.train()
        # fp32 engine, weights synced before the rollout: sampling log-probs match the learner's.
        assert first["learners"][DEFAULT_MODULE_ID]["train_inference_logp_gap_max"] < 1e-2
        second = algo.train()  # rolls out with the weights synced after the first update
        assert second["learners"][DEFAULT_MODULE_ID]["train_inference_logp_gap_max"] < 1e-2
        health = pool.health()
        # Each iteration synced once, and the pool reports the latest sync's duration.
        assert health["healthy"] and len(sync_seconds) == 2
        assert 0 < health["last_sync_seconds"] <= sync_seconds[-1]
    finally:
        algo.stop()

