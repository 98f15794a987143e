"""Group randomness: members share the start; dynamics draws are shared or per (seed, member)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from run_helpers import ForcedAnswerEngine

from envs import make_env
from envs.base import DYNAMICS_STREAM, dynamics_generator
from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.rollout.env_group import DEFAULT_GROUP_RANDOMNESS, EnvGroup, TurnBudgetSettings
from rllib_ragen.rollout.env_runner import LLMEnvRunner

GROUP_SIZE = 8
LAKE_MOVES = ["Down", "Right", "Down", "Right", "Up", "Left", "Down", "Right"]


def _group(env: str, randomness: str, **budget) -> EnvGroup:
    return EnvGroup(env, group_size=GROUP_SIZE, budget=TurnBudgetSettings(**budget), group_randomness=randomness)


def _high_arm_payouts(randomness: str, seed: int, env: str = "bandit") -> list[float]:
    """Every member pulls the high arm once."""
    group = _group(env, randomness, max_turns=1)
    group.reset(seed=seed)
    _, rewards, *_ = group.step({agent: [env.pair[1]] for agent, env in zip(group.agents, group.envs)})
    return [rewards[agent] for agent in group.agents]


def _lake_walks(randomness: str, seed: int) -> list[list[str]]:
    """Every member plays the same moves, one a turn; each member's observations along the way."""
    group = _group("frozenlake", randomness, max_turns=len(LAKE_MOVES), max_actions_per_traj=len(LAKE_MOVES))
    observations, _ = group.reset(seed=seed)
    walks, live = {a: [observations[a]] for a in group.agents}, list(group.agents)
    for move in LAKE_MOVES:
        if not live:
            break
        obs, _, terminateds, truncateds, _ = group.step({agent: [move] for agent in live})
        for agent in live:
            walks[agent].append(obs[agent])
        live = [a for a in live if not (terminateds[a] or truncateds[a])]
    return [walks[a] for a in group.agents]


@pytest.mark.parametrize("env", ["bandit", "frozenlake", "sokoban", "countdown"])
def test_initial_states_are_one_per_seed_under_both_settings(env):
    starts = set()
    for randomness in ("shared", "independent"):
        observations, _ = _group(env, randomness).reset(seed=10_007)
        assert len(observations) == GROUP_SIZE
        starts |= set(observations.values())
    assert len(starts) == 1


def test_bandit_payouts_agree_within_a_group_when_shared_and_differ_when_independent():
    seeds = range(10_000, 10_040)
    shared = [_high_arm_payouts("shared", s) for s in seeds]
    independent = [_high_arm_payouts("independent", s) for s in seeds]
    assert all(len(set(payouts)) == 1 for payouts in shared)
    # Independent Bernoulli(0.25) members of 8 all agree with chance 0.75^8 + 0.25^8 = 0.1.
    assert sum(len(set(payouts)) == 2 for payouts in independent) >= 20
    # Each member's draws still pay 1.0 a quarter of the time: 320 draws, 4-std tolerance.
    draws = np.array(independent).ravel()
    assert abs(draws.mean() - 0.25) < 4 * math.sqrt(0.25 * 0.75 / draws.size)


def test_frozenlake_slips_agree_within_a_group_when_shared_and_differ_when_independent():
    seeds = range(10_000, 10_010)
    for seed in seeds:
        walks = _lake_walks("shared", seed)
        assert all(walk == walks[0] for walk in walks)
    differing = sum(len({tuple(w) for w in _lake_walks("independent", s)}) > 1 for s in seeds)
    assert differing >= 8


def test_independent_draws_are_reproducible_per_seed_and_member():
    assert _high_arm_payouts("independent", 10_003) == _high_arm_payouts("independent", 10_003)
    assert _lake_walks("independent", 10_004) == _lake_walks("independent", 10_004)
    # Member i of any group size draws what a lone env reset with stream i draws.
    env = make_env("frozenlake")
    walks = _lake_walks("independent", 10_004)
    for member in (0, 5):
        observation, _ = env.reset(seed=10_004, options={DYNAMICS_STREAM: member})
        alone = [observation]
        for move in LAKE_MOVES[: len(walks[member]) - 1]:
            alone.append(env.step(move)[0])
        assert alone == walks[member]


def test_deterministic_envs_are_unaffected():
    moves = ["Up", "Left", "Down", "Right", "Right", "Down"]
    runs = []
    for randomness in ("shared", "independent"):
        group = _group("sokoban", randomness, max_turns=len(moves), max_actions_per_traj=len(moves))
        group.reset(seed=10_001)
        runs.append([group.step({a: [m] for a in group.agents})[:2] for m in moves])
    assert runs[0] == runs[1]


def test_the_default_stream_is_the_seed_stream_and_streams_are_distinct():
    env = make_env("bandit")
    env.reset(seed=5)
    assert env.dynamics_rng is env.np_random
    draws = [dynamics_generator(5, k).random(4).tolist() for k in (0, 1)] + [
        np.random.default_rng(5).random(4).tolist()
    ]
    assert len({tuple(d) for d in draws}) == 3
    assert dynamics_generator(5, 1).random(4).tolist() == draws[1]


@pytest.mark.parametrize("stream", [-1, 1.5, "0", True])
def test_bad_stream_is_refused_by_name(stream):
    with pytest.raises(ValueError, match=DYNAMICS_STREAM):
        make_env("frozenlake").reset(seed=0, options={DYNAMICS_STREAM: stream})


def test_setting_is_checked_and_defaults_once():
    assert StarPOConfig().rollout.group_randomness == DEFAULT_GROUP_RANDOMNESS == "independent"
    with pytest.raises(ValueError, match="group_randomness"):
        EnvGroup("bandit", group_size=2, budget=TurnBudgetSettings(), group_randomness="per_member")
    with pytest.raises(ValueError, match="group_randomness"):
        StarPOConfig().environment("bandit").rollouts(group_randomness="per_member")


def test_the_rollout_runner_applies_the_setting(tiny_model_path, tiny_tokenizer):
    """Real runner and engine, made to always pull Dragon (the high arm of RAGEN v1's pair).

    The setting is the non-default "shared": a runner that ignored it would draw per member.
    """
    config = (
        StarPOConfig()
        .environment("bandit_phoenix_dragon")
        .llm(model=str(tiny_model_path), critic="none")
        .rollouts(
            n_groups=4,
            group_size=GROUP_SIZE,
            max_turns=1,
            max_actions_per_turn=1,
            max_actions_per_traj=1,
            response_length=8,
            think=False,
            group_randomness="shared",
        )
        .inference(engine="hf")
    )
    runner = LLMEnvRunner(config=config)
    answer = tiny_tokenizer.encode("<answer>Dragon</answer>", add_special_tokens=False)
    runner.engine = ForcedAnswerEngine(runner.engine, answer + [runner.protocol.stop_token_ids[0]])
    seeds = list(range(10_000, 10_004))
    try:
        episodes = runner.sample(seeds=seeds)
    finally:
        runner.stop()
    payouts = [[float(e.get_rewards()[0]) for e in episode.agent_episodes.values()] for episode in episodes]
    # One payout draw per group, the very draws of shared EnvGroups (which per-member draws
    # would match with chance 0.1 per group).
    assert payouts == [_high_arm_payouts("shared", s, env="bandit_phoenix_dragon") for s in seeds]
