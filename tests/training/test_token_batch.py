"""Token rows <-> trajectory layout, by hand-built trajectories."""

import pytest
import torch

from rllib_ragen.rollout.prompt.token_history import TokenHistory
from rllib_ragen.rollout.trajectory_record import Trajectory
from rllib_ragen.training.token_batch import build_token_batch


def _trajectory(turns, rewards, group_id, window=None):
    history = TokenHistory([1, 2], history_window=window)
    for user, response in turns:
        history.add_user(user)
        history.add_response(response, [-float(t) for t in response], [9])
    return Trajectory(history, rewards, group_id)


TRAJ_A = ([([10], [20, 21]), ([11, 12], [22])], [0.5, -1.0])
TRAJ_B = ([([13], [23, 24, 25])], [2.0])


def test_full_history_gives_one_row_per_trajectory():
    batch = build_token_batch(
        [_trajectory(*TRAJ_A, group_id=0), _trajectory(*TRAJ_B, group_id=1)], pad_token_id=0
    )
    # Row A: sys(1,2) u(10) r(20,21) c(9) u(11,12) r(22) c(9)
    assert batch.input_ids[0].tolist() == [1, 2, 10, 20, 21, 9, 11, 12, 22, 9]
    assert batch.generated_mask[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 1, 0]
    # Row B is padded to the same length.
    assert batch.input_ids[1].tolist() == [1, 2, 13, 23, 24, 25, 9, 0, 0, 0]
    assert batch.attention_mask[1].tolist() == [1] * 7 + [0] * 3
    assert batch.sampling_logp[0, 3].item() == -20.0
    # Trajectory layout: generated tokens in turn order, rewards on turn ends.
    assert batch.trajectories.generated_mask.tolist() == [[True, True, True], [True, True, True]]
    assert batch.trajectories.turn_rewards.tolist() == [[0.0, 0.5, -1.0], [0.0, 0.0, 2.0]]
    assert batch.trajectories.turn_ends.tolist() == [[False, True, True], [False, False, True]]
    assert batch.trajectories.group_ids.tolist() == [0, 1]


def test_rows_and_trajectories_round_trip():
    batch = build_token_batch(
        [_trajectory(*TRAJ_A, group_id=0), _trajectory(*TRAJ_B, group_id=0)], pad_token_id=0
    )
    traj_values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    rows = batch.to_rows(traj_values)
    assert rows[0].tolist() == [0, 0, 0, 1, 2, 0, 0, 0, 3, 0]
    assert torch.equal(batch.to_trajectories(rows), traj_values)


def test_history_window_gives_one_row_per_turn_in_turn_order():
    batch = build_token_batch([_trajectory(*TRAJ_A, group_id=0, window=0)], pad_token_id=0)
    assert batch.input_ids.shape[0] == 2
    assert batch.input_ids[1].tolist()[:5] == [1, 2, 11, 12, 22]  # window 0: no earlier turn
    values = batch.to_trajectories(batch.input_ids.float())
    assert values.tolist() == [[20.0, 21.0, 22.0]]  # response tokens in order across rows


def test_reward_count_must_match_turns():
    with pytest.raises(ValueError, match="rewards"):
        build_token_batch([_trajectory(TRAJ_A[0], [1.0], group_id=0)], pad_token_id=0)
