"""A StarPO iteration with reasoning-aware shaping and selective token masks logs every term."""

from __future__ import annotations

from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.run.tracking import flatten_metrics


def test_iteration_with_shaping_logs_every_term(tiny_model_path, ray_session):
    config = (
        StarPOConfig()
        .environment("sokoban")
        .llm(model=str(tiny_model_path), critic="head")
        .rollouts(n_groups=2, group_size=2, max_turns=2, max_actions_per_turn=2, response_length=12)
        .inference(engine="hf")
        .training(
            mini_batch_size=4, micro_batch_size=2, loss_token_mask="think_and_answer", adv_token_mask="answer_only"
        )
        .reward_shaping(think_length_coeff=0.1, think_names_action_coeff=0.1, advantage_length_weight=1.0)
        .starpo_evaluation(eval_interval=0)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    # Every numeric leaf of the result goes to MLflow under its flattened name.
    logged = flatten_metrics(result)
    for key in ("episode_return_mean", "task_return_mean", "task_reward_mean", "shaping_bonus_mean",
                "think_length_mean", "think_names_action_mean", "think_words_mean"):
        assert f"env_runners/{key}" in logged, key
    for key in ("advantage_length_weight_min", "advantage_length_weight_max", "policy_loss", "vf_loss"):
        assert f"learners/{DEFAULT_MODULE_ID}/{key}" in logged, key
