"""`StarPOConfig` / `StarPO`: RAGEN's multi-turn agent RL as an RLlib Algorithm.

One iteration (`StarPO.training_step`):
    sample n_groups x group_size trajectories (LLMEnvRunner, one engine call per turn;
        with num_env_runners=N, N remote runners each take a contiguous run of the seeds)
    -> every few iterations: RAGEN-2's collapse diagnostics I(X;Z), H(Z|X) on sampled first turns
    -> group filter: keep the groups with the largest in-group reward std (StarPO-S top-k
        ratio, or RAGEN-2's top-p); a batch the filter empties is not trained on
    -> echo-trap monitor: warns on reward-variance, entropy or template collapse
    -> update for `rollout_frequency` passes in mini-batches (with num_learners >= 2,
        whole groups per DDP learner, see `rllib_ragen.training.distributed`)
    -> sync the new policy weights into the rollout engine(s), in place
    -> every `eval_interval` iterations: evaluate on fixed seeds at eval temperature
With async_rollouts=True the remote runners sample the next iterations' groups (up to
`max_staleness` ahead) during the update, see `rllib_ragen.rollout.async_rollouts`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from pathlib import Path
from typing import Any, Unpack

import numpy as np
import ray
import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.connectors.learner.learner_connector_pipeline import LearnerConnectorPipeline
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_LEARNER_GROUP, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    EVALUATION_RESULTS,
    LEARNER_RESULTS,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    TIMERS,
)
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from envs import check_env, check_env_config
from rllib_ragen.algorithm.builder_keywords import (
    DiagnosticsKeywords,
    InferenceKeywords,
    LlmKeywords,
    RewardShapingKeywords,
    RolloutRecordingKeywords,
    RolloutsKeywords,
    StarpoEvaluationKeywords,
    TrainingKeywords,
)
from rllib_ragen.algorithm.builders import SettingsGroups, settings_builder, unexpected_keyword
from rllib_ragen.algorithm.ignored_rllib_settings import (  # noqa: F401 (IGNORED_RLLIB_SETTINGS: re-exported)
    IGNORED_RLLIB_SETTINGS,
    check_no_ignored_rllib_settings,
    refuse_ignored_rllib_settings,
)
from rllib_ragen.algorithm.settings import SETTINGS_GROUPS
from rllib_ragen.data.parquet import write_rollouts
from rllib_ragen.inference.engine_settings import resolve_kind
from rllib_ragen.inference.weight_sync import PolicyWeightSync
from rllib_ragen.lora import LoraSettings, peft_model_with_adapters
from rllib_ragen.models import load_causal_lm, load_tokenizer, resolve_model, resolves_locally
from rllib_ragen.rollout.async_rollouts import AsyncGroupSampler, policy_version_of, staleness_counts
from rllib_ragen.rollout.env_runner import LLMEnvRunner, policy_weights
from rllib_ragen.rollout.episode_readers import rollout_statistics
from rllib_ragen.rollout.evaluation import evaluate_on_seeds
from rllib_ragen.rollout.prompt.chat_template import ChatTemplate
from rllib_ragen.sharding import split_contiguous
from rllib_ragen.training.advantages import critic_free_estimators
from rllib_ragen.training.collapse_metrics import (
    COLLAPSE_RESULTS,
    CONDITIONAL_ENTROPY,
    MUTUAL_INFORMATION,
    collapse_metrics,
    draw_samples,
    first_turn_samples,
)
from rllib_ragen.training.distributed import count_training_rows, learner_minibatch_sizes, shard_groups
from rllib_ragen.training.echo_trap import REWARD_VARIANCE, EchoTrapMonitor
from rllib_ragen.training.filtering import TOP_P, select_groups_by_variance
from rllib_ragen.training.learner import StarPOTorchLearner
from rllib_ragen.training.learner_connector import GroupAdvantages, OldLogProbsAndValues, TokenRows
from rllib_ragen.training.module import LLMRLModule
from rllib_ragen.training.token_masks import ResponseSpanLabeller

logger = logging.getLogger(__name__)

# Half the bfloat16 spacing of a weight of magnitude 0.01: smaller AdamW steps leave it unchanged.
_BF16_SMALLEST_VISIBLE_STEP = 0.01 / 256

ROLLOUT_TIMER = "rollout"
UPDATE_TIMER = "update"
# Async rollouts: the wait, after the update, for the shards still sampling before the weight sync.
ROLLOUT_DRAIN_TIMER = "rollout_drain"
WEIGHT_SYNC_TIMER = "weight_sync"
WEIGHT_SYNC_RESULTS = "weight_sync"
ASYNC_ROLLOUT_RESULTS = "async_rollouts"
EVAL_TIMER = "evaluation"
COLLAPSE_TIMER = "collapse_metrics"
OFFLINE_DATA_RESULTS = "offline_data"
TRAIN_SEED_CURSOR = "next_train_seed"
FILTER_RESULTS = "starpo_filter"
ECHO_TRAP_RESULTS = "echo_trap"


class StarPOConfig(SettingsGroups, AlgorithmConfig):
    """Configuration of StarPO; defaults are RAGEN's v1 base configuration.

    Every StarPO setting is a flat attribute (as RLlib and Ray Tune need), declared
    once, with its type, default, check and doc, as a field of its settings group
    (`rllib_ragen.algorithm.settings.SETTINGS_GROUPS`), and set with the builder
    method its group names (`.llm()`, `.rollouts()`, `.inference()`, `.training()`,
    `.reward_shaping()`, `.diagnostics()`, `.starpo_evaluation()`,
    `.rollout_recording()`; `help()` lists each one's settings, type checkers read
    them from `rllib_ragen.algorithm.builder_keywords`). Each group is a property
    (`config.engine_settings`, `config.turn_budget_settings`, ...) built, so checked,
    once: at validation, or at first use after a setting changed.

    Example:
        config = (
            StarPOConfig()
            .environment("sokoban")
            .llm(model="smollm2-135m-instruct")
            .rollouts(n_groups=8, group_size=16)
            .training(advantage_estimator="gae", rollout_filter_ratio=0.25)
        )
        algo = config.build_algo()
        algo.train()
    """

    def __init__(self, algo_class=None) -> None:
        super().__init__(algo_class=algo_class or StarPO)
        # RLlib plumbing: one local LLM env runner; we own the learner pipeline.
        self.env_runner_cls = LLMEnvRunner
        self.num_env_runners = 0
        self.add_default_connectors_to_learner_pipeline = False
        self.env = "sokoban"
        self.grad_clip = 1.0
        self.grad_clip_by = "global_norm"
        # Every StarPO setting, with the default its settings group declares.
        for binding in SETTINGS_GROUPS:
            for attribute, default in binding.defaults().items():
                setattr(self, attribute, default)

    # ------------------------------------------------------------------ builders
    # Each builder's keywords, docs and defaults come from the settings groups (`settings_builder`).
    @settings_builder
    def llm(self, **settings: Unpack[LlmKeywords]) -> StarPOConfig:
        """The language model trained as the policy, and its critic."""

    @settings_builder
    def rollouts(self, **settings: Unpack[RolloutsKeywords]) -> StarPOConfig:
        """How trajectories are sampled each iteration."""

    @settings_builder
    def inference(self, **settings: Unpack[InferenceKeywords]) -> StarPOConfig:
        """The rollout engine, and how the learner's weights reach it."""

    @settings_builder  # overrides AlgorithmConfig.training (RLlib's @override applied there)
    def training(self, **kwargs: Unpack[TrainingKeywords]) -> StarPOConfig:
        """The StarPO update.

        Args:
            **kwargs: RLlib's own training settings (e.g. grad_clip); those StarPO
                does not read (lr, minibatch_size, num_epochs, train_batch_size...)
                raise ValueError naming the StarPO setting to use.
        """
        refuse_ignored_rllib_settings(kwargs)
        unknown = sorted(kwargs.keys() - inspect.signature(AlgorithmConfig.training).parameters.keys())
        if unknown:
            raise unexpected_keyword(type(self).__name__, "training", unknown[0])
        super().training(**kwargs)
        return self

    @settings_builder
    def diagnostics(self, **settings: Unpack[DiagnosticsKeywords]) -> StarPOConfig:
        """RAGEN-2's collapse diagnostics and the echo-trap monitor.

        The diagnostics (`rllib_ragen.training.collapse_metrics`) score the reasoning of
        sampled first turns under every sampled prompt with the learner's model,
        logging I(X;Z) and H(Z|X) under `collapse/`; the monitor
        (`rllib_ragen.training.echo_trap`) warns when the in-group reward std, H(Z|X) or
        I(X;Z) stays far below its early level.
        """

    @settings_builder
    def reward_shaping(self, **settings: Unpack[RewardShapingKeywords]) -> StarPOConfig:
        """Reasoning-aware reward terms (`rllib_ragen.rollout.reward_shaping`), each off at 0.

        A turn's reward becomes the task reward plus each coefficient times its
        term; the rollout metrics keep the task reward (`task_return_mean`) and
        every term (`think_length_mean`, `think_names_action_mean`, ...) apart.
        """

    @settings_builder
    def starpo_evaluation(self, **settings: Unpack[StarpoEvaluationKeywords]) -> StarPOConfig:
        """Periodic evaluation on fixed initial states (group size 1)."""

    @settings_builder
    def rollout_recording(self, **settings: Unpack[RolloutRecordingKeywords]) -> StarPOConfig:
        """Writing sampled rollouts to Parquet (layout: `rllib_ragen.data.schema`)."""

    @override(AlgorithmConfig)
    def env_runners(self, **kwargs) -> StarPOConfig:
        """RLlib's env-runner settings (see `AlgorithmConfig.env_runners`).

        `num_env_runners=N > 0` samples each iteration's groups on N remote
        `LLMEnvRunner` actors, each with its own engine; unless
        `create_local_env_runner` is given too, no local runner is built then.
        """
        super().env_runners(**kwargs)
        if "num_env_runners" in kwargs and "create_local_env_runner" not in kwargs:
            self.create_local_env_runner = self.num_env_runners == 0
        return self

    # ------------------------------------------------------------ derived parts
    @override(AlgorithmConfig)
    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=LLMRLModule, model_config=dict(vars(self.llm_module_settings)))

    @override(AlgorithmConfig)
    def get_default_learner_class(self):
        return StarPOTorchLearner

    @override(AlgorithmConfig)
    def build_learner_connector(self, input_observation_space, input_action_space, device=None):
        return LearnerConnectorPipeline(
            connectors=self.learner_connector_pieces(),
            input_observation_space=input_observation_space,
            input_action_space=input_action_space,
        )

    def learner_connector_pieces(self, *, score_old_logp: bool | None = None) -> list:
        """Token rows -> old log-probs and values -> advantages (`rllib_ragen.training.learner_connector`).

        Args:
            score_old_logp: Score the old log-probs in a separate pass; None =
                unless each update is one on-policy step (`update_is_one_on_policy_step`).
        """
        if score_old_logp is None:
            score_old_logp = not self.update_is_one_on_policy_step
        advantages = self.advantage_settings
        return [
            TokenRows(history_window=self.history_window),
            OldLogProbsAndValues(
                micro_batch_size=self.micro_batch_size,
                score_old_logp=score_old_logp,
                with_values=advantages.needs_critic,
            ),
            GroupAdvantages(
                advantages=advantages,
                loss_token_mask=self.loss_token_mask,
                adv_token_mask=self.adv_token_mask,
                span_labeller=self._span_labeller() if self.loss_settings.needs_token_spans else None,
                advantage_length_weight=self.advantage_length_weight,
            ),
        ]

    def _span_labeller(self) -> ResponseSpanLabeller:
        return ResponseSpanLabeller(load_tokenizer(resolve_model(self.llm_model)), self.protocol_settings)

    @override(AlgorithmConfig)
    def validate(self) -> None:
        super().validate()
        self.validate_starpo()

    def validate_starpo(self) -> None:
        """Checks every StarPO setting; raises ValueError naming the bad one.

        No side effects: nothing is built, loaded or read from disk (an env given by
        import path is imported). `check_inputs` reads the model directory, at build.
        """
        check_no_ignored_rllib_settings(self)
        # On the driver, at build time: a remote runner would fail on it with the cause in its own log.
        check_env(self.env, in_other_processes=self.num_env_runners > 0)
        check_env_config(self.env, self.env_config or {})
        self.settings_groups()
        if self.advantage_settings.needs_critic and self.critic == "none":
            raise ValueError(
                f"advantage_estimator={self.advantage_estimator!r} needs a critic; set "
                f".llm(critic='head' or 'separate') or use one of {critic_free_estimators()}"
            )
        if self.max_model_len <= self.response_length:
            raise ValueError(
                f"max_model_len={self.max_model_len} leaves no room for a prompt with "
                f"response_length={self.response_length} tokens"
            )
        self._validate_scale_out()
        self._validate_precision()
        if self.is_offline and self.offline_data_class is None:
            raise ValueError(
                "offline StarPO reads trajectory Parquet files into group episodes: set it up with "
                "rllib_ragen.algorithm.offline.offline_config(config, OfflineSettings(...))"
            )
        self._warn_when_mini_batches_repeat_rows()

    def check_inputs(self) -> None:
        """Checks what validation does not read: a local model directory has its config, weights,
        tokenizer and chat template (raises `ModelNotFoundError` or ValueError naming what is missing)."""
        if resolves_locally(str(self.llm_model)):
            resolve_model(str(self.llm_model))

    def _validate_scale_out(self) -> None:
        """Remote env runners and several learners: what they need to give the local results."""
        if self.num_env_runners < 0:
            raise ValueError(f"num_env_runners must be >= 0, got {self.num_env_runners}")
        # (RLlib's evaluation copy of the config has its own, unused, runner count.)
        if self.async_rollouts and self.num_env_runners < 1 and not self.in_evaluation:
            raise ValueError(
                "async_rollouts=True samples on remote env runners while the learner updates: "
                "set .env_runners(num_env_runners=N) with N >= 1"
            )
        if self.num_env_runners > 0 and self.create_local_env_runner:
            raise ValueError(
                f"num_env_runners={self.num_env_runners} samples on remote runners: set "
                ".env_runners(create_local_env_runner=False), a local runner would hold an idle engine"
            )
        if (
            self.weight_sync == "collective"
            and self.num_learners >= 1
            and self.num_env_runners == 0
            and resolve_kind(self.engine) == "hf"
        ):
            raise ValueError(
                "weight_sync='collective' with remote learners (num_learners >= 1) cannot reach engine='hf' in "
                "the driver (it would have to receive while the driver waits for the sender): use "
                "weight_sync='object_store', engine='vllm' or remote env runners"
            )
        if self.num_learners >= 2:
            if self.advantage_estimator == "brpo":
                raise ValueError(
                    "advantage_estimator='brpo' normalises over the whole batch, which num_learners >= 2 "
                    "split; use grpo (per group, groups stay whole), gae, bi_level_gae or arpo"
                )
            if self.rollout_filter_strategy == TOP_P:
                raise ValueError(
                    f"rollout_filter_strategy='top_p' keeps as few as one group, which num_learners="
                    f"{self.num_learners} cannot split into whole groups per learner; use 'top_k_ratio' "
                    "or one learner"
                )
            kept_groups = self.filter_settings.max_kept_groups(self.n_groups)
            if kept_groups < self.num_learners:
                raise ValueError(
                    f"num_learners={self.num_learners} needs at least as many groups per update, but the "
                    f"StarPO-S filter keeps {kept_groups} of n_groups={self.n_groups}; raise n_groups or "
                    "rollout_filter_ratio, or use fewer learners"
                )

    def _validate_precision(self) -> None:
        """Trained-weight dtypes that AdamW cannot train (or barely moves) at these learning rates."""
        if self.dtype == "float16":
            raise ValueError(
                "dtype='float16' runs AdamW in float16, where squared gradients and eps (1e-8) underflow to 0: "
                "the first update writes inf/NaN into the weights. Train float32 weights (with "
                ".training(autocast_dtype='bfloat16') for bf16 compute); engines may still run "
                ".inference(engine_dtype='float16')"
            )
        if self.dtype == "bfloat16" and 0 < self.actor_lr < _BF16_SMALLEST_VISIBLE_STEP:
            logger.warning(
                "dtype='bfloat16' with actor_lr=%g: AdamW moves a weight by about the learning rate per step, and "
                "a bfloat16 weight w only changes when the step exceeds half its spacing (about |w|/256, %.1g for "
                "|w|=0.01), so most weights never move (measured on tiny-random at 1e-6: 1.8%% of the policy's "
                "weights changed in 2 steps, 99.99%% with float32). Prefer dtype='float32' with "
                ".training(autocast_dtype='bfloat16')",
                self.actor_lr,
                _BF16_SMALLEST_VISIBLE_STEP,
            )

    def _warn_when_mini_batches_repeat_rows(self) -> None:
        # One line, not an error: sampling-only uses keep the training defaults.
        kept_groups, kept_rows = self.filter_settings.max_kept_groups(self.n_groups), self.max_rows_per_update
        if self.mini_batch_size is not None and self.mini_batch_size > kept_rows:
            logger.warning(
                "mini_batch_size=%d is larger than the at most %d rows an update gets (the StarPO-S filter keeps "
                "%d of n_groups=%d groups x group_size=%d%s): each optimiser step takes the rows there are, "
                "none repeated (leave mini_batch_size unset for exactly that)",
                self.mini_batch_size,
                kept_rows,
                kept_groups,
                self.n_groups,
                self.group_size,
                "" if self.history_window is None else f" x max_turns={self.max_turns}",
            )

    def rows_per_step(self, rows: int) -> int:
        """Rows of one optimiser step of an update on `rows` rows: the mini-batch size, never more than
        the rows (RLlib would fill the rest by repeating rows); all of them when it is None."""
        return rows if self.mini_batch_size is None else max(1, min(self.mini_batch_size, rows))

    @property
    def max_rows_per_update(self) -> int:
        """Most token rows one update trains on: the most groups the filter keeps x group size
        (a row is a trajectory, or one turn with a history window)."""
        rows_per_trajectory = 1 if self.history_window is None else self.max_turns
        return self.filter_settings.max_kept_groups(self.n_groups) * self.group_size * rows_per_trajectory

    @property
    def update_is_one_on_policy_step(self) -> bool:
        """Each update is one optimiser step on the rows just sampled by the current policy.

        Its old log-probs are then the current policy's own, so the learner
        connector does not score them in a separate forward pass.
        """
        return (
            self.rollout_frequency == 1
            and self.num_learners <= 1
            and (self.mini_batch_size is None or self.max_rows_per_update <= self.mini_batch_size)
        )

    @property
    def rollout_summary(self) -> str:
        return (
            f"{self.env}: {self.n_groups} groups x {self.group_size} trajectories, "
            f"{self.max_turns} turns, model {self.llm_model}, estimator {self.advantage_estimator}"
        )


