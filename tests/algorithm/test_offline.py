"""Offline training through RLlib's offline API: behaviour cloning from solver demonstrations, offline StarPO."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.offline.offline_prelearner import OfflinePreLearner

from envs import make_env
from rllib_ragen.algorithm.offline_training import (
    BCTorchLearner,
    OfflineSettings,
    TrajectoryOfflineData,
    learner_nll,
    offline_config,
    response_token_nll,
)
from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.data.demonstrations import DemonstrationSettings, expert_demonstrations
from rllib_ragen.data.parquet import write_trajectories
from rllib_ragen.data.schema import TRAJECTORY_SCHEMA
from rllib_ragen.models import load_causal_lm, load_tokenizer
from rllib_ragen.rllib_private import local_learner
from rllib_ragen.rollout.env_runner import policy_weights


def base_config(model_path, **rollouts) -> StarPOConfig:
    settings = dict(n_groups=4, group_size=1, max_turns=5, max_actions_per_turn=3, max_actions_per_traj=15,
                    response_length=12) | rollouts
    return (
        StarPOConfig()
        .environment("sokoban")
        .llm(model=str(model_path), critic="head")
        .rollouts(**settings)
        .inference(engine="hf")
        .training(mini_batch_size=4, micro_batch_size=2, actor_lr=3e-3, critic_lr=1e-3)
        .starpo_evaluation(eval_interval=0, eval_size=2)
        .debugging(seed=0)
    )


@pytest.fixture(scope="module")
def demos(tiny_model_path):
    config = base_config(tiny_model_path)
    demo_config = DemonstrationSettings(
        seeds=range(8), protocol=config.protocol, budget=config.turn_budget
    )
    return expert_demonstrations(load_tokenizer(tiny_model_path), demo_config)


@pytest.fixture(scope="module")
def demo_dir(demos, tmp_path_factory):
    directory = tmp_path_factory.mktemp("demos")
    write_trajectories(demos, directory / "demos.parquet", env="sokoban")
    return directory


def _policy(algo):
    return local_learner(algo.learner_group).module[DEFAULT_MODULE_ID].policy


def test_behaviour_cloning_from_demonstrations_lowers_their_nll(ray_session, tiny_model_path, demos, demo_dir):
    config = offline_config(base_config(tiny_model_path), OfflineSettings(str(demo_dir), objective="bc"))
    assert config.learner_class is BCTorchLearner and config.group_filter.rollout_filter_ratio == 1.0
    algo = config.build_algo()
    try:
        before = learner_nll(algo, demos)
        results = [algo.train() for _ in range(3)]
        after = learner_nll(algo, demos)
        assert after == pytest.approx(response_token_nll(_policy(algo), demos, history_window=None))
        # The rollout engine received the cloned policy, and evaluation runs in the real env.
        engine = algo.env_runner.engine.model.state_dict()
        for name, value in policy_weights({f"policy.{k}": v for k, v in _policy(algo).state_dict().items()}).items():
            torch.testing.assert_close(engine[name], value)
        evaluation = algo.evaluate_fixed_seeds()
        evaluated = [t for e in algo.pop_evaluation_episodes() for t in e.agent_episodes.values()]
    finally:
        algo.stop()
    # A random tiny model starts near ln(49152) = 10.8 nats per token; three BC steps cut it clearly.
    assert before == pytest.approx(10.8, abs=0.3)
    assert after < before - 0.5, (before, after)
    learner = results[-1]["learners"][DEFAULT_MODULE_ID]
    assert {"bc_nll", "entropy", "num_trained_tokens"} <= set(learner) and "policy_loss" not in learner
    # The sampled groups are the demonstrations: all solved, 4 per iteration.
    assert results[-1]["offline_data"]["success_rate"] == 1.0
    assert results[-1]["offline_data"]["num_trajectories"] == 4.0
    # Evaluation played the real env from the fixed seeds (eval_seed 123, eval_size 2), one trajectory each.
    assert evaluation["num_trajectories"] == 2.0
    assert [t.get_observations()[0] for t in evaluated] == [make_env("sokoban").reset(seed=s)[0] for s in (123, 124)]


def test_offline_starpo_on_a_runs_own_rollouts(ray_session, tiny_model_path, tmp_path):
    online = base_config(tiny_model_path, n_groups=2, group_size=2, max_turns=2).build_algo()
    try:
        rollouts = online.env_runner.sample()
    finally:
        online.stop()
    write_trajectories(rollouts, tmp_path / "own.parquet", env="sokoban")
    config = offline_config(
        base_config(tiny_model_path, n_groups=2, group_size=2, max_turns=2).training(rollout_filter_ratio=1.0),
        OfflineSettings(str(tmp_path / "own.parquet"), objective="starpo"),
    )
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    learner = result["learners"][DEFAULT_MODULE_ID]
    assert {"policy_loss", "vf_loss", "clip_frac_high"} <= set(learner)
    # Same weights as the sampler: the stored sampling log-probs equal the learner's own scores.
    assert learner["train_inference_logp_gap_max"] < 1e-3
    assert result["offline_data"]["num_trajectories"] == 4.0


def test_response_token_nll_is_a_mean_over_tokens_not_rows(tiny_model_path, demos):
    policy = load_causal_lm(tiny_model_path)
    # Demonstrations differ in length: a per-row mean would change with the micro-batch size.
    per_row = [response_token_nll(policy, [d], history_window=None) for d in demos[:3]]
    tokens = [int(sum(len(a) for a in d.agent_episodes["traj_0"].get_actions())) for d in demos[:3]]
    assert len(set(tokens)) > 1
    expected = sum(n * t for n, t in zip(per_row, tokens)) / sum(tokens)
    for micro_batch_size in (1, 2, 3):
        nll = response_token_nll(policy, demos[:3], history_window=None, micro_batch_size=micro_batch_size)
        assert nll == pytest.approx(expected, rel=1e-5)


def test_sampling_walks_the_dataset_epoch_after_epoch(ray_session, tiny_model_path, demos, tmp_path):
    write_trajectories(demos[:3], tmp_path / "three.parquet", env="sokoban")
    config = offline_config(base_config(tiny_model_path), OfflineSettings(str(tmp_path / "three.parquet")))
    data = TrajectoryOfflineData(config)
    drawn = [e.id_ for _ in range(3) for e in data.sample(num_samples=2)]
    assert set(drawn[:3]) == set(drawn[3:]) == {e.id_ for e in demos[:3]}
    # close() ends the pass: the next sample starts a new epoch.
    data.close()
    assert {e.id_ for e in data.sample(num_samples=3)} == {e.id_ for e in demos[:3]}
    data.close()
    with pytest.raises(ValueError, match="iterators and shards"):
        data.sample(num_samples=2, num_shards=2)


def test_empty_dataset_is_an_error(ray_session, tiny_model_path, tmp_path):
    pq.write_table(pa.Table.from_pylist([], schema=TRAJECTORY_SCHEMA), tmp_path / "empty.parquet")
    config = offline_config(base_config(tiny_model_path), OfflineSettings(str(tmp_path / "empty.parquet")))
    with pytest.raises(ValueError, match="holds no trajectories"):
        TrajectoryOfflineData(config).sample(num_samples=1)


def test_a_prelearner_class_is_refused(tiny_model_path, demo_dir):
    config = offline_config(base_config(tiny_model_path), OfflineSettings(str(demo_dir)))
    config.offline_data(prelearner_class=OfflinePreLearner)
    with pytest.raises(ValueError, match="unset prelearner_class"):
        TrajectoryOfflineData(config)


def test_plain_offline_input_is_refused_with_a_pointer(tiny_model_path, demo_dir):
    config = base_config(tiny_model_path).offline_data(input_=str(demo_dir))
    with pytest.raises(ValueError, match="offline_config"):
        config.validate_starpo()
    offline_config(config, OfflineSettings(str(demo_dir)))
    config.validate_starpo()


def test_offline_settings_are_validated(tmp_path):
    with pytest.raises(ValueError, match="objective must be one of"):
        OfflineSettings(str(tmp_path), objective="dpo")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        OfflineSettings(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="at least one"):
        OfflineSettings(())
    assert OfflineSettings((str(tmp_path), str(tmp_path))).rllib_input == [str(tmp_path)] * 2
