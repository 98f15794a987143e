"""Scale-out gives the local results: two DDP learners (gloo, CPU) take the single
learner's update on the same groups, and remote env runners sample whole groups
with the seeds a local runner would use."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ray.rllib.core import DEFAULT_MODULE_ID
from run_helpers import free_port, tiny_config

from rllib_ragen.algorithm.starpo import update_learners
from rllib_ragen.logits import masked_whiten
from rllib_ragen.rllib_private import local_learner
from rllib_ragen.rollout.env_runner import policy_weights
from rllib_ragen.training.advantages import whiten_across_learners
from rllib_ragen.training.distributed import (
    all_reduce_gradients,
    count_training_rows,
    global_share,
    learner_minibatch_sizes,
)


def _update(algo, groups):
    """Step 4 of the first iteration on `groups`."""
    config = algo.config
    return update_learners(
        algo.learner_group, groups, config.update, history_window=config.protocol.history_window, iteration=1
    )


def test_learner_minibatch_sizes_take_each_shards_share():
    # 6 + 2 rows, one step over everything: each learner its whole shard.
    assert learner_minibatch_sizes([6, 2], 8, 1) == ([6, 2], 1)
    # Mini-batches of 4 rows: 2 steps per epoch, 3 + 1 rows per step.
    assert learner_minibatch_sizes([6, 2], 4, 2) == ([3, 1], 4)


def _gloo_rank(rank: int, port: int, shards: list, out_dir: str) -> None:
    """One of two gloo processes: the cross-learner reductions on its own shard."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        values, mask = shards[rank]
        param = torch.nn.Parameter(torch.zeros(3))
        param.grad = torch.full((3,), float(rank + 1))
        all_reduce_gradients([param])
        torch.save(
            {
                "whitened": whiten_across_learners(values, mask),
                "token_share": global_share(mask, "token-mean"),
                "row_share": global_share(mask, "seq-mean-token-mean"),
                "grad": param.grad,
            },
            f"{out_dir}/{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def test_cross_learner_reductions_equal_the_single_batch_ones(tmp_path):
    """Two real gloo processes with shards of 5 and 2 tokens (3 and 1 rows)."""
    values = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [4.0, 5.0, 0.0], [-6.0, 7.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 1, 0]])
    shards = [(values[:3], mask[:3]), (values[3:], mask[3:])]
    # fork: the children need nothing re-imported (spawn would take ~20 s per child here).
    mp.start_processes(_gloo_rank, args=(free_port(), shards, str(tmp_path)), nprocs=2, start_method="fork")
    out = [torch.load(tmp_path / f"{rank}.pt") for rank in range(2)]
    whitened = torch.cat([o["whitened"] for o in out])
    torch.testing.assert_close(whitened, masked_whiten(values, mask))
    assert [float(o["token_share"]) for o in out] == pytest.approx([5 / 7, 2 / 7])
    assert [float(o["row_share"]) for o in out] == pytest.approx([3 / 4, 1 / 4])
    for o in out:
        torch.testing.assert_close(o["grad"], torch.full((3,), 3.0))


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| (0 when both are 0)."""
    return float((actual - expected).norm() / expected.norm().clamp(min=1e-12))


def _total_loss(result: dict) -> float:
    return float(result[DEFAULT_MODULE_ID]["total_loss"].peek())


@pytest.mark.slow
def test_two_ddp_learners_take_the_single_learners_update(tiny_model_path, ray_session):
    """One update (one optimiser step over all rows) on the same groups: GAE with a
    critic head and advantage whitening over the batch, token-mean loss, and shards
    of 6 and 2 trajectories, so a plain DDP gradient average (shard means weighted
    1:1 instead of 3:1) or per-learner whitening would give a different step."""
    # Defined here so that Ray ships it to the learner actors by value (tests/ is no package).
    def learner_state(learner) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(weights, gradients of the last optimiser step) by parameter name."""
        module = learner.module[DEFAULT_MODULE_ID].unwrapped()
        weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
        grads = {k: p.grad.detach().clone() for k, p in module.named_parameters() if p.grad is not None}
        return weights, grads

    def config(num_learners: int):
        return (
            tiny_config(tiny_model_path)
            .training(
                advantage_estimator="gae", rollout_filter_ratio=1.0, rollout_frequency=1,
                mini_batch_size=8, micro_batch_size=2,
            )
            .learners(num_learners=num_learners)
        )

    local_algo = config(0).build_algo()
    try:
        runner = local_algo.env_runner
        groups = runner.sample(seeds=[1, 2], group_size=3) + runner.sample(seeds=[3], group_size=2)
        assert count_training_rows(groups, history_window=None) == 8
        initial_weights, _ = learner_state(local_learner(local_algo.learner_group))
        local_loss = _total_loss(_update(local_algo, groups)[0])
        local_weights, local_grads = learner_state(local_learner(local_algo.learner_group))
    finally:
        local_algo.stop()

    ddp_algo = config(2).build_algo()
    try:
        results = _update(ddp_algo, groups)
        states = ddp_algo.learner_group.foreach_learner(learner_state)
        states = [result.get() for result in states]
        # And a whole iteration (sample, 2-learner update, weight sync, evaluation) runs.
        trained = ddp_algo.train()
        assert trained["learners"][DEFAULT_MODULE_ID]["num_trained_trajectories"] == 2  # per learner: 1 group x 2
        assert "success_rate" in trained["evaluation"]
        engine_weights = ddp_algo.env_runner.engine.model.state_dict()
        learner_weights = ddp_algo.learner_group.get_weights()[DEFAULT_MODULE_ID]
        for name, value in policy_weights(learner_weights).items():
            torch.testing.assert_close(engine_weights[name], torch.as_tensor(value), msg=name)
    finally:
        ddp_algo.stop()

    assert len(results) == 2
    for result in results:
        # Whitened advantages make the loss a near-cancelling sum of O(1) terms: absolute tolerance.
        assert _total_loss(result) == pytest.approx(local_loss, abs=1e-6)
    assert set(states[0][1]) == set(local_grads)
    for name, grad in local_grads.items():
        for _, grads in states:
            assert _relative_error(grads[name], grad) < 1e-4, name
    for name, value in local_weights.items():
        # Both learners stay in sync and took the single learner's AdamW step. That step is
        # about lr * sign(gradient): a coordinate whose gradient is near AdamW's eps turns
        # float noise into a visible move, hence the looser bound than for the gradients.
        torch.testing.assert_close(states[0][0][name], states[1][0][name], rtol=0, atol=0, msg=name)
        step = value - initial_weights[name]
        assert _relative_error(states[0][0][name] - initial_weights[name], step) < 1e-3, name


