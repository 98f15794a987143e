"""The keywords of each `StarPOConfig` builder and their types, as a TypedDict for its `**settings`,
and each settings group's property with its type (`SettingsGroupProperties`).

Generated from the settings groups by `python -m rllib_ragen.algorithm.builder_keywords_codegen`:
do not edit (a test fails when it is stale). Each builder also takes `NotProvided` (leave unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict


class LlmKeywords(TypedDict, total=False):
    model: str
    critic: str
    dtype: str
    gradient_checkpointing: bool
    trained_top_layers: int | None
    lora_rank: int
    lora_alpha: float
    lora_target_modules: str | tuple[str, ...]
    lora_dropout: float
    lora_top_layers: int


class RolloutsKeywords(TypedDict, total=False):
    n_groups: int
    group_size: int
    response_length: int
    temperature: float
    train_seed_start: int
    env_step_timeout_s: float | None
    group_randomness: str
    train_env_overrides: Mapping[str, Any] | None
    max_turns: int
    max_actions_per_traj: int
    format_penalty: float
    max_actions_per_turn: int
    think: bool
    prefill: bool
    history_window: int | None
    async_rollouts: bool
    max_staleness: int


class InferenceKeywords(TypedDict, total=False):
    engine: str
    num_engines: int
    kv_cache_gb: float | None
    gpu_memory_utilization: float | None
    engine_dtype: str
    max_model_len: int
    enable_prefix_caching: bool
    kv_block_size: int | None
    num_gpus_per_engine: float
    tensor_parallel_size: int
    engine_threads: int | None
    num_cpus_per_engine: float
    max_batch_size: int
    enforce_eager: bool
    max_engine_restarts_per_call: int
    engine_start_timeout_s: float
    engine_call_timeout_s: float
    weight_sync: str
    weight_sync_timeout_s: float
    lora_sync: str
    torch_threads: int | None


class TrainingKeywords(TypedDict, total=False):
    advantage_estimator: str
    gamma: float
    lambda_: float
    high_level_gamma: float
    whiten_advantages: bool
    grpo_norm_by_std: bool
    advantage_hparams: Mapping[str, Any]
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_dual: float | None
    entropy_coeff: float
    kl_coeff: float
    kl_type: str
    value_clip: float | None
    vf_loss_coeff: float
    loss_agg_mode: str
    loss_token_mask: str
    advantage_token_mask: str
    rollout_frequency: int
    mini_batch_size: int | None
    micro_batch_size: int
    micro_batch_tokens: int | None
    autocast_dtype: str | None
    logit_chunk_size: int
    actor_lr: float
    critic_lr: float
    adam_betas: tuple[float, float]
    weight_decay: float
    rollout_filter_strategy: str
    rollout_filter_ratio: float
    rollout_filter_top_p: float
    rollout_filter_metric: str
    off_policy_correction: str
    tis_cap: float
    mis_low: float
    mis_high: float
    # RLlib's own (AlgorithmConfig.training), but those StarPO refuses or sets
    grad_clip: Any
    grad_clip_by: Any
    shuffle_batch_per_epoch: Any
    model: Any
    optimizer: Any
    num_aggregator_actors_per_learner: Any
    max_requests_in_flight_per_aggregator_actor: Any
    num_sgd_iter: Any
    max_requests_in_flight_per_sampler_worker: Any
    learner_class: Any
    learner_connector: Any
    add_default_connectors_to_learner_pipeline: Any
    learner_config_dict: Any


class RewardShapingKeywords(TypedDict, total=False):
    think_length_coeff: float
    think_min_words: int
    think_max_words: int
    think_names_action_coeff: float
    advantage_length_weight: float


class DiagnosticsKeywords(TypedDict, total=False):
    collapse_metrics_interval: int
    collapse_metrics_samples: int
    echo_trap_baseline_iters: int
    echo_trap_patience: int
    echo_trap_ratio: float


class StarpoEvaluationKeywords(TypedDict, total=False):
    eval_interval: int
    eval_size: int
    eval_temperature: float
    eval_seed: int


class RolloutRecordingKeywords(TypedDict, total=False):
    rollout_parquet_dir: str | None
    write_rollouts_every: int


if TYPE_CHECKING:
    from rllib_ragen.data.parquet import RecordingSettings
    from rllib_ragen.inference.engine_settings import EngineSettings
    from rllib_ragen.lora import LoraSettings
    from rllib_ragen.rollout.async_rollouts import AsyncRolloutSettings
    from rllib_ragen.rollout.env_group import RolloutSettings, TurnBudgetSettings
    from rllib_ragen.rollout.evaluation import EvalSettings
    from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings
    from rllib_ragen.rollout.reward_shaping import RewardShapingSettings
    from rllib_ragen.training.advantages.advantage_settings import AdvantageSettings
    from rllib_ragen.training.collapse_metrics import CollapseMetricsSettings
    from rllib_ragen.training.echo_trap import EchoTrapSettings
    from rllib_ragen.training.filtering import FilterSettings
    from rllib_ragen.training.learner import OptimizerSettings, UpdateSettings
    from rllib_ragen.training.losses import LossSettings
    from rllib_ragen.training.module import LLMModuleSettings, ScoringSettings
    from rllib_ragen.training.off_policy import OffPolicyCorrectionSettings


class SettingsGroupProperties:
    """Each group property of `StarPOConfig` and its type (read-only: `SettingsGroups` makes them)."""

    llm_module_settings: LLMModuleSettings
    lora_settings: LoraSettings
    rollout_settings: RolloutSettings
    turn_budget_settings: TurnBudgetSettings
    protocol_settings: ProtocolSettings
    async_rollout_settings: AsyncRolloutSettings
    engine_settings: EngineSettings
    advantage_settings: AdvantageSettings
    loss_settings: LossSettings
    update_settings: UpdateSettings
    scoring_settings: ScoringSettings
    optimizer_settings: OptimizerSettings
    filter_settings: FilterSettings
    off_policy_correction_settings: OffPolicyCorrectionSettings
    reward_shaping_settings: RewardShapingSettings
    collapse_metrics_settings: CollapseMetricsSettings
    echo_trap_settings: EchoTrapSettings
    eval_settings: EvalSettings
    recording_settings: RecordingSettings
