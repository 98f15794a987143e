"""Every StarPO setting by name: for the code that reads or sets settings by name rather than through a
builder (`--set KEY=VALUE` and the studies in `rllib_ragen.run`, and `StarPOConfig.to_dict()` and
`update_from_dict()`, which Tune trials, MLflow params and RLlib's evaluation config go through).

A setting is a field of one of `StarPOConfig`'s settings groups: a frozen dataclass declared beside the
component it configures (each field's type, default and check), held by the config as an attribute
(`config.rollout`, `config.loss`, ...) and set by a builder method. A setting's name is its field's name,
prefixed for the groups in `PREFIXES`, renamed in `RENAMED`; each is also its builder keyword, but for
`llm_model` (`.llm(model=...)`: RLlib's config already has a `model`).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from typing import Any

# (group attribute, field) -> the setting's name, where the field's name alone would not say what it sets.
RENAMED = {
    ("llm_module", "model"): "llm_model",
    ("rollout_engine", "kind"): "engine",
    ("rollout_engine", "dtype"): "engine_dtype",
    ("rollout_engine", "num_threads"): "engine_threads",
    ("rollout_engine", "max_restarts_per_call"): "max_engine_restarts_per_call",
    ("rollout_engine", "start_timeout_s"): "engine_start_timeout_s",
    ("rollout_engine", "call_timeout_s"): "engine_call_timeout_s",
}
# Group attribute -> the prefix of each of its settings' names.
PREFIXES = {"lora": "lora_", "echo_trap": "echo_trap_"}


@dataclasses.dataclass(frozen=True)
class Setting:
    """Where a named setting lives.

    Args:
        group: The config attribute holding its settings group.
        field: Its field in that group.
        declared_type: The field's type (e.g. `int | None`), resolved.
    """

    group: str
    field: str
    declared_type: Any


def settings_of(config: Any) -> dict[str, Setting]:
    """Every setting of `config` (a `StarPOConfig`) by name: each field of each group it holds (the
    attributes whose value is a dataclass; RLlib's own attributes hold none)."""
    named: dict[str, Setting] = {}
    for attribute, value in vars(config).items():
        if dataclasses.is_dataclass(value) and not isinstance(value, type) and not attribute.startswith("_"):
            named.update(_group_settings(attribute, type(value)))
    return named


@functools.cache
def _group_settings(attribute: str, group: type) -> dict[str, Setting]:
    types = typing.get_type_hints(group)
    return {
        RENAMED.get((attribute, f.name), PREFIXES.get(attribute, "") + f.name): Setting(
            attribute, f.name, types[f.name]
        )
        for f in dataclasses.fields(group)
    }


def setting_values(config: Any) -> dict[str, Any]:
    """The value of every setting of `config`, by name."""
    return {name: getattr(getattr(config, s.group), s.field) for name, s in settings_of(config).items()}


def set_settings(config: Any, values: Mapping[str, Any]) -> None:
    """Sets settings of `config` by name: each group changed once, with every field given for it, so its
    checks see them together (raises ValueError naming the setting of an unknown name or a bad value)."""
    settings = settings_of(config)
    changes: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        if name not in settings:
            raise ValueError(f"unknown StarPO setting {name!r}")
        changes.setdefault(settings[name].group, {})[settings[name].field] = value
    for attribute, fields in changes.items():
        setattr(config, attribute, dataclasses.replace(getattr(config, attribute), **fields))