def _sample_shard(runner: LLMEnvRunner, *, seeds: list[int], **sample_kwargs: Any) -> tuple[int, list, dict]:
    """Runs on a remote runner: (first seed, its groups, its metrics)."""
    episodes = runner.sample(seeds=seeds, **sample_kwargs)
    return seeds[0], episodes, runner.get_metrics()


# Per-runner metrics that add up over parallel runners, and the one that is a wall time.
_SUMMED_RUNNER_METRICS = ("env_errors", "truncated_prompt_trajectories", "rollout_tokens_per_s")
_WALL_TIME_METRIC = "rollout_time_s"


def _merge_runner_metrics(per_runner: list[dict], episodes: list) -> list[dict]:
    """The remote runners' reduced metrics, with the rollout's own numbers made exact.

    RLlib averages the runners' window-1 values, right for e.g. the engine overhead
    but not for statistics of all groups (recomputed here from `episodes`), counts and
    throughputs (summed) or the rollout's wall time (the slowest runner's).
    """
    exact = dict(rollout_statistics(episodes))
    for key in _SUMMED_RUNNER_METRICS:
        exact[key] = sum(float(m[key].peek()) for m in per_runner if key in m)
    exact[_WALL_TIME_METRIC] = max(
        (float(m[_WALL_TIME_METRIC].peek()) for m in per_runner if _WALL_TIME_METRIC in m), default=0.0
    )
    merged = MetricsLogger()
    for key, value in exact.items():
        merged.log_value(key, value, window=1)
    rest = [{k: v for k, v in m.items() if k not in exact} for m in per_runner]
    return [*rest, merged.reduce()]


