"""RAE (role-conditioned advantage estimation): baselines against numbers worked out by hand, the registry's
adapter, dropping zero-advantage trajectories, and the baselines' round trip through a learner checkpoint."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.rllib_private import learner_connector
from rllib_ragen.training.advantages import AdvantageInputs, AdvantageSettings, compute_advantages
from rllib_ragen.training.advantages.estimators import (
    RoleBaselines,
    role_conditioned_advantages,
    zero_advantage_trajectories,
)
from rllib_ragen.training.learner_connector import GroupAdvantages

P0, P1 = "TicTacToe-v0/player_0", "TicTacToe-v0/player_1"


def test_baselines_and_advantages_match_a_hand_computation_over_two_batches() -> None:
    # Batch 1: player_0 scores 1 and 0 (mean 0.5), player_1 -1 and 0 (mean -0.5); baselines start at 0.
    # b0 = 0.95 * 0 + 0.05 * 0.5 = 0.025 and b1 = -0.025, updated before the advantages are taken.
    advantages, baselines = role_conditioned_advantages(torch.tensor([1.0, -1.0, 0.0, 0.0]), [P0, P1, P0, P1], {})
    assert baselines == pytest.approx({P0: 0.025, P1: -0.025})
    assert advantages.tolist() == pytest.approx([0.975, -0.975, -0.025, 0.025])
    # Batch 2: player_1 made an invalid move (-1.5), player_0 got +0.5.
    # b0 = 0.95 * 0.025 + 0.05 * 0.5 = 0.04875; b1 = 0.95 * -0.025 + 0.05 * -1.5 = -0.09875.
    advantages, baselines = role_conditioned_advantages(torch.tensor([0.5, -1.5]), [P0, P1], baselines)
    assert baselines == pytest.approx({P0: 0.04875, P1: -0.09875})
    assert advantages.tolist() == pytest.approx([0.45125, -1.40125])
    # A role absent from a batch keeps its baseline; a new game's role starts from 0 (decay 0.5 here).
    _, after = role_conditioned_advantages(torch.tensor([1.0]), ["KuhnPoker-v0/player_1"], baselines, decay=0.5)
    assert after == pytest.approx({P0: 0.04875, P1: -0.09875, "KuhnPoker-v0/player_1": 0.5})


def test_bad_decay_and_mismatched_roles_are_refused() -> None:
    with pytest.raises(ValueError, match="decay"):
        role_conditioned_advantages(torch.zeros(1), [P0], {}, decay=1.0)
    with pytest.raises(ValueError, match="role keys"):
        role_conditioned_advantages(torch.zeros(2), [P0], {})


def _inputs(baselines: RoleBaselines | None) -> AdvantageInputs:
    # Two trajectories of 3 tokens: player_0's ends in reward 1 (2 tokens), player_1's in -1 (3 tokens).
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, -1.0]])
    return AdvantageInputs(rewards=rewards, generated_mask=mask, roles=(P0, P1), role_baselines=baselines)


def test_registered_estimator_gives_every_token_of_a_seat_its_advantage_and_updates_the_learner_state() -> None:
    baselines = RoleBaselines({P0: 0.5})
    advantages, returns = compute_advantages("rae", _inputs(baselines), rae_decay=0.5)
    # b0 = 0.5 * 0.5 + 0.5 * 1 = 0.75 -> A = 0.25; b1 = 0.5 * 0 + 0.5 * -1 = -0.5 -> A = -0.5; 0 on padding.
    assert torch.allclose(advantages, torch.tensor([[0.25, 0.25, 0.0], [-0.5, -0.5, -0.5]]))
    assert torch.equal(advantages, returns)
    assert baselines.values == pytest.approx({P0: 0.75, P1: -0.5})
    assert AdvantageSettings(advantage_estimator="rae", advantage_hparams={"rae_decay": 0.9}).hparams() == {
        "rae_decay": 0.9
    }
    with pytest.raises(ValueError, match="roles"):
        compute_advantages("rae", _inputs(None))


def test_zero_advantage_trajectories_are_found() -> None:
    advantages = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    assert zero_advantage_trajectories(advantages, mask).tolist() == [False, True, True]


def _rae_piece(learner) -> GroupAdvantages:
    return next(c for c in learner_connector(learner).connectors if isinstance(c, GroupAdvantages))


def test_role_baselines_round_trip_through_a_learner_checkpoint(tiny_model_path, tmp_path) -> None:
    config = StarPOConfig().llm(model=str(tiny_model_path), critic="none").training(advantage_estimator="rae")
    spaces = {DEFAULT_MODULE_ID: (gym.spaces.Text(8), gym.spaces.Text(8))}
    trained = config.build_learner(spaces=spaces)
    _rae_piece(trained).role_baselines.values = {P0: 0.3125, P1: -0.0625}
    trained.save_to_path(str(tmp_path / "learner"))
    assert "learner_connector" not in trained.get_state(components="rl_module")  # weights alone stay weights
    restored = config.build_learner(spaces=spaces)
    assert _rae_piece(restored).role_baselines.values == {}
    restored.restore_from_path(str(tmp_path / "learner"))
    assert _rae_piece(restored).role_baselines.values == {P0: 0.3125, P1: -0.0625}
