"""The trajectory record: pieces written into real RLlib episodes come back equal, field by field,
and an episode made some other way is refused with the missing piece named."""


from __future__ import annotations

import numpy as np
import pytest
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from scripted_episodes import AGENT, BROKEN_LAKE_ENV, LAKE_ENV, ROOM_ENV, scripted_episode

from envs import make_env
from envs.base import FAILURE_KINDS
from rllib_ragen.rollout.evaluation import evaluate_on_seeds, failures_table
from rllib_ragen.rollout.prompt.token_history import TokenHistory
from rllib_ragen.rollout.trajectory_record import (
    TrajectoryStart,
    TurnRecord,
    episode_model_outputs,
    failure_counts,
    failure_kind,
    policy_version,
    response_text,
    start_info,
    trajectories_from_episodes,
    trajectory_from_episode,
    trajectory_start,
    turn_info,
    turn_model_outputs,
    turn_record,
)

START = TrajectoryStart(system_ids=[1, 2, 3], group_id=7, policy_version=4)
# Log-probs exactly representable in float32, so the round trip compares with ==.
TURNS = [
    TurnRecord(user_ids=[10, 11], close_ids=[12], sampling_logp=[-0.5, -0.25], response_text="<answer>Up</answer>"),
    TurnRecord(user_ids=[20], close_ids=[21, 22], sampling_logp=[-1.0], response_text="<answer>Left</answer>"),
]
ACTIONS = [[30, 31], [40]]
REWARDS = [0.5, -1.0]


def _multi_agent_episode() -> MultiAgentEpisode:
    """A group of one agent, written step by step as `LLMEnvRunner` writes it."""
    episode = MultiAgentEpisode(agent_module_ids={"traj_0": DEFAULT_MODULE_ID})
    episode.add_env_reset(observations={"traj_0": "s0"}, infos={"traj_0": {"seed": 3, **start_info(START)}})
    for t, (turn, action, reward) in enumerate(zip(TURNS, ACTIONS, REWARDS)):
        last = t == len(TURNS) - 1
        episode.add_env_step(
            observations={"traj_0": f"s{t + 1}"},
            actions={"traj_0": np.asarray(action, dtype=np.int32)},
            rewards={"traj_0": reward},
            infos={"traj_0": {"format_ok": True, **turn_info(turn)}},
            terminateds={"traj_0": last, "__all__": last},
            truncateds={"traj_0": False, "__all__": False},
            extra_model_outputs={"traj_0": turn_model_outputs(turn)},
        )
    return episode


def _single_agent_episode() -> SingleAgentEpisode:
    """One trajectory built at once, as the Parquet converter builds it."""
    return SingleAgentEpisode(
        observations=["s0", "s1", "s2"],
        infos=[start_info(START), *(turn_info(turn) for turn in TURNS)],
        actions=[np.asarray(a, dtype=np.int32) for a in ACTIONS],
        rewards=REWARDS,
        extra_model_outputs=episode_model_outputs(TURNS),
        terminated=True,
        len_lookback_buffer=0,
    )


def _expected_history(history_window: int | None) -> TokenHistory:
    history = TokenHistory(list(START.system_ids), history_window)
    for turn, action in zip(TURNS, ACTIONS):
        history.add_user(list(turn.user_ids))
        history.add_response(action, list(turn.sampling_logp), list(turn.close_ids))
    return history


@pytest.mark.parametrize("make", [_multi_agent_episode, _single_agent_episode])
def test_every_piece_written_reads_back_equal(make):
    episode = make()
    agent = episode.agent_episodes["traj_0"] if isinstance(episode, MultiAgentEpisode) else episode
    assert trajectory_start(agent) == START
    assert policy_version(agent) == START.policy_version
    for t, turn in enumerate(TURNS):
        assert turn_record(agent, t) == turn
        assert response_text(agent.get_infos(t + 1)) == turn.response_text
    for window in (None, 0, 1):
        (trajectory,) = trajectories_from_episodes([episode], history_window=window)
        assert trajectory.history == _expected_history(window)
        assert trajectory.turn_rewards == REWARDS
        assert trajectory.group_id == START.group_id


def test_data_nobody_sampled_live_has_no_policy_version():
    start = TrajectoryStart(system_ids=[1], group_id=0)
    episode = SingleAgentEpisode(observations=["s0"], infos=[start_info(start)], len_lookback_buffer=0)
    assert trajectory_start(episode) == start


def _foreign_episode(reset_info: dict, step_info: dict, extra_model_outputs: dict) -> SingleAgentEpisode:
    return SingleAgentEpisode(
        id_="foreign",
        observations=["s0", "s1"],
        infos=[reset_info, step_info],
        actions=[np.asarray([5], dtype=np.int32)],
        rewards=[1.0],
        extra_model_outputs={k: [v] for k, v in extra_model_outputs.items()},
        len_lookback_buffer=0,
    )


def test_an_episode_not_made_by_the_env_runner_is_refused_with_the_missing_piece_named():
    start, turn = start_info(START), TURNS[1]
    outputs = turn_model_outputs(turn)
    no_start = _foreign_episode({"seed": 1}, turn_info(turn), outputs)
    with pytest.raises(ValueError, match=r"episode foreign was not made by LLMEnvRunner: no 'system_ids' in its reset"):
        trajectory_from_episode(no_start, history_window=None)
    no_version = _foreign_episode(start_info(TrajectoryStart([1], 0)), turn_info(turn), outputs)
    with pytest.raises(ValueError, match=r"episode foreign .*no 'policy_version'"):
        policy_version(no_version)
    only_logp = {Columns.ACTION_LOGP: outputs[Columns.ACTION_LOGP]}
    no_user_ids = _foreign_episode(start, turn_info(turn), only_logp)
    with pytest.raises(ValueError, match=r"episode foreign .*no 'user_ids' in its extra_model_outputs"):
        trajectory_from_episode(no_user_ids, history_window=None)
    no_text = _foreign_episode(start, {}, outputs)
    with pytest.raises(ValueError, match=r"episode foreign .*no 'response_text' in the step info of turn 0"):
        turn_record(no_text, 0)
    # The learner needs no text: the token pieces alone rebuild the trajectory; metrics read "".
    assert trajectory_from_episode(no_text, history_window=None).history.turns[0].user_ids == list(turn.user_ids)
    assert response_text(no_text.get_infos(1)) == ""


def test_the_board_is_read_from_an_info_and_kept_out_of_stored_rows():
    from envs import make_env
    from envs.base import BOARD_INFO
    from rllib_ragen.rollout.trajectory_record import board_of, is_record_info_key

    _, info = make_env("frozenlake").reset(seed=1)
    board = board_of(info)
    assert board is not None and board.to_json() == info[BOARD_INFO]
    assert board_of({"success": False}) is None
    # A stored row leaves the picture out (the Parquet converter drops the record's keys from the env info).
    assert is_record_info_key(BOARD_INFO) and not is_record_info_key("success")


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
    assert [key.split("/")[0] for key in evaluation.outcomes] == ["0", "1", "2", "3", "4"]  # one trajectory a seed
    assert "| dead_box | 1 | 0.200 |" in failures_table(evaluation).splitlines()
