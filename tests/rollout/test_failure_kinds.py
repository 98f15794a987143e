"""Failure kinds: hand-made trajectories of each kind, played through a real `EnvGroup` on a
hand-made FrozenLake map and Sokoban room (tests/scripted_episodes.py), are told apart;
the counts name every kind of the env, zeros included, and reach the evaluation's statistics."""

from __future__ import annotations

import pytest
from scripted_episodes import AGENT, BROKEN_LAKE_ENV, LAKE_ENV, ROOM_ENV, scripted_episode

from envs import make_env
from envs.base import FAILURE_KINDS
from rllib_ragen.rollout.evaluation import evaluate_on_seeds, failures_table
from rllib_ragen.rollout.failure_kinds import failure_counts, failure_kind

# (env, answers, max turns, kind): the lake is S F H / F F F / H F G, the player at the top left;
# in the room the box is at (2,2), its target at (3,3) and the player at (4,1).
CASES = [
    (LAKE_ENV, [["Right", "Right"]], 5, "hole"),
    (LAKE_ENV, [["Down"], ["Up", "Up"], ["Left"]], 3, "repeated_no_op"),  # Up twice into the top edge, then Left
    (LAKE_ENV, [["Down"]], 1, "out_of_turns"),
    (LAKE_ENV, [["Down"], ["Jump"]], 2, "invalid_answer"),
    (LAKE_ENV, [["Down", "Right"], ["Right", "Down"]], 5, None),
    (ROOM_ENV, [["Right", "Up", "Up"]], 1, "dead_box"),  # the box pushed against the top wall
    (ROOM_ENV, [["Left", "Left"]], 1, "repeated_no_op"),  # into the left wall twice
    (ROOM_ENV, [["Right"], ["Jump"]], 2, "invalid_answer"),
    (ROOM_ENV, [["Right"]], 1, "out_of_turns"),
    (ROOM_ENV, [["Up", "Up", "Right"], ["Up", "Right", "Down"]], 5, None),
    (BROKEN_LAKE_ENV, [["Down"], ["Up"]], 5, "env_error"),
]


@pytest.mark.parametrize("env,answers,turns,kind", CASES)
def test_each_hand_made_trajectory_ends_in_its_kind(env, answers, turns, kind):
    episode = scripted_episode(env, answers, max_turns=turns)
    assert failure_kind(episode.agent_episodes[AGENT]) == kind


def test_a_single_no_op_before_the_turns_run_out_is_no_repeated_no_op():
    # Up into the top edge once, as the last move: the turns ran out, nobody was stuck.
    episode = scripted_episode(LAKE_ENV, [["Down"], ["Up", "Up"]], max_turns=2)
    assert failure_kind(episode.agent_episodes[AGENT]) == "out_of_turns"


def test_a_box_stuck_outranks_what_followed():
    # The box against the top wall first, then two moves into the left wall: the box decided it.
    episode = scripted_episode(ROOM_ENV, [["Right", "Up", "Up"], ["Left", "Left", "Left"]], max_turns=2)
    assert failure_kind(episode.agent_episodes[AGENT]) == "dead_box"
    # Also when the last answer held no action at all (the env did not step, so it gave no new board).
    episode = scripted_episode(ROOM_ENV, [["Right", "Up", "Up"], []], max_turns=2)
    trajectory = episode.agent_episodes[AGENT]
    assert "board" not in trajectory.get_infos(-1) and failure_kind(trajectory) == "dead_box"


def test_kinds_every_env_shares():
    low_arm = make_env("bandit_phoenix_dragon").config.arm_pairs[0][0]
    wrong = scripted_episode("bandit_phoenix_dragon", [[low_arm]], max_turns=1)
    assert failure_kind(wrong.agent_episodes[AGENT]) == "ended_unsolved"
    # The env runner marks a trajectory whose next prompt would not fit the context.
    cut = scripted_episode(LAKE_ENV, [["Down"]], max_turns=1).agent_episodes[AGENT]
    cut.get_infos(-1)["prompt_truncated"] = True
    assert failure_kind(cut) == "prompt_too_long"


def test_counts_name_every_kind_of_the_env_zeros_included_its_own_first():
    episodes = [scripted_episode(env, answers, max_turns=turns) for env, answers, turns, _ in CASES if env == LAKE_ENV]
    counts = failure_counts(episodes)
    assert list(counts) == ["hole", *FAILURE_KINDS]
    assert counts == {
        **dict.fromkeys(counts, 0),
        "hole": 1,
        "repeated_no_op": 1,
        "out_of_turns": 1,
        "invalid_answer": 1,
    }
    assert list(failure_counts([])) == list(FAILURE_KINDS)
    # What a kind means on the env: its own words for a shared kind.
    assert make_env(LAKE_ENV).failure_descriptions()["repeated_no_op"].startswith("stuck against an edge")
    assert list(make_env(ROOM_ENV).failure_descriptions()) == ["dead_box", *FAILURE_KINDS]


def test_an_evaluation_counts_its_failures_by_kind():
    plays = [(answers, turns) for env, answers, turns, _ in CASES if env == ROOM_ENV]

    def sample(*, seeds, group_size, temperature, evaluation):
        assert (group_size, evaluation) == (1, True)
        return [
            scripted_episode(ROOM_ENV, answers, seed=seed, max_turns=turns)
            for seed, (answers, turns) in zip(seeds, plays)
        ]

    evaluation = evaluate_on_seeds(sample, seeds=range(len(plays)), temperature=0.0)
    assert evaluation.failures == {
        **dict.fromkeys(["dead_box", *FAILURE_KINDS], 0),
        "dead_box": 1,
        "repeated_no_op": 1,
        "invalid_answer": 1,
        "out_of_turns": 1,
    }
    assert evaluation.stats["failures/dead_box"] == 1.0 and evaluation.successes == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert "| dead_box | 1 | 0.200 |" in failures_table(evaluation).splitlines()
