"""Checks of a `StarPOConfig` that span several settings groups (each group checks its own fields).

`check_starpo_config` is `StarPOConfig.validate_starpo`: it builds, loads and reads
nothing (an env given by import path is imported).
"""

from __future__ import annotations

import logging

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

from envs import check_env, check_env_config
from rllib_ragen.algorithm.ignored_rllib_settings import check_no_ignored_rllib_settings
from rllib_ragen.inference.engine_settings import resolve_kind
from rllib_ragen.rollout.env_group import training_env_config
from rllib_ragen.training.advantages import critic_free_estimators
from rllib_ragen.training.filtering import TOP_P

logger = logging.getLogger(__name__)

# Half the bfloat16 spacing of a weight of magnitude 0.01: smaller AdamW steps leave it unchanged.
_BF16_SMALLEST_VISIBLE_STEP = 0.01 / 256


def check_starpo_config(config: AlgorithmConfig) -> None:
    """Checks every StarPO setting of `config` (a `StarPOConfig`); raises ValueError naming the bad one."""
    check_no_ignored_rllib_settings(config)
    # On the driver, at build time: a remote runner would fail on it with the cause in its own log.
    check_env(config.env, in_other_processes=config.num_env_runners > 0)
    config.settings_groups()
    check_env_config(config.env, config.env_config or {})
    if config.train_env_overrides:  # the training rooms differ from the evaluation ones: check them too
        check_env_config(config.env, training_env_config(config.env_config, config.rollout_settings))
    if config.advantage_settings.needs_critic and config.critic == "none":
        raise ValueError(
            f"advantage_estimator={config.advantage_estimator!r} needs a critic; set "
            f".llm(critic='head' or 'separate') or use one of {critic_free_estimators()}"
        )
    if config.max_model_len <= config.response_length:
        raise ValueError(
            f"max_model_len={config.max_model_len} leaves no room for a prompt with "
            f"response_length={config.response_length} tokens"
        )
    _check_scale_out(config)
    _check_precision(config)
    if config.is_offline and config.offline_data_class is None:
        raise ValueError(
            "offline StarPO reads trajectory Parquet files into group episodes: set it up with "
            "rllib_ragen.algorithm.offline_training.offline_config(config, OfflineSettings(...))"
        )
    _warn_when_mini_batches_repeat_rows(config)


def _check_scale_out(config: AlgorithmConfig) -> None:
    """Remote env runners and several learners: what they need to give the local results."""
    if config.num_env_runners < 0:
        raise ValueError(f"num_env_runners must be >= 0, got {config.num_env_runners}")
    # (RLlib's evaluation copy of the config has its own, unused, runner count.)
    if config.async_rollouts and config.num_env_runners < 1 and not config.in_evaluation:
        raise ValueError(
            "async_rollouts=True samples on remote env runners while the learner updates: "
            "set .env_runners(num_env_runners=N) with N >= 1"
        )
    if config.num_env_runners > 0 and config.create_local_env_runner:
        raise ValueError(
            f"num_env_runners={config.num_env_runners} samples on remote runners: set "
            ".env_runners(create_local_env_runner=False), a local runner would hold an idle engine"
        )
    if (
        config.weight_sync == "collective"
        and config.num_learners >= 1
        and config.num_env_runners == 0
        and resolve_kind(config.engine) == "hf"
    ):
        raise ValueError(
            "weight_sync='collective' with remote learners (num_learners >= 1) cannot reach engine='hf' in "
            "the driver (it would have to receive while the driver waits for the sender): use "
            "weight_sync='object_store', engine='vllm' or remote env runners"
        )
    if config.num_learners >= 2:
        if config.advantage_estimator == "brpo":
            raise ValueError(
                "advantage_estimator='brpo' normalises over the whole batch, which num_learners >= 2 "
                "split; use grpo (per group, groups stay whole), gae, bi_level_gae or arpo"
            )
        if config.rollout_filter_strategy == TOP_P:
            raise ValueError(
                f"rollout_filter_strategy='top_p' keeps as few as one group, which num_learners="
                f"{config.num_learners} cannot split into whole groups per learner; use 'top_k_ratio' "
                "or one learner"
            )
        kept_groups = config.filter_settings.max_kept_groups(config.n_groups)
        if kept_groups < config.num_learners:
            raise ValueError(
                f"num_learners={config.num_learners} needs at least as many groups per update, but the "
                f"StarPO-S filter keeps {kept_groups} of n_groups={config.n_groups}; raise n_groups or "
                "rollout_filter_ratio, or use fewer learners"
            )


def _check_precision(config: AlgorithmConfig) -> None:
    """Trained-weight dtypes that AdamW cannot train (or barely moves) at these learning rates."""
    if config.dtype == "float16":
        raise ValueError(
            "dtype='float16' runs AdamW in float16, where squared gradients and eps (1e-8) underflow to 0: "
            "the first update writes inf/NaN into the weights. Train float32 weights (with "
            ".training(autocast_dtype='bfloat16') for bf16 compute); engines may still run "
            ".inference(engine_dtype='float16')"
        )
    if config.dtype == "bfloat16" and 0 < config.actor_lr < _BF16_SMALLEST_VISIBLE_STEP:
        logger.warning(
            "dtype='bfloat16' with actor_lr=%g: AdamW moves a weight by about the learning rate per step, and "
            "a bfloat16 weight w only changes when the step exceeds half its spacing (about |w|/256, %.1g for "
            "|w|=0.01), so most weights never move. Prefer dtype='float32' with "
            ".training(autocast_dtype='bfloat16')",
            config.actor_lr,
            _BF16_SMALLEST_VISIBLE_STEP,
        )


def _warn_when_mini_batches_repeat_rows(config: AlgorithmConfig) -> None:
    # One line, not an error: sampling-only uses keep the training defaults.
    kept_groups, kept_rows = config.filter_settings.max_kept_groups(config.n_groups), config.max_rows_per_update
    if config.mini_batch_size is not None and config.mini_batch_size > kept_rows:
        logger.warning(
            "mini_batch_size=%d is larger than the at most %d rows an update gets (the StarPO-S filter keeps "
            "%d of n_groups=%d groups x group_size=%d%s): each optimiser step takes the rows there are, "
            "none repeated (leave mini_batch_size unset for exactly that)",
            config.mini_batch_size,
            kept_rows,
            kept_groups,
            config.n_groups,
            config.group_size,
            "" if config.history_window is None else f" x max_turns={config.max_turns}",
        )
