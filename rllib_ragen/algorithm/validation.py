"""Checks of a `StarPOConfig` that span several settings groups (each group checks its own fields when
a builder sets them).

`check_starpo_config` is `StarPOConfig.validate_starpo`: it builds, loads and reads
nothing (an env given by import path is imported).
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

from envs import check_env, check_env_config
from rllib_ragen.algorithm.ignored_rllib_settings import check_no_ignored_rllib_settings
from rllib_ragen.algorithm.settings_groups import settings_of
from rllib_ragen.inference.engine_settings import resolve_kind
from rllib_ragen.rollout.env_group import training_env_config
from rllib_ragen.rollout.self_play_runner import SelfPlayEnvRunner
from rllib_ragen.training.advantages import critic_free_estimators
from rllib_ragen.training.advantages.estimators import RAE
from rllib_ragen.training.filtering import TOP_P

if TYPE_CHECKING:
    from rllib_ragen.algorithm.starpo_settings import StarPOSettings

logger = logging.getLogger(__name__)

# Half the bfloat16 spacing of a weight of magnitude 0.01: smaller AdamW steps leave it unchanged.
_BF16_SMALLEST_VISIBLE_STEP = 0.01 / 256


def check_starpo_config(config: StarPOSettings) -> None:
    """Checks every StarPO setting of `config` (a `StarPOConfig`); raises ValueError naming the bad one."""
    check_no_ignored_rllib_settings(config)
    _check_no_setting_set_as_attribute(config)
    # On the driver, at build time: a remote runner would fail on it with the cause in its own log.
    check_env(config.env, in_other_processes=config.num_env_runners > 0)
    check_env_config(config.env, config.env_config or {})
    if config.rollout.train_env_overrides:  # the training rooms differ from the evaluation ones: check them too
        check_env_config(config.env, training_env_config(config.env_config, config.rollout))
    if config.advantages.needs_critic and config.llm_module.critic == "none":
        raise ValueError(
            f"advantage_estimator={config.advantages.advantage_estimator!r} needs a critic; set "
            f".llm(critic='head' or 'separate') or use one of {critic_free_estimators()}"
        )
    if config.rollout_engine.max_model_len <= config.rollout.response_length:
        raise ValueError(
            f"max_model_len={config.rollout_engine.max_model_len} leaves no room for a prompt with "
            f"response_length={config.rollout.response_length} tokens"
        )
    _check_lora(config)
    _check_self_play(config)
    _check_scale_out(config)
    _check_precision(config)
    if config.is_offline and config.offline_data_class is None:
        raise ValueError(
            "offline StarPO reads trajectory Parquet files into group episodes: set it up with "
            "rllib_ragen.algorithm.offline_training.offline_config(config, OfflineSettings(...))"
        )
    _warn_when_mini_batches_repeat_rows(config)


def _check_self_play(config: StarPOSettings) -> None:
    """Self-play's runner comes with `.self_play()`, and RAE needs the roles only self-play rollouts name."""
    enabled = config.two_player.enabled
    runner = config.env_runner_cls
    if enabled and not (isinstance(runner, type) and issubclass(runner, SelfPlayEnvRunner)):
        raise ValueError(
            f"self_play_game={config.two_player.self_play_game!r} needs the self-play env runner: set the game "
            "with StarPOConfig.self_play(self_play_game=...), which sets it"
        )
    if config.advantages.advantage_estimator == RAE and not enabled:
        raise ValueError(
            "advantage_estimator='rae' needs two-player self-play rollouts, whose seats name their roles: "
            "set .self_play(self_play_game=...)"
        )


def check_seeds_apart(config: StarPOSettings, *, iterations: int | None) -> None:
    """Refuses evaluation seeds that training would also play: the fixed-seed evaluation's and, in self-play,
    the games against each opponent (`game_eval_games` from `eval_seed`). Training takes `n_groups` new seeds
    an iteration upwards from `train_seed_start`; `iterations` None: any number of them."""
    evaluated = config.starpo_eval.seeds
    last = evaluated[-1]
    if config.two_player.enabled:
        last = max(last, evaluated[0] + config.two_player.game_eval_games - 1)
    first_trained = config.rollout.train_seed_start
    trained_end = None if iterations is None else first_trained + config.rollout.n_groups * iterations
    if last >= first_trained and (trained_end is None or evaluated[0] < trained_end):
        trained = f"{first_trained}.." + ("" if trained_end is None else str(trained_end - 1))
        raise ValueError(
            f"the evaluation seeds {evaluated[0]}..{last} overlap the training seeds {trained} "
            f"(train_seed_start={first_trained}, n_groups={config.rollout.n_groups} a training iteration): "
            "move eval_seed below train_seed_start, or above the last training seed"
        )