@pytest.mark.slow
def test_remote_env_runners_sample_whole_groups_with_the_local_seeds(tiny_model_path, tmp_path, ray_session):
    config = (
        tiny_config(tiny_model_path)
        .rollouts(n_groups=3, group_size=2)
        .training(rollout_filter_ratio=1.0)
        .env_runners(num_env_runners=2)
        .rollout_recording(rollout_parquet_dir=str(tmp_path / "rollouts"))
        .starpo_evaluation(eval_interval=1, eval_size=3)
    )
    algo = config.build_algo()
    try:
        assert algo.env_runner is None and algo.env_runner_group.num_remote_env_runners() == 2
        result = algo.train()
        runners = result["env_runners"]
        # Statistics of all 3 groups x 2 trajectories, not an average of the two runners' 4 and 2.
        assert runners["num_trajectories"] == 6
        assert runners["num_turns_mean"] == 2  # a random model never solves Sokoban
        assert {"rollout_tokens_per_s", "rollout_framework_overhead", "env_errors"} <= set(runners)
        assert result["evaluation"]["num_trajectories"] == 3
        assert [e.get_infos(0)["traj_0"]["seed"] for e in algo.pop_evaluation_episodes()] == [123, 124, 125]

        rows = pd.read_parquet(tmp_path / "rollouts" / "rollouts-iter000001.parquet")
        groups = rows.groupby("episode_id", sort=False)
        # One group per seed, in the local runner's order, each whole (both trajectories, one seed).
        assert [set(g["seed"]) for _, g in groups] == [{10_000}, {10_001}, {10_002}]
        assert [len(g) for _, g in groups] == [2, 2, 2]
        # Group ids tell the groups of the two runners apart.
        assert rows.groupby("group_id")["episode_id"].nunique().tolist() == [1, 1, 1]

        # The new weights reached both remote engines.
        learner_policy = policy_weights(algo.learner_group.get_weights()[DEFAULT_MODULE_ID])
        engine_states = algo.env_runner_group.foreach_env_runner(
            lambda runner: runner.engine.model.state_dict(), local_env_runner=False
        )
        assert len(engine_states) == 2
        for state in engine_states:
            for name, value in learner_policy.items():
                torch.testing.assert_close(state[name], value, msg=name)

        # The driver's seed cursor is checkpointed and restored.
        algo.save_to_path(str(tmp_path / "ckpt"))
        assert algo.get_state(components=[])["next_train_seed"] == 10_003
        algo.train()
        assert algo.get_state(components=[])["next_train_seed"] == 10_006
        algo.restore_from_path(str(tmp_path / "ckpt"))
        assert algo.get_state(components=[])["next_train_seed"] == 10_003
    finally:
        algo.stop()


def test_scale_out_settings_are_checked(tiny_model_path):
    config = tiny_config(tiny_model_path).env_runners(num_env_runners=2, create_local_env_runner=True)
    with pytest.raises(ValueError, match="create_local_env_runner=False"):
        config.validate_starpo()
    config = tiny_config(tiny_model_path).learners(num_learners=2)
    with pytest.raises(ValueError, match="StarPO-S filter keeps 1"):
        config.validate_starpo()
    config.training(rollout_filter_ratio=1.0, advantage_estimator="brpo").llm(critic="none")
    with pytest.raises(ValueError, match="brpo"):
        config.validate_starpo()
