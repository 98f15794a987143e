"""Every StarPO setting, each declared once: its type, default, check and doc.

A setting is a field of a frozen settings group; the groups a component owns live
beside it (`EngineConfig`, `LLMModuleConfig`, `ScoringConfig`, `LoraSettings`,
`ProtocolConfig`, `TurnBudget`, `AdvantageSettings`, `FilterSettings`,
`OffPolicyCorrection`, `AsyncRollouts`, `RewardShaping`, `CollapseMetricsSettings`,
`EchoTrapRule`), the others here. A field's doc is its entry in the group
docstring's `Attributes:`/`Args:` section. `SETTINGS_GROUPS` binds each group to
`StarPOConfig`: the flat attribute each field becomes (RLlib and Tune need flat
attributes), the builder method that sets it (`settings_builder` derives the
builders' keyword-only signatures and docstrings from the fields), and the property
that builds the group from the config (which runs its checks).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
import re
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided

from rllib_ragen.checks import check_choice
from rllib_ragen.inference.engine_config import EngineConfig
from rllib_ragen.lora import LoraSettings
from rllib_ragen.rollout.async_rollouts import AsyncRollouts
from rllib_ragen.rollout.env_group import DEFAULT_GROUP_RANDOMNESS, GROUP_RANDOMNESS, TurnBudget
from rllib_ragen.rollout.prompt.protocol import ProtocolConfig
from rllib_ragen.rollout.reward_shaping import RewardShaping
from rllib_ragen.training.advantages import AdvantageSettings
from rllib_ragen.training.collapse_metrics import CollapseMetricsSettings
from rllib_ragen.training.echo_trap import EchoTrapRule
from rllib_ragen.training.filtering import FilterSettings
from rllib_ragen.training.losses import KL_KINDS, LOSS_AGGREGATIONS
from rllib_ragen.training.module import LLMModuleConfig, ScoringConfig
from rllib_ragen.training.off_policy import OffPolicyCorrection
from rllib_ragen.training.token_masks import ALL_TOKENS, TOKEN_MASKS


def _check_at_least_one(group: object, *names: str) -> None:
    for name in names:
        if int(getattr(group, name)) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(group, name)}")


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """How many trajectories an iteration samples, and how (set with `StarPOConfig.rollouts()`).

    Attributes:
        n_groups: Groups per iteration; each group shares one initial state (seed).
        group_size: Trajectories per group (RAGEN: 8 groups x 16).
        response_length: Most tokens generated per turn.
        temperature: Rollout sampling temperature (> 0).
        train_seed_start: First training seed; later groups take the next seeds.
        env_step_timeout_s: Seconds one env reset or step may take; a call
            that hangs longer is abandoned and ends its trajectory (logged,
            counted in the `env_errors` metric). None = no limit.
        group_randomness: What a group's members share beyond the initial
            state: "independent" (each member draws its own transition and
            payout randomness, reproducibly from (seed, member), as RAGEN-2)
            or "shared" (every member replays the seed's draws: the Bandit's
            payout is one draw per group, which biases GRPO; see README).
    """

    n_groups: int = 8
    group_size: int = 16
    response_length: int = 400
    temperature: float = 1.0
    train_seed_start: int = 10_000
    env_step_timeout_s: float | None = 60.0
    group_randomness: str = DEFAULT_GROUP_RANDOMNESS

    def __post_init__(self) -> None:
        _check_at_least_one(self, "n_groups", "group_size", "response_length")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 for rollouts, got {self.temperature}")
        if self.env_step_timeout_s is not None and not self.env_step_timeout_s > 0:
            raise ValueError(f"env_step_timeout_s must be > 0 or None, got {self.env_step_timeout_s}")
        check_choice("group_randomness", self.group_randomness, GROUP_RANDOMNESS)


@dataclasses.dataclass(frozen=True)
class UpdateSettings:
    """How one rollout batch is cut into optimiser steps (set with `StarPOConfig.training()`; the
    threads with `.inference()`).

    Attributes:
        rollout_frequency: Optimiser passes over each rollout batch before
            the next rollout (1 = always fresh data, RAGEN's advice).
        mini_batch_size: Rows per optimiser step (a row is a trajectory,
            or one turn when a history window is set). None = every row the
            StarPO-S filter kept, in one step per pass. An update never
            repeats rows to fill a mini-batch: a larger size than the rows it
            gets is cut to those rows.
        micro_batch_size: Rows per forward/backward; gradients accumulate.
        micro_batch_tokens: Padded-token budget per forward/backward instead
            of `micro_batch_size` rows: rows are sorted by length and packed
            so that rows x longest row <= budget (less padding, bounded
            memory; same gradient). None = `micro_batch_size` rows.
        torch_threads: Threads of the learner and the in-process HF engine
            (None = all cores; Ray would otherwise leave a trial actor one).
    """

    rollout_frequency: int = 1
    mini_batch_size: int | None = None
    micro_batch_size: int = 4
    micro_batch_tokens: int | None = None
    torch_threads: int | None = None

    def __post_init__(self) -> None:
        _check_at_least_one(self, "rollout_frequency", "micro_batch_size")
        if self.mini_batch_size is not None and int(self.mini_batch_size) < 1:
            raise ValueError(f"mini_batch_size must be >= 1 or None, got {self.mini_batch_size}")
        if self.micro_batch_tokens is not None and int(self.micro_batch_tokens) < 1:
            raise ValueError(f"micro_batch_tokens must be >= 1 or None, got {self.micro_batch_tokens}")
        if self.torch_threads is not None and int(self.torch_threads) < 1:
            raise ValueError(f"torch_threads must be >= 1 or None, got {self.torch_threads}")
        if self.mini_batch_size is not None and self.micro_batch_size > self.mini_batch_size:
            raise ValueError(
                f"micro_batch_size={self.micro_batch_size} is larger than mini_batch_size={self.mini_batch_size}"
            )


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """The terms of the StarPO loss and the tokens they cover (set with `StarPOConfig.training()`).

    Attributes:
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
        loss_token_mask: Which generated tokens enter the policy loss (VAGEN's
            M_loss), a token mask policy of `rllib_ragen.training.token_masks`: "all",
            "think_and_answer" (no template tokens such as end-of-turn) or
            "answer_only"; `register_token_mask` adds more.
        adv_token_mask: Which generated tokens get values and advantages (VAGEN's
            M_adv), a token mask policy as above: GAE runs over them only, credit
            passing over the others; other estimators' advantages are zeroed off them.
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_dual: float | None = 3.0
    entropy_coeff: float = 0.001
    kl_coeff: float = 0.0
    kl_type: str = "k3"
    value_clip: float | None = 0.5
    vf_loss_coeff: float = 1.0
    loss_agg_mode: str = "token-mean"
    loss_token_mask: str = ALL_TOKENS
    adv_token_mask: str = ALL_TOKENS

    def __post_init__(self) -> None:
        check_choice("loss_agg_mode", self.loss_agg_mode, LOSS_AGGREGATIONS)
        check_choice("kl_type", self.kl_type, KL_KINDS)
        check_choice("loss_token_mask", self.loss_token_mask, sorted(TOKEN_MASKS))
        check_choice("adv_token_mask", self.adv_token_mask, sorted(TOKEN_MASKS))
        if self.kl_coeff < 0 or self.entropy_coeff < 0:
            raise ValueError(f"kl_coeff and entropy_coeff must be >= 0, got {self.kl_coeff}, {self.entropy_coeff}")

    @property
    def needs_token_spans(self) -> bool:
        """A token mask policy other than "all" is set: the learner labels tokens with protocol spans."""
        return (self.loss_token_mask, self.adv_token_mask) != (ALL_TOKENS, ALL_TOKENS)


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """AdamW for the policy and the critic (set with `StarPOConfig.training()`).

    Attributes:
        actor_lr: Policy learning rate.
        critic_lr: Critic learning rate.
        adam_betas: AdamW betas.
        weight_decay: AdamW weight decay.
    """

    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    adam_betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01

    def __post_init__(self) -> None:
        if self.actor_lr < 0 or self.critic_lr < 0:
            raise ValueError(f"actor_lr and critic_lr must be >= 0, got {self.actor_lr}, {self.critic_lr}")


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """Periodic evaluation on fixed initial states, group size 1 (set with `StarPOConfig.starpo_evaluation()`).

    Attributes:
        eval_interval: Evaluate every this many iterations (0 = never).
        eval_size: Evaluation instances (RAGEN: 256).
        eval_temperature: Sampling temperature of evaluation (0 = greedy).
        eval_seed: First evaluation seed; instances use seeds
            eval_seed .. eval_seed + eval_size - 1.
    """

    eval_interval: int = 10
    eval_size: int = 256
    eval_temperature: float = 0.5
    eval_seed: int = 123

    def __post_init__(self) -> None:
        _check_at_least_one(self, "eval_size")
        if self.eval_interval < 0 or self.eval_temperature < 0:
            raise ValueError(
                f"eval_interval and eval_temperature must be >= 0, got {self.eval_interval}, {self.eval_temperature}"
            )


@dataclasses.dataclass(frozen=True)
class RecordingSettings:
    """Writing sampled rollouts to Parquet (set with `StarPOConfig.rollout_recording()`).

    Attributes:
        rollout_parquet_dir: Directory receiving one `rollouts-iterNNNNNN.parquet`
            file per written iteration, with every group sampled in it (before
            the StarPO-S filter); None writes nothing.
        write_rollouts_every: Write the rollouts of every this many iterations.
    """

    rollout_parquet_dir: str | None = None
    write_rollouts_every: int = 1

    def __post_init__(self) -> None:
        _check_at_least_one(self, "write_rollouts_every")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting as `StarPOConfig` exposes it: a field of a settings group."""

    attribute: str  # the config's attribute
    keyword: str  # the builder keyword that sets it
    builder: str  # the builder method
    annotation: Any  # the field's type
    default: Any
    doc: str  # the field's entry in its group's docstring


@dataclasses.dataclass(frozen=True)
class SettingsBinding:
    """How a settings group maps onto `StarPOConfig`'s flat attributes (which RLlib and Tune need).

    Args:
        group: The frozen dataclass: its fields' types, defaults and docstring entries
            are the settings' own, its `__post_init__` their checks.
        builder: The `StarPOConfig` builder method that sets the group's fields.
        renames: field -> config attribute, where the names differ.
        derived: field -> how the config fills it from other settings (no attribute of its own).
        builders: field -> builder, for a field another builder sets.
        keywords: field -> builder keyword, where it is not the config attribute.
        name: The config property that builds the group; "" = the group's name in snake case.
    """

    group: type
    builder: str
    renames: Mapping[str, str] = dataclasses.field(default_factory=dict)
    derived: Mapping[str, Callable[[Any], Any]] = dataclasses.field(default_factory=dict)
    builders: Mapping[str, str] = dataclasses.field(default_factory=dict)
    keywords: Mapping[str, str] = dataclasses.field(default_factory=dict)
    name: str = ""

    @property
    def property_name(self) -> str:
        return self.name or re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", self.group.__name__).lower()

    def settings(self) -> list[Setting]:
        """Every field the config holds, as a setting."""
        docs, out = field_docs(self.group), []
        for f in dataclasses.fields(self.group):
            if f.name in self.derived:
                continue
            attribute = self.renames.get(f.name, f.name)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            keyword, builder = self.keywords.get(f.name, attribute), self.builders.get(f.name, self.builder)
            out.append(Setting(attribute, keyword, builder, f.type, default, docs.get(f.name, "")))
        return out

    def attributes(self) -> dict[str, str]:
        """field -> config attribute, for every field the config holds."""
        return {
            f.name: self.renames.get(f.name, f.name)
            for f in dataclasses.fields(self.group)
            if f.name not in self.derived
        }

    def defaults(self) -> dict[str, Any]:
        """config attribute -> default value, as the group declares it (a fresh one from a default factory)."""
        return {setting.attribute: setting.default for setting in self.settings()}

    def build(self, config: Any) -> Any:
        """The group of `config`'s current values (its checks run here)."""
        values = {field: getattr(config, attribute) for field, attribute in self.attributes().items()}
        return self.group(**values, **{field: derive(config) for field, derive in self.derived.items()})


def field_docs(group: type) -> dict[str, str]:
    """field -> its doc: the entries of the `Args:` or `Attributes:` section of `group`'s docstring."""
    return docstring_entries(group.__doc__)


def docstring_entries(doc: str | None) -> dict[str, str]:
    """name -> text of each entry of a Google-style docstring's `Args:` or `Attributes:` section."""
    entries, name, in_section = {}, None, False
    for line in inspect.cleandoc(doc or "").splitlines():
        if not line.startswith(" "):  # a section header, the summary or a blank line
            in_section, name = line.strip() in ("Args:", "Attributes:"), None
        elif in_section and (entry := re.fullmatch(r" {4}(\*{0,2}\w+):(.*)", line)):
            name, entries[entry[1]] = entry[1], entry[2].strip()
        elif name is not None:
            entries[name] = f"{entries[name]} {line.strip()}".strip()
    return entries


# Every settings group of StarPOConfig: each default and each check is declared in its group.
SETTINGS_GROUPS = (
    SettingsBinding(
        LLMModuleConfig,
        "llm",
        {"model": "llm_model"},
        keywords={"model": "model"},
        derived={"logit_temperature": operator.attrgetter("temperature"), "lora": operator.attrgetter("lora_settings")},
    ),
    SettingsBinding(LoraSettings, "llm", {f.name: f"lora_{f.name}" for f in dataclasses.fields(LoraSettings)}),
    SettingsBinding(RolloutSettings, "rollouts"),
    SettingsBinding(TurnBudget, "rollouts"),
    SettingsBinding(ProtocolConfig, "rollouts"),
    SettingsBinding(AsyncRollouts, "rollouts", name="async_rollouts_config"),
    SettingsBinding(
        EngineConfig,
        "inference",
        {
            "kind": "engine",
            "dtype": "engine_dtype",
            "num_threads": "engine_threads",
            "max_restarts_per_call": "max_engine_restarts_per_call",
            "start_timeout_s": "engine_start_timeout_s",
            "call_timeout_s": "engine_call_timeout_s",
        },
        # RLlib's `.debugging(seed=...)`, `.llm(lora_*=...)`
        derived={"seed": lambda config: config.seed or 0, "lora": operator.attrgetter("lora_settings")},
    ),
    SettingsBinding(AdvantageSettings, "training"),
    SettingsBinding(LossSettings, "training"),
    SettingsBinding(UpdateSettings, "training", builders={"torch_threads": "inference"}),
    SettingsBinding(ScoringConfig, "training"),
    SettingsBinding(OptimizerSettings, "training"),
    SettingsBinding(FilterSettings, "training"),
    SettingsBinding(OffPolicyCorrection, "training", name="off_policy_correction_config"),
    SettingsBinding(RewardShaping, "reward_shaping", name="reward_shaping_config"),
    SettingsBinding(CollapseMetricsSettings, "diagnostics"),
    SettingsBinding(
        EchoTrapRule, "diagnostics", {f.name: f"echo_trap_{f.name}" for f in dataclasses.fields(EchoTrapRule)}
    ),
    SettingsBinding(EvalSettings, "starpo_evaluation"),
    SettingsBinding(RecordingSettings, "rollout_recording"),
)
SETTINGS = tuple(setting for binding in SETTINGS_GROUPS for setting in binding.settings())


def with_group_properties(cls: type) -> type:
    """Class decorator: a property per settings group (`SettingsBinding.property_name`), building
    the group from the config's current settings (so each access runs its checks)."""
    for binding in SETTINGS_GROUPS:
        doc = f"The `{binding.group.__name__}` of the current settings (built, so checked, on each access)."
        setattr(cls, binding.property_name, property(binding.build, doc=doc))
    return cls


def settings_builder(method: Callable) -> Callable:
    """Makes `method` a `StarPOConfig` builder of the settings `SETTINGS_GROUPS` give its name.

    The builder takes each of them as a keyword-only argument; it calls
    `method(config, **other_keywords)`, sets the settings given (NotProvided leaves one
    unchanged) and returns the config. Other keywords raise TypeError unless `method`
    takes **kwargs. Its signature and docstring (`help()`, IDEs) list every setting with
    its doc: the docstring is `method`'s, its `Args:` section led by the settings.
    """
    name = method.__name__
    settings = {setting.keyword: setting for setting in SETTINGS if setting.builder == name}
    signature = inspect.signature(method)
    takes_others = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())

    @functools.wraps(method)
    def builder(self, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError(f"{type(self).__name__}.{name}() takes keyword arguments only, got {len(args)} positional")
        others = {keyword: kwargs.pop(keyword) for keyword in list(kwargs) if keyword not in settings}
        if others and not takes_others:
            raise unexpected_keyword(type(self).__name__, name, next(iter(others)))
        method(self, **others)
        for keyword, value in kwargs.items():
            if value is not NotProvided:
                setattr(self, settings[keyword].attribute, value)
        return self

    parameters = [
        inspect.Parameter(s.keyword, inspect.Parameter.KEYWORD_ONLY, default=NotProvided, annotation=s.annotation)
        for s in settings.values()
    ]
    builder_signature = signature.replace(
        parameters=[
            *(p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD),
            *parameters,
            *(p for p in signature.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD),
        ]
    )
    # typeshed's functools._Wrapped does not declare __signature__, which inspect.signature reads.
    builder.__signature__ = builder_signature  # type: ignore[attr-defined]
    builder.__doc__ = _builder_doc(method.__doc__, settings.values())
    return builder


def _builder_doc(doc: str | None, settings: Any) -> str:
    intro, _, other_args = inspect.cleandoc(doc or "").partition("\nArgs:\n")
    entries = [
        textwrap.fill(
            f"{s.keyword}: {s.doc} Default: {s.default!r}.",
            width=92,
            initial_indent="    ",
            subsequent_indent="        ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        for s in settings
    ]
    return "\n".join([intro.rstrip(), "", "Args:", *entries, *([other_args] if other_args else [])])


def unexpected_keyword(owner: str, builder: str, keyword: str) -> TypeError:
    """The TypeError for `keyword` given to builder `owner.builder()`, naming the builder that sets it."""
    known = {s.attribute: s for s in SETTINGS} | {s.keyword: s for s in SETTINGS}
    setting = known.get(keyword)
    hint = (
        f"; set it with .{setting.builder}({setting.keyword}=...)"
        if setting is not None
        else f"; help({owner}.{builder}) lists its settings"
    )
    return TypeError(f"{owner}.{builder}() got an unexpected keyword argument {keyword!r}{hint}")


# RLlib settings StarPO does not read, and the StarPO setting that does their job.
IGNORED_RLLIB_SETTINGS = {
    "lr": "actor_lr and critic_lr (.training())",
    "minibatch_size": "mini_batch_size (.training())",
    "num_epochs": "rollout_frequency (.training())",
    "train_batch_size": "n_groups and group_size (.rollouts())",
    "train_batch_size_per_learner": "n_groups and group_size (.rollouts())",
}


def refuse_ignored_rllib_settings(settings: Mapping[str, Any]) -> None:
    """Raises ValueError if `settings` sets an RLlib knob StarPO ignores, naming StarPO's own."""
    for name in settings:
        if name in IGNORED_RLLIB_SETTINGS:
            raise ValueError(f"StarPO does not use RLlib's {name}; set {IGNORED_RLLIB_SETTINGS[name]} instead")


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