def _update_on_own_shard(
    learner, *, shards: list[ray.ObjectRef], minibatch_sizes: list[int], **update_kwargs: Any
) -> dict:
    """Runs on every learner of a DDP group: updates on the shard of its torch.distributed rank."""
    rank = torch.distributed.get_rank()
    return learner.update(episodes=ray.get(shards[rank]), minibatch_size=minibatch_sizes[rank], **update_kwargs)


def _collapse_metrics_on_learner(learner, *, samples: list, micro_batch_size: int) -> dict[str, float]:
    """Runs on a learner: the collapse diagnostics under its current module."""
    return collapse_metrics(learner.module[DEFAULT_MODULE_ID].unwrapped(), samples, micro_batch_size=micro_batch_size)


class StarPO(Algorithm):
    """StarPO (State-Thinking-Actions-Reward Policy Optimisation) on RLlib."""

    @classmethod
    @override(Algorithm)
    def get_default_config(cls) -> StarPOConfig:
        return StarPOConfig()

    @override(Algorithm)
    def setup(self, config) -> None:
        # Ray gives actors (e.g. Tune trials) OMP_NUM_THREADS=1; the synchronous
        # loop alternates rollout and update, so each may use every core it has.
        torch.set_num_threads(config.torch_threads or os.cpu_count() or 1)
        config.check_inputs()
        super().setup(config)
        self.echo_trap = EchoTrapMonitor(self.config.echo_trap_settings)
        self._echo_trap_active: set[str] = set()  # signals warned about: logged once per collapse
        self._collapse_measured = False  # this process's first iteration measures (the early level)
        self._chat_template: ChatTemplate | None = None
        # Set by a driver that knows where it stops: that iteration always ends with an evaluation.
        self.final_iteration: int | None = None
        # 0/1 success per trajectory of the latest evaluation, in seed order (for paired intervals).
        self.last_evaluation_successes: list[float] = []
        self._evaluation_episodes: list = []
        # The training-seed cursor when the runners are remote (a local runner keeps its own).
        self._next_train_seed = self.config.train_seed_start
        # The version of the learner's weights; each sync into the engines makes a new one.
        self.policy_version = 0
        self._sampler = None
        if self.config.async_rollouts:
            self._sampler = AsyncGroupSampler(
                self.env_runner_group,
                sample_call=lambda seeds: functools.partial(_sample_shard, seeds=seeds),
                # A shard makes one engine call per turn.
                shard_timeout_s=self.config.engine_call_timeout_s * self.config.max_turns,
            )
        self.weight_sync = PolicyWeightSync(
            config=self.config.engine_settings,
            learner_group=self.learner_group,
            env_runner_group=self.env_runner_group,
        )
        # The engines loaded the checkpoint themselves; this first sync proves the path at start.
        self.sync_engine_weights()

    @override(Algorithm)
    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict:
        state = super().get_state(components, not_components=not_components, **kwargs)
        state[TRAIN_SEED_CURSOR] = self._next_train_seed
        return state

    @override(Algorithm)
    def set_state(self, state: dict) -> None:
        super().set_state(state)
        self._next_train_seed = state.get(TRAIN_SEED_CURSOR, self._next_train_seed)
        if COMPONENT_LEARNER_GROUP in state:
            self.sync_engine_weights()

    @override(Algorithm)
    def restore_from_path(self, path, *args, **kwargs) -> None:
        super().restore_from_path(path, *args, **kwargs)
        # RLlib restores the learner group from its own directory, not through set_state.
        self.sync_engine_weights()

    def sync_engine_weights(self) -> None:
        """Loads the learner's policy into every rollout engine, then checks it there.

        Logs `weight_sync/seconds`, `weight_sync/megabytes` and
        `weight_sync/engine_logp_max_abs_diff`: the largest difference between an
        engine's and the learner's log-probs of a fixed probe continuation (about
        1e-3 or less with matching dtypes; stale engine weights show as a large value).
        """
        self.policy_version += 1
        report = self.weight_sync.sync(version=self.policy_version)
        gap = self.weight_sync.check()
        for key, value in (
            ("seconds", report.seconds),
            ("megabytes", report.nbytes / 2**20),
            ("engine_logp_max_abs_diff", gap),
        ):
            self.metrics.log_value((WEIGHT_SYNC_RESULTS, key), value, window=1)

    @override(Algorithm)
    def training_step(self) -> None:
        with self.metrics.log_time((TIMERS, ROLLOUT_TIMER)):
            episodes = self._collect_episodes()
        # Before the filter (as RAGEN-2), with the weights that sampled the batch.
        collapse = self.measure_collapse(episodes)
        kept, in_group_std = self._filter_groups(episodes)
        self._watch_echo_trap(
            {
                REWARD_VARIANCE: in_group_std,
                CONDITIONAL_ENTROPY: collapse.get(CONDITIONAL_ENTROPY),
                MUTUAL_INFORMATION: collapse.get(MUTUAL_INFORMATION),
            }
        )
        if kept:
            with self.metrics.log_time((TIMERS, UPDATE_TIMER)):
                learner_results = self.update_learners(kept)
            self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
            if self._sampler is not None:
                with self.metrics.log_time((TIMERS, ROLLOUT_DRAIN_TIMER)):
                    self._sampler.drain()  # a runner's calls run in order: it loads weights between shards
            with self.metrics.log_time((TIMERS, WEIGHT_SYNC_TIMER)):
                self.sync_engine_weights()
        else:  # RAGEN-2 skips such a step too: no group has a signal to learn from
            logger.warning(
                "iteration %d: the group filter kept no group (no in-group reward spread); no update this iteration",
                self.iteration + 1,
            )
        interval, iteration = self.config.eval_interval, self.iteration + 1
        if interval and (iteration % interval == 0 or iteration == self.final_iteration):
            logger.info("iteration %d: evaluating on the %d fixed seeds", iteration, self.config.eval_size)
            self.evaluate_fixed_seeds()

    def _collect_episodes(self) -> list:
        """This iteration's groups: from the offline dataset if one is configured, else fresh rollouts."""
        config = self.config
        if self.offline_data is not None:
            episodes = self.offline_data.sample(num_samples=config.n_groups)
            for key, value in rollout_statistics(episodes).items():
                self.metrics.log_value((OFFLINE_DATA_RESULTS, key), value, window=1)
            return episodes
        if self.env_runner is not None:
            episodes = self.env_runner.sample()
            self.metrics.aggregate([self.env_runner.get_metrics()], key=ENV_RUNNER_RESULTS)
        elif self._sampler is not None:
            episodes = self._sample_ahead()
        else:
            episodes = self._sample_on_remote_runners(self._take_train_seeds())
        if config.rollout_parquet_dir and (self.iteration + 1) % config.write_rollouts_every == 0:
            write_rollouts(
                episodes,
                config.rollout_parquet_dir,
                iteration=self.iteration + 1,
                env=config.env,
                env_config=config.env_config,
            )
        return episodes

    def _take_train_seeds(self) -> list[int]:
        seeds = list(range(self._next_train_seed, self._next_train_seed + self.config.n_groups))
        self._next_train_seed += self.config.n_groups
        return seeds

    def _sample_ahead(self) -> list:
        """Async rollouts: the oldest sampled batch, its groups past `max_staleness` dropped or kept.

        With off_policy_correction="none" a group more than `max_staleness` policy
        versions old is dropped; with "tis"/"mis" the loss corrects it. Logs
        `async_rollouts/`: the staleness histogram, stale groups dropped and
        corrected, and shards sampled again after a runner failed.
        """
        config = self.config
        sampler = self._sampler
        assert sampler is not None, "setup creates the sampler when async_rollouts is on"
        results = sampler.next_batch(self._take_train_seeds, run_ahead=config.max_staleness)
        episodes = [episode for _, shard, _ in results for episode in shard]
        self.metrics.aggregate(
            _merge_runner_metrics([metrics for _, _, metrics in results], episodes), key=ENV_RUNNER_RESULTS
        )
        staleness = [self.policy_version - policy_version_of(episode) for episode in episodes]
        stale = [s > config.max_staleness for s in staleness]
        correct = config.off_policy_correction != "none"
        stats = {
            **staleness_counts(staleness, max_staleness=config.max_staleness),
            "stale_groups_dropped": 0.0 if correct else float(sum(stale)),
            "stale_groups_corrected": float(sum(stale)) if correct else 0.0,
            "reissued_shards": float(sampler.reissued_shards),
        }
        for key, value in stats.items():
            self.metrics.log_value((ASYNC_ROLLOUT_RESULTS, key), value, window=1)
        kept = episodes if correct else [e for e, too_old in zip(episodes, stale) if not too_old]
        if not kept:
            raise RuntimeError(
                f"every group of this iteration is more than max_staleness={config.max_staleness} policy versions "
                f"old (staleness {staleness}): the env runners are not receiving the weights"
            )
        return kept

    def _sample_on_remote_runners(self, seeds: list[int], **sample_kwargs: Any) -> list:
        """Groups of `seeds`, in order, sampled in parallel on the remote runners.

        Each runner rolls out a contiguous run of the seeds, so every group is
        whole and the union is what one runner would return for `seeds`. The
        runners' metrics (all of them, evaluation too) go to `env_runners/`.
        """
        runner_ids = self.env_runner_group.healthy_env_runner_ids()
        if not runner_ids:
            raise RuntimeError("no healthy remote env runner is left to sample on")
        shards = [s for s in split_contiguous(seeds, len(runner_ids)) if s]
        results = self.env_runner_group.foreach_env_runner(
            [functools.partial(_sample_shard, seeds=shard, **sample_kwargs) for shard in shards],
            kwargs=[{} for _ in shards],
            local_env_runner=False,
            remote_worker_ids=runner_ids[: len(shards)],
        )
        results.sort(key=lambda result: result[0])  # runners answer in any order
        if len(results) < len(shards):
            logger.warning(
                "%d of %d env runners failed this call; their groups are missing",
                len(shards) - len(results),
                len(shards),
            )
        episodes = [episode for _, shard, _ in results for episode in shard]
        if not sample_kwargs.get("evaluation"):  # evaluate_fixed_seeds reports its own rollouts
            self.metrics.aggregate(
                _merge_runner_metrics([metrics for _, _, metrics in results], episodes), key=ENV_RUNNER_RESULTS
            )
        return episodes

    def update_learners(self, kept: list) -> list[dict]:
        """One `rollout_frequency`-epoch update on the kept groups; returns the learners' results.

        With num_learners >= 2 each learner trains on whole groups (RLlib's own
        sharding would slice group episodes) with the same number of optimiser
        steps, each covering its share of the global mini-batch.
        """
        config = self.config
        common = dict(
            timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: self.iteration},
            num_epochs=config.rollout_frequency,
            shuffle_batch_per_epoch=True,
        )
        num_learners = len(self.learner_group)
        step_rows = config.rows_per_step(count_training_rows(kept, history_window=config.history_window))
        if num_learners < 2:
            return self.learner_group.update(episodes=kept, minibatch_size=step_rows, **common)
        shards = shard_groups(kept, num_learners)
        rows = [count_training_rows(shard, history_window=config.history_window) for shard in shards]
        sizes, steps = learner_minibatch_sizes(rows, step_rows, config.rollout_frequency)
        results = self.learner_group.foreach_learner(
            _update_on_own_shard,
            shards=[ray.put(shard) for shard in shards],
            minibatch_sizes=sizes,
            num_total_minibatches=steps,
            **common,
        )
        out = []
        for result in results:
            if not result.ok:
                raise result.get()
            out.append(result.get())
        return out

    def _filter_groups(self, episodes: list) -> tuple[list, float]:
        """The groups whose trajectories disagree most in reward (possibly none with top_p), in
        batch order, and the mean in-group reward std of all groups."""
        returns = [[float(sum(a.get_rewards())) for a in e.agent_episodes.values()] for e in episodes]
        scores = torch.tensor([r for group in returns for r in group])
        group_ids = torch.tensor([g for g, group in enumerate(returns) for _ in group])
        selection = select_groups_by_variance(scores, group_ids, self.config.filter_settings)
        for key, value in selection.stats.items():
            self.metrics.log_value((FILTER_RESULTS, key), float(value), window=1)
        kept = sorted(int(g) for g in selection.kept_group_ids)
        return [episodes[g] for g in kept], selection.stats["in_group_reward_std_before"]

    def _watch_echo_trap(self, measurements: dict[str, float | None]) -> None:
        """Feeds the monitor; logs a 0/1 metric per signal and a warning when a collapse starts."""
        warnings = self.echo_trap.update(measurements)
        for signal in measurements:
            if signal in warnings and signal not in self._echo_trap_active:
                logger.warning(warnings[signal])
            self.metrics.log_value((ECHO_TRAP_RESULTS, signal), float(signal in warnings), window=1)
        self._echo_trap_active = set(warnings)

    @property
    def chat_template(self) -> ChatTemplate:
        """The policy tokenizer's chat template (loaded on first use)."""
        if self._chat_template is None:
            self._chat_template = ChatTemplate.from_tokenizer(load_tokenizer(resolve_model(self.config.llm_model)))
        return self._chat_template

    def measure_collapse(self, episodes: list) -> dict[str, float]:
        """RAGEN-2's collapse diagnostics on this batch when due (`.diagnostics()`), logged under
        `collapse/`; {} when not due or when the sampled thoughts come from fewer than 2 groups."""
        settings, iteration = self.config.collapse_metrics_settings, self.iteration + 1
        if not settings.due(iteration, first=not self._collapse_measured):
            return {}
        self._collapse_measured = True
        protocol = self.config.protocol_settings
        candidates = (
            first_turn_samples(episodes, encode=self.chat_template.encode, prefill_text=protocol.prefill_text)
            if protocol.think
            else []
        )
        rng = np.random.default_rng([self.config.seed or 0, iteration])
        samples = draw_samples(candidates, settings.collapse_metrics_samples, rng)
        self.metrics.log_value((COLLAPSE_RESULTS, "candidates"), float(len(candidates)), window=1)
        if len({s.group_id for s in samples}) < 2:
            return {}
        with self.metrics.log_time((TIMERS, COLLAPSE_TIMER)):
            results = self.learner_group.foreach_learner(
                functools.partial(
                    _collapse_metrics_on_learner, samples=samples, micro_batch_size=self.config.micro_batch_size
                )
            )
        first = next(iter(results))  # every learner holds the same weights
        if not first.ok:
            raise first.get()
        metrics = first.get()
        for key, value in metrics.items():
            self.metrics.log_value((COLLAPSE_RESULTS, key), value, window=1)
        return metrics

    def evaluate_fixed_seeds(self) -> dict[str, float]:
        """Success (with its 95% interval) and reward on the fixed evaluation instances (group size 1)."""
        config = self.config
        seeds = list(range(config.eval_seed, config.eval_seed + config.eval_size))
        sample = self.env_runner.sample if self.env_runner is not None else self._sample_on_remote_runners
        with self.metrics.log_time((TIMERS, EVAL_TIMER)):
            evaluation = evaluate_on_seeds(sample, seeds=seeds, temperature=config.eval_temperature)
        for key, value in evaluation.stats.items():
            self.metrics.log_value((EVALUATION_RESULTS, key), value, window=1)
        self._evaluation_episodes = evaluation.episodes
        self.last_evaluation_successes = evaluation.successes
        return evaluation.stats

    @override(Algorithm)
    def cleanup(self) -> None:
        if self.offline_data is not None:
            self.offline_data.close()  # release its Ray Data iterator before Ray shuts down
        self.weight_sync.close()
        super().cleanup()

    def pop_evaluation_episodes(self) -> list:
        """The episodes of the latest evaluation not yet taken (for trajectory pages)."""
        episodes, self._evaluation_episodes = self._evaluation_episodes, []
        return episodes

    def export_policy(self, directory: str | Path, *, adapter: bool = False) -> Path:
        """Writes the trained policy as a plain Hugging Face model directory (LoRA adapters merged in).

        Args:
            directory: Where to write it (created when missing).
            adapter: Under LoRA, write a PEFT adapter directory instead
                (`adapter_config.json` naming the base model directory,
                `adapter_model.safetensors`), loadable with `peft.PeftModel.from_pretrained`.
        """
        lora = self.config.lora_settings
        if adapter and not lora.enabled:
            raise ValueError("export_policy(adapter=True) needs a LoRA policy (.llm(lora_rank=r > 0))")
        component = f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{DEFAULT_MODULE_ID}"
        state = self.learner_group.get_state(components=component, inference_only=True)
        module_state = state[COMPONENT_LEARNER][COMPONENT_RL_MODULE][DEFAULT_MODULE_ID]
        return save_policy(
            module_state,
            base_model=self.config.llm_model,
            dtype=self.config.dtype,
            directory=directory,
            lora=lora,
            adapter=adapter,
        )


def save_policy(
    module_state: dict[str, Any],
    *,
    base_model: str,
    dtype: str,
    directory: str | Path,
    lora: LoraSettings | None = None,
    adapter: bool = False,
) -> Path:
    """Writes the policy of an `LLMRLModule` state (critic dropped) as a plain Hugging Face
    model directory, with the tokenizer of `base_model`, the model the module was built on.
    A LoRA state (`lora` with rank > 0) is merged into the base, or with `adapter` written as a
    PEFT adapter directory."""
    model_path = resolve_model(base_model)
    policy = load_causal_lm(model_path, dtype=getattr(torch, dtype))
    to_save: Any = policy
    if lora is not None and lora.enabled:
        peft_policy = peft_model_with_adapters(policy, policy_weights(module_state), lora)
        to_save = peft_policy if adapter else peft_policy.merge_and_unload()
    else:
        policy.load_state_dict(policy_weights(module_state))
    directory = Path(directory)
    to_save.save_pretrained(directory, safe_serialization=True)
    load_tokenizer(model_path).save_pretrained(directory)
    return directory
