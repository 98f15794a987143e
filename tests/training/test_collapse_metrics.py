"""RAGEN-2's collapse diagnostics: the estimator on hand-made log-prob matrices, the cross-scoring
against the model's own logits, the (X, Z) pairs of real episodes, and the metrics in a run's MLflow."""


from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from run_helpers import driver_args, tiny_config

from rllib_ragen.algorithm.offline_training import OfflineSettings, offline_config
from rllib_ragen.data.demonstrations import DemonstrationSettings, expert_demonstrations
from rllib_ragen.data.parquet import write_trajectories
from rllib_ragen.models import load_causal_lm
from rllib_ragen.rollout.env_group import TurnBudgetSettings
from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings
from rllib_ragen.rollout.prompt.token_history import ChatTemplate
from rllib_ragen.rollout.trajectory_record import trajectory_start, turn_record
from rllib_ragen.run.train_loop import run
from rllib_ragen.training.collapse_metrics import (
    CollapseMetricsSettings,
    EchoTrapMonitor,
    EchoTrapSettings,
    ReasoningSample,
    collapse_metrics,
    cross_log_probs,
    draw_samples,
    first_turn_samples,
    information_estimates,
)
from rllib_ragen.training.module import LLMModuleSettings, LLMRLModule, module_config

LOG2 = math.log(2)
# ln(1 + e^-10): what the other prompt adds to a diagonal-dominant row's mixture.
TAIL = math.log1p(math.exp(-10))


def test_diagonal_dominant_scores_give_the_most_information():
    # Each reasoning is e^10 times likelier under its own prompt. matched = 0; the mixture
    # log p_mix = ln((e^0 + e^-10) / 2) = TAIL - ln 2, so I = ln 2 - TAIL, at the bound ln N = ln 2.
    estimates = information_estimates(torch.tensor([[0.0, -10.0], [-10.0, 0.0]]), torch.tensor([0, 1]))
    assert estimates["mutual_information"] == pytest.approx(LOG2 - TAIL)
    assert estimates["conditional_entropy"] == pytest.approx(0.0)
    assert estimates["reasoning_entropy"] == pytest.approx(LOG2 - TAIL)


def test_rows_that_ignore_the_prompt_give_zero_information():
    # Every reasoning equally likely under every prompt: p_mix = p(z|x), I = 0, H(Z) = H(Z|X) = (3 + 5) / 2.
    estimates = information_estimates(torch.tensor([[-3.0, -3.0], [-5.0, -5.0]]), torch.tensor([0, 1]))
    assert estimates["mutual_information"] == pytest.approx(0.0, abs=1e-12)
    assert estimates["conditional_entropy"] == pytest.approx(4.0)
    assert estimates["reasoning_entropy"] == pytest.approx(4.0)


def test_two_reasonings_per_prompt_by_hand():
    # Rows 0, 1 from prompt 0, rows 2, 3 from prompt 1 (columns: prompts 0 and 1).
    cross = torch.tensor([[-1.0, -1.0], [-2.0, -4.0], [-3.0, -1.0], [-2.0, -2.0]])
    own = torch.tensor([0, 0, 1, 1])
    matched = [-1.0, -2.0, -1.0, -2.0]
    mixture = [math.log((math.exp(a) + math.exp(b)) / 2) for a, b in cross.tolist()]
    estimates = information_estimates(cross, own)
    assert estimates["conditional_entropy"] == pytest.approx(1.5)
    assert estimates["reasoning_entropy"] == pytest.approx(-sum(mixture) / 4)
    assert estimates["mutual_information"] == pytest.approx(sum(m - x for m, x in zip(matched, mixture)) / 4)
    with pytest.raises(ValueError, match="cross_logp must be \\[M, N\\] and own_prompt \\[M\\]"):
        information_estimates(cross, own[:3])


def test_settings_and_sampling():
    settings = CollapseMetricsSettings(collapse_metrics_interval=5, collapse_metrics_samples=4)
    assert [i for i in range(1, 12) if settings.due(i, first=i == 1)] == [1, 5, 10]
    assert settings.due(7, first=True)  # a resumed run measures its first iteration too
    assert not CollapseMetricsSettings(collapse_metrics_interval=0).due(1, first=True)
    with pytest.raises(ValueError, match="collapse_metrics_samples must be >= 2"):
        CollapseMetricsSettings(collapse_metrics_samples=1)
    pool = [ReasoningSample((1,), (i,), i) for i in range(10)]
    drawn = draw_samples(pool, 4, np.random.default_rng(0))
    assert len(drawn) == len(set(drawn)) == 4 and set(drawn) <= set(pool)
    assert draw_samples(pool, 4, np.random.default_rng(0)) == drawn
    assert draw_samples(pool[:3], 4, np.random.default_rng(0)) == pool[:3]


@pytest.fixture(scope="module")
def module(tiny_model_path):
    space = gym.spaces.Text(max_length=8)
    config = module_config(LLMModuleSettings(model=str(tiny_model_path), critic="none"), logit_temperature=0.7)
    return LLMRLModule(observation_space=space, action_space=space, model_config=config)


