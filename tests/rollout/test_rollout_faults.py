"""Faults in the rollout: an env that raises, hangs or returns garbage ends only
its own trajectories (logged with env and seed, counted in `env_errors`) while
the rest of the batch goes on; prompts that outgrow the model are truncated
and counted; the rollout timing splits engine, env and prompt-building time.

The policy is the real tiny-random model in the real HF engine, made to
always give one well-formed answer (`ForcedAnswerEngine`): a random model
almost never writes `<answer>...</answer>`, and only parsed actions reach the
env. Its log-probs are the engine's own scores of that answer.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from typing import Any

import numpy as np
import pytest
from ray.rllib.core import DEFAULT_MODULE_ID
from run_helpers import ForcedAnswerEngine

from envs import register_env
from envs.base import TextEnv
from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.rollout.env_group import EnvGroup, TurnBudgetSettings
from rllib_ragen.rollout.env_runner import LLMEnvRunner
from rllib_ragen.rollout.trajectory_record import trajectories_from_episodes

TIMEOUT_S = 0.3
FIRST_SEED = 10_000  # even: faulty group; FIRST_SEED + 1 is odd: healthy group
RELEASE = threading.Event()  # lets abandoned hung calls finish at the end of the module


class FaultyEnv(TextEnv):
    """Any action moves one step (+1 reward); the episode ends after 3 steps.

    With an even seed it fails in the way `fault` names; odd seeds are healthy.
    """

    FAULTS = ("none", "raise_step", "hang_step", "nan_reward", "bad_obs", "wrong_tuple", "raise_reset", "hang_reset")

    def __init__(self, *, fault: str = "none") -> None:
        super().__init__()
        assert fault in self.FAULTS, fault
        self.fault, self.faulty, self.position = fault, False, 0

    @property
    def instructions(self) -> str:
        return "Write any action."

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> dict[str, Any]:
        self.faulty, self.position = self.np_random_seed % 2 == 0, 0
        if self.faulty and self.fault == "raise_reset":
            raise RuntimeError("reset exploded")
        if self.faulty and self.fault == "hang_reset":
            RELEASE.wait(60)
        return {}

    def step(self, action: str):
        if self.faulty and self.fault == "bad_obs":
            return None, 0.0, False, False, {}
        if self.faulty and self.fault == "wrong_tuple":
            return "state", 0.0, False, {}
        return super().step(action)

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        if self.faulty and self.fault == "raise_step":
            raise RuntimeError("step exploded")
        if self.faulty and self.fault == "hang_step":
            RELEASE.wait(60)
        self.position += 1
        reward = math.nan if self.faulty and self.fault == "nan_reward" else 1.0
        return reward, self.position >= 3, False, {"success": self.position >= 3}

    def render_text(self) -> str:
        return f"You are at position {self.position}."


@pytest.fixture(scope="module", autouse=True)
def faulty_env():
    register_env("faulty", FaultyEnv, overwrite=True)
    yield
    RELEASE.set()


def faulty_config(model_path, fault: str, **rollouts) -> StarPOConfig:
    settings = dict(n_groups=2, group_size=2, max_turns=2, max_actions_per_turn=1, response_length=16,
                    train_seed_start=FIRST_SEED + 1, env_step_timeout_s=TIMEOUT_S)
    settings.update(rollouts)
    return (
        StarPOConfig()
        .environment("faulty", env_config={"fault": fault})
        .llm(model=str(model_path), critic="head")
        .rollouts(**settings)
        .inference(engine="hf")
        .training(mini_batch_size=2, micro_batch_size=2, rollout_filter_ratio=1.0, actor_lr=1e-3, critic_lr=1e-3)
        .debugging(seed=0)
    )


def forced_runner(config: StarPOConfig, tokenizer) -> LLMEnvRunner:
    runner = LLMEnvRunner(config=config)
    answer = tokenizer.encode("<think>ok</think><answer>go</answer>", add_special_tokens=False)
    runner.engine = ForcedAnswerEngine(runner.engine, answer + [runner.protocol.stop_token_ids[0]])
    return runner


def last_infos(episode) -> dict[str, dict]:
    return {agent: e.get_infos()[-1] for agent, e in episode.agent_episodes.items()}


@pytest.mark.parametrize(
    "fault,message",
    [
        ("raise_step", "RuntimeError: step exploded"),
        ("hang_step", f"did not return within {TIMEOUT_S:g} s"),
        ("nan_reward", "reward nan, not a finite number"),
        ("bad_obs", "observation is a NoneType, not a str"),
        ("wrong_tuple", "step returned a tuple of 4"),
    ],
)
def test_faulty_step_ends_its_trajectories_and_the_batch_goes_on(
    tiny_model_path, tiny_tokenizer, caplog, fault, message
):
    runner = forced_runner(faulty_config(tiny_model_path, fault), tiny_tokenizer)
    try:
        with caplog.at_level(logging.WARNING, logger="rllib_ragen.rollout.env_group"):
            faulty, healthy = runner.sample(seeds=[FIRST_SEED, FIRST_SEED + 1])
        metrics = runner.get_metrics()
        timing = runner.last_rollout_timing
    finally:
        runner.stop()
    # The faulty group: one turn each, truncated, error recorded, reward 0 (finite).
    for agent_episode in faulty.agent_episodes.values():
        assert len(agent_episode) == 1 and agent_episode.is_truncated
        assert list(agent_episode.get_rewards()) == [0.0]
    assert all(message in info["env_error"] for info in last_infos(faulty).values())
    # The healthy group: both turns played, +1 per step, no error.
    for agent_episode in healthy.agent_episodes.values():
        assert len(agent_episode) == 2 and list(agent_episode.get_rewards()) == [1.0, 1.0]
    assert not any("env_error" in info for info in last_infos(healthy).values())
    assert metrics["env_errors"] == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all(f"'faulty' (seed {FIRST_SEED}" in w and message in w for w in warnings)
    # A hung step is abandoned after the timeout, and that time counts as env time.
    if fault == "hang_step":
        assert timing["env_step_s"] >= 2 * TIMEOUT_S
    assert len(trajectories_from_episodes([faulty, healthy], history_window=None)) == 4


@pytest.mark.parametrize(
    "fault,message", [("raise_reset", "RuntimeError: reset exploded"), ("hang_reset", "did not return within")]
)
def test_faulty_reset_leaves_its_group_out(tiny_model_path, tiny_tokenizer, caplog, fault, message):
    runner = forced_runner(faulty_config(tiny_model_path, fault), tiny_tokenizer)
    try:
        with caplog.at_level(logging.WARNING, logger="rllib_ragen.rollout.env_group"):
            episodes = runner.sample(seeds=[FIRST_SEED, FIRST_SEED + 1])
        assert runner.get_metrics()["env_errors"] == 2
        assert [e.get_infos(0)["traj_0"]["seed"] for e in episodes] == [FIRST_SEED + 1]
        assert sum("reset" in r.getMessage() and message in r.getMessage() for r in caplog.records) == 2
        with pytest.raises(RuntimeError, match=r"no group of env 'faulty' could start .*reset exploded|did not return"):
            runner.sample(seeds=[FIRST_SEED, FIRST_SEED + 2])
    finally:
        runner.stop()


def test_one_faulty_member_does_not_stop_its_group():
    group = EnvGroup(
        "faulty", {"fault": "none"}, group_size=3, budget=TurnBudgetSettings(max_turns=3), step_timeout_s=TIMEOUT_S
    )
    group.envs[1] = FaultyEnv(fault="raise_step")
    group.reset(seed=FIRST_SEED)
    _, rewards, terminateds, truncateds, infos = group.step({a: ["go"] for a in group.agents})
    assert rewards == {"traj_0": 1.0, "traj_1": 0.0, "traj_2": 1.0}
    assert truncateds["traj_1"] and not truncateds["traj_0"] and not terminateds["__all__"]
    assert group.errors == ["traj_1 step 'go': RuntimeError: step exploded"]
    _, rewards, _, _, _ = group.step({"traj_0": ["go"], "traj_2": ["go"]})
    assert rewards == {"traj_0": 1.0, "traj_2": 1.0}
    group.reset(seed=FIRST_SEED + 1)  # a reset starts a fresh error record
    assert group.errors == []


class ClosingEnv(FaultyEnv):
    """A FaultyEnv that remembers being closed (an OpenEnv client's close ends its server session)."""

    made: list[ClosingEnv] = []

    def __init__(self, *, fault: str = "none") -> None:
        super().__init__(fault=fault)
        self.closed = False
        ClosingEnv.made.append(self)

    def close(self) -> None:
        self.closed = True
        if self.fault == "hang_step":  # stands for any env whose close fails
            raise RuntimeError("close exploded")


def test_a_rollout_closes_every_env_it_made_even_when_no_group_starts(tiny_model_path, tiny_tokenizer, caplog):
    register_env("closing", ClosingEnv, overwrite=True)
    for fault, seeds in (("none", [FIRST_SEED + 1, FIRST_SEED + 3]), ("raise_reset", [FIRST_SEED, FIRST_SEED + 2])):
        ClosingEnv.made.clear()
        config = faulty_config(tiny_model_path, fault).environment("closing", env_config={"fault": fault})
        runner = forced_runner(config, tiny_tokenizer)
        try:
            if fault == "none":
                assert len(runner.sample(seeds=seeds)) == 2
            else:
                with pytest.raises(RuntimeError, match="no group of env 'closing' could start"):
                    runner.sample(seeds=seeds)
        finally:
            runner.stop()
        # The runner's probe, then 2 groups x 2.
        assert len(ClosingEnv.made) == 5 and all(env.closed for env in ClosingEnv.made), fault
    group = EnvGroup("closing", {"fault": "hang_step"}, group_size=2, budget=TurnBudgetSettings())
    with caplog.at_level(logging.WARNING):
        group.close()
    assert all(env.closed for env in group.envs)
    assert "env 'closing' (traj_1) failed to close: RuntimeError: close exploded" in caplog.text


def test_prompt_outgrowing_max_model_len_truncates_the_trajectory(tiny_model_path, tiny_tokenizer):
    probe = forced_runner(faulty_config(tiny_model_path, "none"), tiny_tokenizer)
    try:
        (episode,) = probe.sample(seeds=[FIRST_SEED + 1])
        trajectory = trajectories_from_episodes([episode], history_window=None)[0]
    finally:
        probe.stop()
    first, second = (len(trajectory.history.prompt_ids(t)) for t in (0, 1))
    # Room for the first prompt and its answer, one token short for the second prompt.
    response_length = 16
    config = faulty_config(tiny_model_path, "none", response_length=response_length)
    config.inference(max_model_len=second - 1 + response_length)
    assert first + response_length <= config.rollout_engine.max_model_len
    runner = forced_runner(config, tiny_tokenizer)
    try:
        episodes = runner.sample(seeds=[FIRST_SEED + 1, FIRST_SEED + 3])
        metrics = runner.get_metrics()
    finally:
        runner.stop()
    assert metrics["truncated_prompt_trajectories"] == 4
    for episode in episodes:
        for agent_episode in episode.agent_episodes.values():
            assert len(agent_episode) == 1 and agent_episode.is_truncated
            assert agent_episode.get_infos()[-1]["prompt_truncated"]
    # The truncated trajectories still train: one answered turn each.
    trajectories = trajectories_from_episodes(episodes, history_window=None)
    assert [len(t.history.answered_turns()) for t in trajectories] == [1] * 4


def test_rollout_timing_splits_engine_env_and_prompt_time(tiny_model_path, tiny_tokenizer):
    runner = forced_runner(faulty_config(tiny_model_path, "none"), tiny_tokenizer)
    try:
        runner.sample()
        timing = runner.last_rollout_timing
    finally:
        runner.stop()
    assert set(timing) == {"total_s", "engine_s", "env_step_s", "prompt_build_s"}
    assert all(value > 0 for value in timing.values())
    assert timing["engine_s"] + timing["env_step_s"] + timing["prompt_build_s"] <= timing["total_s"]


class CachedPrefixEngine(ForcedAnswerEngine):
    """Forced answers whose engine says it took each prompt's first 5 tokens from its prefix cache."""

    def __init__(self, engine, answer_ids: list[int]) -> None:
        super().__init__(engine, answer_ids)
        self.prompt_lengths: list[int] = []

    def generate(self, prompts, params):
        self.prompt_lengths += [len(prompt) for prompt in prompts]
        return [dataclasses.replace(c, cached_prompt_tokens=5) for c in super().generate(prompts, params)]


def test_the_rollout_counts_the_prompt_positions_its_engine_computed(tiny_model_path, tiny_tokenizer):
    runner = forced_runner(faulty_config(tiny_model_path, "none"), tiny_tokenizer)
    runner.engine = engine = CachedPrefixEngine(runner.engine.engine, runner.engine.answer_ids)
    try:
        runner.sample()
        seconds = runner.last_rollout_timing["total_s"]
        metrics = runner.get_metrics()
    finally:
        runner.stop()
    assert len(engine.prompt_lengths) >= 4  # 2 groups x 2, for one turn or two
    prefilled = sum(length - 5 for length in engine.prompt_lengths)
    assert metrics["rollout_prefill_tokens_per_s"] * seconds == pytest.approx(prefilled)
    sampled = len(engine.prompt_lengths) * len(engine.answer_ids)
    assert metrics["rollout_tokens_per_s"] * seconds == pytest.approx(sampled)


def test_training_goes_on_past_a_faulty_env(tiny_model_path, tiny_tokenizer):
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    algo = faulty_config(tiny_model_path, "raise_step", train_seed_start=FIRST_SEED + 1).build_algo()
    try:
        runner = algo.env_runner
        answer = tiny_tokenizer.encode("<think>ok</think><answer>go</answer>", add_special_tokens=False)
        runner.engine = ForcedAnswerEngine(runner.engine, answer + [runner.protocol.stop_token_ids[0]])
        result = algo.train()  # seeds 10001 (healthy) and 10002 (faulty)
    finally:
        algo.stop()
        ray.shutdown()
    assert result["env_runners"]["env_errors"] == 2
    assert result["learners"][DEFAULT_MODULE_ID]["num_trained_tokens"] > 0