def _check_no_setting_set_as_attribute(config: StarPOSettings) -> None:
    """Refuses a StarPO setting set as an attribute of its own (`config.n_groups = 4`, a setting's name
    in RLlib's `AlgorithmConfig.update_from_dict` before it knew StarPO's): nothing would read it."""
    stray = sorted((set(vars(config)) - _rllib_attributes()) & settings_of(config).keys())
    if stray:
        raise ValueError(
            f"{stray[0]!r} is set as an attribute of the config, where nothing reads it: StarPO settings live in "
            f"their groups; set it with its builder, or by name with config.update_from_dict({{{stray[0]!r}: ...}})"
        )


@functools.cache
def _rllib_attributes() -> frozenset[str]:
    return frozenset(vars(AlgorithmConfig()))


def _check_lora(config: StarPOSettings) -> None:
    """LoRA against the settings of the other groups that depend on it."""
    if config.llm_module.trained_top_layers is not None and config.lora.enabled:
        raise ValueError(
            "trained_top_layers trains whole layers and lora_rank > 0 trains adapters: set one of them "
            "(LoRA on the last layers only is lora_top_layers)"
        )
    config.rollout_engine.check_lora_sync(config.lora)


def _check_scale_out(config: StarPOSettings) -> None:
    """Remote env runners and several learners: what they need to give the local results."""
    if config.num_env_runners < 0:
        raise ValueError(f"num_env_runners must be >= 0, got {config.num_env_runners}")
    # (RLlib's evaluation copy of the config has its own, unused, runner count.)
    if config.async_rollout.async_rollouts and config.num_env_runners < 1 and not config.in_evaluation:
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
        config.rollout_engine.weight_sync == "collective"
        and config.num_learners >= 1
        and config.num_env_runners == 0
        and resolve_kind(config.rollout_engine.kind) == "hf"
    ):
        raise ValueError(
            "weight_sync='collective' with remote learners (num_learners >= 1) cannot reach engine='hf' in "
            "the driver (it would have to receive while the driver waits for the sender): use "
            "weight_sync='object_store', engine='vllm' or remote env runners"
        )
    if config.num_learners >= 2:
        if config.advantages.advantage_estimator == "brpo":
            raise ValueError(
                "advantage_estimator='brpo' normalises over the whole batch, which num_learners >= 2 "
                "split; use grpo (per group, groups stay whole), gae, bi_level_gae or arpo"
            )
        if config.group_filter.rollout_filter_strategy == TOP_P:
            raise ValueError(
                f"rollout_filter_strategy='top_p' keeps as few as one group, which num_learners="
                f"{config.num_learners} cannot split into whole groups per learner; use 'top_k_ratio' "
                "or one learner"
            )
        kept_groups = config.group_filter.max_kept_groups(config.rollout.n_groups)
        if kept_groups < config.num_learners:
            raise ValueError(
                f"num_learners={config.num_learners} needs at least as many groups per update, but the "
                f"StarPO-S filter keeps {kept_groups} of n_groups={config.rollout.n_groups}; raise n_groups or "
                "rollout_filter_ratio, or use fewer learners"
            )


def _check_precision(config: StarPOSettings) -> None:
    """Trained-weight dtypes that AdamW cannot train (or barely moves) at these learning rates."""
    if config.llm_module.dtype == "float16":
        raise ValueError(
            "dtype='float16' runs AdamW in float16, where squared gradients and eps (1e-8) underflow to 0: "
            "the first update writes inf/NaN into the weights. Train float32 weights (with "
            ".training(autocast_dtype='bfloat16') for bf16 compute); engines may still run "
            ".inference(engine_dtype='float16')"
        )
    if config.llm_module.dtype == "bfloat16" and 0 < config.optim.actor_lr < _BF16_SMALLEST_VISIBLE_STEP:
        logger.warning(
            "dtype='bfloat16' with actor_lr=%g: AdamW moves a weight by about the learning rate per step, and "
            "a bfloat16 weight w only changes when the step exceeds half its spacing (about |w|/256, %.1g for "
            "|w|=0.01), so most weights never move. Prefer dtype='float32' with "
            ".training(autocast_dtype='bfloat16')",
            config.optim.actor_lr,
            _BF16_SMALLEST_VISIBLE_STEP,
        )


def _warn_when_mini_batches_repeat_rows(config: StarPOSettings) -> None:
    # One line, not an error: sampling-only uses keep the training defaults.
    kept_groups, kept_rows = config.group_filter.max_kept_groups(config.rollout.n_groups), config.max_rows_per_update
    if config.update.mini_batch_size is not None and config.update.mini_batch_size > kept_rows:
        logger.warning(
            "mini_batch_size=%d is larger than the at most %d rows an update gets (the StarPO-S filter keeps "
            "%d of n_groups=%d groups x group_size=%d%s): each optimiser step takes the rows there are, "
            "none repeated (leave mini_batch_size unset for exactly that)",
            config.update.mini_batch_size,
            kept_rows,
            kept_groups,
            config.rollout.n_groups,
            config.rollout.group_size,
            "" if config.protocol.history_window is None else f" x max_turns={config.turn_budget.max_turns}",
        )