def test_cross_scores_are_the_models_log_probs(module, tiny_model_path):
    prompts, reasonings = [[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]]
    scores = cross_log_probs(module, prompts, reasonings, micro_batch_size=3)
    model = load_causal_lm(tiny_model_path)
    for i, z in enumerate(reasonings):
        for j, x in enumerate(prompts):
            with torch.no_grad():
                logits = model(torch.tensor([x + z])).logits[0] / 0.7
            logp = torch.log_softmax(logits, dim=-1)
            expected = sum(float(logp[len(x) + t - 1, token]) for t, token in enumerate(z))
            assert float(scores[i, j]) == pytest.approx(expected, abs=1e-4), (i, j)


def test_collapse_metrics_score_each_distinct_prompt_once_per_group_column(module):
    # Groups 3 and 4 show the same prompt: 3 groups (columns), 2 distinct prompts scored.
    samples = [
        ReasoningSample((5, 6), (10, 11), 3),
        ReasoningSample((5, 6), (12,), 4),
        ReasoningSample((8, 9, 7), (13, 14, 15), 9),
    ]
    metrics = collapse_metrics(module, samples, micro_batch_size=4)
    cross = cross_log_probs(module, [(5, 6), (5, 6), (8, 9, 7)], [s.reasoning_ids for s in samples], micro_batch_size=4)
    lengths = torch.tensor([[2.0], [1.0], [3.0]])
    expected = information_estimates(cross / lengths, torch.tensor([0, 1, 2]))
    assert metrics["mutual_information"] == pytest.approx(expected["mutual_information"], abs=1e-5)
    assert metrics["conditional_entropy"] == pytest.approx(expected["conditional_entropy"], abs=1e-5)
    assert metrics["mutual_information_seq"] == pytest.approx(
        information_estimates(cross, torch.tensor([0, 1, 2]))["mutual_information"], abs=1e-4
    )
    assert (metrics["num_samples"], metrics["num_prompts"], metrics["mi_upper_bound"]) == (3.0, 3.0, math.log(3))
    with pytest.raises(ValueError, match=">= 2 groups"):
        collapse_metrics(module, samples[:1], micro_batch_size=4)


PROTOCOL = ProtocolSettings(max_actions_per_turn=3, think=True)
BUDGET = TurnBudgetSettings(max_turns=2, max_actions_per_traj=6)


@pytest.fixture(scope="module")
def demos(tiny_tokenizer):
    settings = DemonstrationSettings(seeds=range(6), protocol=PROTOCOL, budget=BUDGET)
    return expert_demonstrations(tiny_tokenizer, settings)


@pytest.mark.parametrize("prefill", [False, True])
def test_first_turn_pairs_of_real_episodes(tiny_tokenizer, demos, prefill):
    template = ChatTemplate.from_tokenizer(tiny_tokenizer)
    prefill_text = "<think>" if prefill else ""
    samples = first_turn_samples(demos, encode=template.encode, prefill_text=prefill_text)
    assert len(samples) == len(demos) and len({s.group_id for s in samples}) == len(demos)
    think = tuple(template.encode("<think>"))
    for sample, episode in zip(samples, demos):
        (agent,) = episode.agent_episodes.values()
        user = tuple(turn_record(agent, 0).user_ids)
        # X = system + first user turn (with its prefill) + <think> unless prefilled; Z = the thought alone.
        assert sample.prompt_ids == tuple(trajectory_start(agent).system_ids) + user + (() if prefill else think)
        thought = template.tokenizer.decode(list(sample.reasoning_ids))
        assert thought.startswith("Shortest plan from here:") and "<" not in thought


def test_the_metrics_reach_a_runs_mlflow(ray_session, tiny_model_path, demos, tmp_path):
    """A StarPO run (offline, on the expert's multi-turn episodes: a random tiny model writes no
    thoughts) measures at its first iteration and logs both estimates to MLflow."""
    write_trajectories(demos, tmp_path / "demos.parquet", env="sokoban")
    config = tiny_config(tiny_model_path).rollouts(
        n_groups=4, group_size=1, max_actions_per_turn=3, max_actions_per_traj=6
    )
    config.starpo_evaluation(eval_interval=0).diagnostics(collapse_metrics_samples=3)
    config = offline_config(config, OfflineSettings(str(tmp_path / "demos.parquet"), objective="starpo"))
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run(
        config,
        driver_args(
            "--tracking-uri",
            store,
            "--experiment",
            "collapse",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            stop_iters=1,
        ),
    )
    client = MlflowClient(store)
    (found,) = client.search_runs([client.get_experiment_by_name("collapse").experiment_id])
    logged = {
        key: client.get_metric_history(found.info.run_id, f"collapse/{key}")
        for key in ("mutual_information", "conditional_entropy", "num_samples", "mi_upper_bound")
    }
    assert {key: [m.step for m in history] for key, history in logged.items()} == {key: [1] for key in logged}
    (samples,), (bound,), (mi,), (entropy,) = (
        logged[k] for k in ("num_samples", "mi_upper_bound", "mutual_information", "conditional_entropy")
    )
    assert samples.value == 3.0 and bound.value in (math.log(2), math.log(3))  # 3 thoughts of 2 or 3 groups
    assert math.isfinite(mi.value) and mi.value <= bound.value  # I(X;Z) <= ln N holds for every sample
    # A random model spreads its probability over the whole vocabulary: about ln(49152) = 10.8 nats a token.
    assert entropy.value == pytest.approx(10.8, abs=0.5)


