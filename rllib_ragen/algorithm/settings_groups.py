"""Every StarPO setting group, bound to `StarPOConfig`: the single table of its settings.

A setting is a field of a frozen settings group, declared once with its type, default,
check and doc; each group lives beside the component it configures:

| group | module |
|---|---|
| `LLMModuleSettings`, `ScoringSettings` | `rllib_ragen.training.module` |
| `LoraSettings` | `rllib_ragen.lora` |
| `RolloutSettings`, `TurnBudgetSettings` | `rllib_ragen.rollout.env_group` |
| `ProtocolSettings` | `rllib_ragen.rollout.prompt.prompt_protocol` |
| `AsyncRolloutSettings` | `rllib_ragen.rollout.async_rollouts` |
| `RewardShapingSettings` | `rllib_ragen.rollout.reward_shaping` |
| `EvalSettings` | `rllib_ragen.rollout.evaluation` |
| `EngineSettings` | `rllib_ragen.inference.engine_settings` |
| `AdvantageSettings` | `rllib_ragen.training.advantages` |
| `LossSettings` | `rllib_ragen.training.losses` |
| `UpdateSettings`, `OptimizerSettings` | `rllib_ragen.training.learner` |
| `FilterSettings` | `rllib_ragen.training.filtering` |
| `OffPolicyCorrectionSettings` | `rllib_ragen.training.off_policy` |
| `CollapseMetricsSettings` | `rllib_ragen.training.collapse_metrics` |
| `EchoTrapSettings` | `rllib_ragen.training.echo_trap` |
| `RecordingSettings` | `rllib_ragen.data.parquet` |

`SETTINGS_GROUPS` binds each group to `StarPOConfig` (`SettingsBinding`): the flat
attribute each field becomes, the builder method that sets it, and the config property
holding the group (`rllib_ragen.algorithm.builders` makes the builders and properties).
"""

from __future__ import annotations

import dataclasses
import operator

from rllib_ragen.algorithm.settings_binding import SettingsBinding
from rllib_ragen.data.parquet import RecordingSettings
from rllib_ragen.inference.engine_settings import EngineSettings
from rllib_ragen.lora import LoraSettings
from rllib_ragen.rollout.async_rollouts import AsyncRolloutSettings
from rllib_ragen.rollout.env_group import RolloutSettings, TurnBudgetSettings
from rllib_ragen.rollout.evaluation import EvalSettings
from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings
from rllib_ragen.rollout.reward_shaping import RewardShapingSettings
from rllib_ragen.training.advantages import AdvantageSettings
from rllib_ragen.training.collapse_metrics import CollapseMetricsSettings
from rllib_ragen.training.echo_trap import EchoTrapSettings
from rllib_ragen.training.filtering import FilterSettings
from rllib_ragen.training.learner import OptimizerSettings, UpdateSettings
from rllib_ragen.training.losses import LossSettings
from rllib_ragen.training.module import LLMModuleSettings, ScoringSettings
from rllib_ragen.training.off_policy import OffPolicyCorrectionSettings

# Every settings group of StarPOConfig: each default and each check is declared in its group.
SETTINGS_GROUPS = (
    SettingsBinding(
        LLMModuleSettings,
        "llm",
        {"model": "llm_model"},
        keywords={"model": "model"},
        derived={"logit_temperature": operator.attrgetter("temperature"), "lora": operator.attrgetter("lora_settings")},
    ),
    SettingsBinding(LoraSettings, "llm", {f.name: f"lora_{f.name}" for f in dataclasses.fields(LoraSettings)}),
    SettingsBinding(RolloutSettings, "rollouts"),
    SettingsBinding(TurnBudgetSettings, "rollouts"),
    SettingsBinding(ProtocolSettings, "rollouts"),
    SettingsBinding(AsyncRolloutSettings, "rollouts"),
    SettingsBinding(
        EngineSettings,
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
    SettingsBinding(ScoringSettings, "training"),
    SettingsBinding(OptimizerSettings, "training"),
    SettingsBinding(FilterSettings, "training"),
    SettingsBinding(OffPolicyCorrectionSettings, "training"),
    SettingsBinding(RewardShapingSettings, "reward_shaping"),
    SettingsBinding(CollapseMetricsSettings, "diagnostics"),
    SettingsBinding(
        EchoTrapSettings, "diagnostics", {f.name: f"echo_trap_{f.name}" for f in dataclasses.fields(EchoTrapSettings)}
    ),
    SettingsBinding(EvalSettings, "starpo_evaluation"),
    SettingsBinding(RecordingSettings, "rollout_recording"),
)
SETTINGS = tuple(setting for binding in SETTINGS_GROUPS for setting in binding.settings())
