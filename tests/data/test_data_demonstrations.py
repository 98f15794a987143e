"""Sokoban solver demonstrations: the rollout protocol, the solver's plan, success when replayed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import ray

from envs import make_env
from envs.sokoban import BOX_ON_TARGET_REWARD, SOLVED_REWARD, STEP_PENALTY
from envs.sokoban_solver import solve
from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.data.convert import episodes_to_rows, rows_to_episodes
from rllib_ragen.data.demonstrations import (
    DemonstrationSettings,
    demonstration_response,
    expert_demonstrations,
)
from rllib_ragen.rollout.env_group import TurnBudgetSettings
from rllib_ragen.rollout.prompt.prompt_protocol import PromptProtocol, ProtocolSettings
from rllib_ragen.rollout.prompt.token_history import ChatTemplate
from rllib_ragen.rollout.trajectory_record import trajectory_start, turn_record

SEEDS = tuple(range(8))
PROTOCOL = ProtocolSettings(max_actions_per_turn=3, think=True)
BUDGET = TurnBudgetSettings(max_turns=5, max_actions_per_traj=15)


def _protocol(tokenizer, protocol_settings=PROTOCOL):
    env = make_env("sokoban")
    return PromptProtocol(
        ChatTemplate.from_tokenizer(tokenizer), instructions=env.instructions,
        action_vocabulary=env.action_vocabulary, config=protocol_settings,
    )


def _plan(seed):
    env = make_env("sokoban")
    env.reset(seed=seed)
    return solve(env)


@pytest.fixture(scope="module")
def demos(tiny_tokenizer):
    return expert_demonstrations(tiny_tokenizer, DemonstrationSettings(seeds=SEEDS, protocol=PROTOCOL, budget=BUDGET))


def test_every_seed_solved_within_the_budget_gives_one_demonstration(demos):
    fitting = [s for s in SEEDS if len(_plan(s)) <= 15]
    assert len(fitting) >= 4  # the test means something
    assert [e.agent_episodes["traj_0"].get_infos(0)["seed"] for e in demos] == fitting
    assert [trajectory_start(e.agent_episodes["traj_0"]).group_id for e in demos] == list(range(len(fitting)))


@pytest.mark.parametrize(
    "protocol_settings",
    [PROTOCOL, ProtocolSettings(max_actions_per_turn=2, think=False, prefill=True)],
    ids=["think", "prefill"],
)
def test_responses_parse_back_to_the_solvers_plan(tiny_tokenizer, protocol_settings):
    demos = expert_demonstrations(
        tiny_tokenizer, DemonstrationSettings(seeds=SEEDS[:4], protocol=protocol_settings, budget=BUDGET)
    )
    protocol = _protocol(tiny_tokenizer, protocol_settings)
    for episode in demos:
        trajectory = episode.agent_episodes["traj_0"]
        plan = _plan(trajectory.get_infos(0)["seed"])
        chunks = [protocol.parse(trajectory.get_actions(t)) for t in range(len(trajectory))]
        assert all(parsed.format_ok and not parsed.invalid_actions for _, parsed in chunks)
        assert [a for _, parsed in chunks for a in parsed.actions] == plan
        assert all(len(parsed.actions) <= protocol_settings.max_actions_per_turn for _, parsed in chunks)
        assert len(trajectory) == -(-len(plan) // protocol_settings.max_actions_per_turn)
        # One box: every move costs 0.1, the last push lands the box (+1) and solves the room (+10).
        expected = STEP_PENALTY * len(plan) + BOX_ON_TARGET_REWARD + SOLVED_REWARD
        assert sum(trajectory.get_rewards()) == pytest.approx(expected)
        assert trajectory.get_infos(-1)["success"] and trajectory.is_terminated
        assert np.isnan(turn_record(trajectory, 0).sampling_logp).all()


def test_stored_demonstrations_succeed_when_replayed_in_the_env(demos, tiny_tokenizer):
    rows = episodes_to_rows(demos, env="sokoban")
    assert all(row["sampling_logp"] is None and row["success"] for row in rows)
    protocol = _protocol(tiny_tokenizer)
    for row in rows:
        env = make_env(row["env"])
        env.reset(seed=row["seed"])
        info = {}
        for _, response_start, response_end in row["turn_spans"]:
            _, parsed = protocol.parse(row["token_ids"][response_start:response_end])
            for action in parsed.actions:
                _, _, terminated, _, info = env.step(action)
        assert info["success"] and terminated
    # And the rows come back as the same episodes.
    assert episodes_to_rows(rows_to_episodes(rows), env="sokoban") == rows


def test_demonstration_prompts_are_the_runners_prompts(demos, tiny_model_path):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    config = (
        StarPOConfig().environment("sokoban").llm(model=str(tiny_model_path), critic="none")
        .rollouts(max_turns=BUDGET.max_turns, max_actions_per_turn=3, max_actions_per_traj=15, response_length=4)
        .training(advantage_estimator="grpo").inference(engine="hf").starpo_evaluation(eval_interval=0)
    )
    algo = config.build_algo()
    try:
        seed = demos[0].agent_episodes["traj_0"].get_infos(0)["seed"]
        rollout = algo.env_runner.sample(seeds=[seed], group_size=1)[0].agent_episodes["traj_0"]
    finally:
        algo.stop()
        ray.shutdown()
    demo = demos[0].agent_episodes["traj_0"]
    assert trajectory_start(demo).system_ids == trajectory_start(rollout).system_ids
    assert turn_record(demo, 0).user_ids == turn_record(rollout, 0).user_ids
    assert demo.get_observations(0) == rollout.get_observations(0)


def test_answer_ends_with_the_end_of_turn_token(tiny_tokenizer):
    protocol = _protocol(tiny_tokenizer)
    ids = demonstration_response(protocol, ["Up", "Left"], "Shortest plan from here: Up, Left, Down.")
    assert ids[-1] == protocol.template.eos_token_id
    text, parsed = protocol.parse(ids)
    assert text.startswith("<think>Shortest plan from here: Up, Left, Down.</think>")
    assert parsed.actions == ("Up", "Left")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(seeds=()), "at least one"),
        (dict(seeds=(1, 1)), "must not repeat"),
        (dict(seeds=(1,), max_states=0), "max_states"),
    ],
)
def test_bad_demonstration_config_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DemonstrationSettings(**kwargs)


def test_the_board_of_each_turn_stays_out_of_stored_rows(demos):
    # The live episodes carry Sokoban's board (for the pages): a stored row needs no picture.
    infos = [info for e in demos for a in e.agent_episodes.values() for info in a.get_infos()[1:]]
    assert infos and all("board" in info for info in infos)
    rows = episodes_to_rows(demos, env="sokoban")
    assert not any("board" in json.loads(info) for row in rows for info in row["turn_infos"])
    assert all("parsed_actions" in json.loads(info) for row in rows for info in row["turn_infos"])