# In-group reward std per iteration of a 20-iteration default run as issue 15 measured it:
# 0.215 at the start, 0.025 by iteration 11, 0.000 from iteration 15 (no warning was given).
COLLAPSING_STD = [
    0.215,
    0.198,
    0.221,
    0.174,
    0.160,
    0.131,
    0.118,
    0.090,
    0.071,
    0.048,
    0.025,
    0.031,
    0.012,
    0.006,
    0.000,
    0.000,
    0.004,
    0.000,
    0.000,
    0.000,
]
# Noisy but healthy: the same early level, with single and paired dips to near 0 that recover.
HEALTHY_STD = [
    0.210,
    0.180,
    0.250,
    0.120,
    0.300,
    0.030,
    0.220,
    0.150,
    0.020,
    0.010,
    0.260,
    0.040,
    0.170,
    0.230,
    0.110,
    0.280,
    0.020,
    0.200,
    0.160,
    0.240,
]


def replay(values, signal="reward_variance", rule=None):
    monitor = EchoTrapMonitor(rule or EchoTrapSettings())
    return [
        (iteration, warnings)
        for iteration, warnings in enumerate((monitor.update({signal: v}) for v in values), start=1)
        if warnings
    ]


def test_the_issues_collapse_warns_by_iteration_13():
    # Early level: mean of iterations 1-3 = (0.215 + 0.198 + 0.221) / 3 = 0.2113; low below 0.2 x that = 0.0423.
    # Iterations 11 (0.025), 12 (0.031) and 13 (0.012) are the first 3 low ones in a row.
    flagged = replay(COLLAPSING_STD)
    assert [iteration for iteration, _ in flagged] == list(range(13, 21))
    (first,) = flagged[0][1].values()
    assert first.startswith("echo trap, reward-variance collapse: in-group reward std 0.012")
    assert "early level 0.2113" in first and "for 3 measurements" in first


def test_a_noisy_healthy_run_does_not_warn():
    # Same early level (0.2133, low below 0.0427); its lows (iterations 6, 9-10, 12, 17) never make 3 in a row.
    assert replay(HEALTHY_STD) == []


def test_a_recovery_resets_the_streak():
    rule = EchoTrapSettings(baseline_iters=2, patience=2, ratio=0.5)
    # Early level 1.0, low below 0.5: 0.1, then 0.9 recovers, then two lows in a row warn.
    assert [i for i, _ in replay([1.0, 1.0, 0.1, 0.9, 0.1, 0.1], rule=rule)] == [6]


def test_sparse_signals_name_their_collapse():
    # I(X;Z) and H(Z|X) measured at iterations 1, 5, 10, 15 (None in between): early level = iteration 1's.
    monitor = EchoTrapMonitor()
    mi = {1: 0.40, 5: 0.05, 10: 0.03, 15: 0.01}  # below 0.2 x 0.40 = 0.08 from iteration 5 on
    entropy = {1: 1.50, 5: 1.20, 10: 1.40, 15: 1.30}  # healthy
    warnings = {
        iteration: monitor.update(
            {
                "reward_variance": 0.2,
                "mutual_information": mi.get(iteration),
                "conditional_entropy": entropy.get(iteration),
            }
        )
        for iteration in range(1, 16)
    }
    assert [i for i, w in warnings.items() if w] == [15]
    assert list(warnings[15]) == ["mutual_information"]
    warning = warnings[15]["mutual_information"]
    assert warning.startswith("echo trap, template collapse: I(X;Z) 0.01") and "early level 0.4 " in warning
    collapsing_entropy = EchoTrapMonitor(EchoTrapSettings(patience=2))
    for value in (2.0, None, None, 0.3, 0.1):
        warning = collapsing_entropy.update({"conditional_entropy": value})
    assert warning["conditional_entropy"].startswith("echo trap, entropy collapse: H(Z|X) 0.1")


def test_signals_without_a_positive_early_level_never_warn():
    monitor = EchoTrapMonitor(EchoTrapSettings(baseline_iters=1, patience=1))
    assert monitor.update({"mutual_information": -0.01}) == {}
    assert monitor.update({"mutual_information": -5.0}) == {}  # 0.2 x a negative level: no collapse to measure
    assert monitor.update({"reward_variance": math.nan}) == {}
    assert monitor.baseline("reward_variance") is None


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"baseline_iters": 0}, "echo_trap_baseline_iters"),
        ({"patience": 0}, "echo_trap_patience"),
        ({"ratio": 1.5}, "echo_trap_ratio"),
        ({"ratio": 0.0}, "echo_trap_ratio"),
    ],
)
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EchoTrapSettings(**kwargs)


def test_unknown_signals_are_named():
    with pytest.raises(ValueError, match="unknown echo-trap signals \\['entropy'\\]"):
        EchoTrapMonitor().update({"entropy": 1.0})
