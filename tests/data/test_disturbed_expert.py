"""DART demonstrations: every answer is the expert's best move from the state shown, while the env
sometimes plays a random move instead, so the demonstrations reach states off the expert's path."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from envs import make_env
from envs.sokoban_solver import DEFAULT_MAX_STATES, solve
from envs.user_errors import UserError
from rllib_ragen.data.demonstrations import (
    DISTURBED_ACTIONS,
    DemonstrationSettings,
    expert_demonstrations,
)
from rllib_ragen.data.disturbed_expert import DisturbedExpert
from rllib_ragen.data.experts import TurnBudgetLeft
from rllib_ragen.rollout.env_group import TurnBudgetSettings
from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings
from rllib_ragen.run.warm_start import WarmStartSettings

MARKOV = ProtocolSettings(max_actions_per_turn=1, think=False, prefill=True, history_window=0)
BUDGET = TurnBudgetSettings(max_turns=8, max_actions_per_traj=8)
SEEDS = tuple(range(24))


def _moves_left_after(env, move: str) -> int | None:
    """The shortest plan's length after `move`, played on a copy of `env`."""
    after = copy.deepcopy(env)
    after.step(move)
    plan = solve(after)
    return None if plan is None else len(plan)


def _play(seed: int, noise: float) -> list[tuple[int, int | None, list[str] | None]]:
    """(shortest plan before the turn, after the answer's move, the disturbed moves) per turn."""
    env = make_env("sokoban")
    env.reset(seed=seed)
    expert = DisturbedExpert(env, noise=noise, rng=np.random.default_rng(seed), max_states=DEFAULT_MAX_STATES)
    turns = []
    for left in range(8, 0, -1):
        before = solve(env)
        turn = expert(env, TurnBudgetLeft(left, left, 1))
        if turn is None:
            assert before is None or len(before) > left  # gave up on a dead room, or on a plan the budget cuts
            break
        turns.append((len(before), _moves_left_after(env, turn.actions[0]), turn.played))
        _, _, terminated, truncated, _ = env.step((turn.played or turn.actions)[0])
        if terminated or truncated:
            break
    return turns


def test_every_answer_is_a_best_move_even_after_the_env_was_disturbed():
    turns = [turn for seed in SEEDS for turn in _play(seed, noise=0.4)]
    disturbed = [i for i, (_, _, played) in enumerate(turns) if played is not None]
    assert len(disturbed) >= 10  # the test means something
    assert all(after == before - 1 for before, after, _ in turns)
    # Answers given after a disturbance: the states a policy that erred reaches, with the way back.
    after_a_disturbance = [i for i in range(1, len(turns)) if turns[i - 1][2] is not None]
    assert len(after_a_disturbance) >= 5


def test_without_noise_the_env_plays_every_answer():
    turns = [turn for seed in SEEDS for turn in _play(seed, noise=0.0)]
    assert turns and all(played is None for _, _, played in turns)


def test_disturbed_demonstrations_record_the_moves_the_env_played(tiny_tokenizer):
    plain = expert_demonstrations(tiny_tokenizer, DemonstrationSettings(seeds=SEEDS, protocol=MARKOV, budget=BUDGET))
    settings = DemonstrationSettings(seeds=SEEDS, protocol=MARKOV, budget=BUDGET, noise=0.4, seed=3)
    disturbed = expert_demonstrations(tiny_tokenizer, settings)
    assert len(disturbed) >= len(plain) // 2
    replayed = 0
    for episode in disturbed:
        trajectory = episode.agent_episodes["traj_0"]
        infos = trajectory.get_infos()
        env = make_env("sokoban")
        observation, _ = env.reset(seed=infos[0]["seed"])
        # Replaying the moves the env played (the disturbed ones where named) gives the recorded states.
        for step, info in enumerate(infos[1:], start=1):
            assert trajectory.get_observations(step - 1) == observation
            moves = info.get(DISTURBED_ACTIONS, info["parsed_actions"])
            replayed += DISTURBED_ACTIONS in info
            for move in moves:
                observation, *_ = env.step(move)
        assert trajectory.get_observations(-1) == observation
    assert replayed >= 10


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(noise=1.0), r"noise must be in \[0, 1\)"),
        (dict(noise=0.2, protocol=ProtocolSettings(history_window=2)), "history_window=0, got 2"),
    ],
)
def test_bad_demonstration_noise_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DemonstrationSettings(seeds=SEEDS, **{"protocol": MARKOV, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(player="random"), "needs player 'expert'"),
        (dict(world_model_epochs=1), "world_model_epochs 1"),
    ],
)
def test_a_warm_start_that_cannot_be_disturbed_says_why(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WarmStartSettings(env="sokoban", protocol=MARKOV, expert_noise=0.2, **{"player": "expert", **kwargs})


def test_noise_names_a_new_warm_start():
    plain = WarmStartSettings(env="sokoban", protocol=MARKOV, player="expert")
    assert plain.fingerprint("m") != dataclasses.replace(plain, expert_noise=0.2).fingerprint("m")


def test_the_noise_flag_reaches_the_warm_start_and_a_bad_one_is_refused():
    from rllib_ragen.algorithm.presets import cpu_preset
    from rllib_ragen.run.flags import build_parser
    from rllib_ragen.run.warm_start import warm_start_config

    parser = build_parser(env="sokoban", description="", success_threshold=None, stop_iters=1)
    args = parser.parse_args(["--warm-start-noise", "0.25"])
    chosen = warm_start_config(cpu_preset("sokoban"), expert_noise=args.warm_start_expert_noise)
    assert chosen.expert_noise == 0.25
    assert warm_start_config(cpu_preset("sokoban"), tuned={"expert_noise": 0.1}).expert_noise == 0.1
    assert parser.parse_args([]).warm_start_expert_noise is None
    with pytest.raises(UserError, match="--warm-start-noise: must be a probability >= 0 and < 1, got '1'"):
        parser.parse_args(["--warm-start-noise", "1"])
