"""`--set KEY=VALUE` (and `--grid KEY=V1,V2`): a setting's value from its text, through its declared type.

A StarPO setting (by its name, `rllib_ragen.algorithm.settings_groups`) converts through the type
its settings group declares (`history_window: int | None` takes an integer or None); an attribute
of RLlib's own, which declares none, through the type of its current value (any literal when that
is None). Either is then set by name with `StarPOConfig.update_from_dict`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from envs.base import parse_literal
from rllib_ragen.algorithm.settings_groups import settings_of

if TYPE_CHECKING:
    from rllib_ragen.algorithm.starpo import StarPOConfig


def apply_setting(config: StarPOConfig, assignment: str) -> None:
    """Applies one `KEY=VALUE`, VALUE converted through the setting's type (see `setting_value`)."""
    apply_settings(config, [assignment])


def apply_settings(config: StarPOConfig, assignments: Sequence[str], *, flag: str = "--set") -> None:
    """Applies `KEY=VALUE`s together (a group's checks see every value given for it)."""
    values = {}
    for assignment in assignments:
        key, raw = split_assignment(config, assignment, flag=flag)
        values[key] = setting_value(config, key, raw, flag=flag)
    config.update_from_dict(values)


def split_assignment(config: StarPOConfig, assignment: str, *, flag: str) -> tuple[str, str]:
    """`KEY=VALUE` -> (KEY, VALUE), KEY checked to be a StarPO setting or an attribute of RLlib's config."""
    key, sep, raw = assignment.partition("=")
    if not sep:
        raise ValueError(f"{flag} expects KEY=VALUE, got {assignment!r}")
    if key not in settings_of(config) and not hasattr(config, key):
        raise ValueError(f"unknown config key {key!r} in {flag} {assignment!r}")
    return key, raw


def setting_value(config: StarPOConfig, key: str, raw: str, *, flag: str) -> Any:
    """The value `raw` gives setting `key`: a number setting takes a number (an int setting an
    integer), a flag True/False, a text setting any text, a tuple setting a list or tuple, an
    optional one also None.

    Raises:
        ValueError: naming the flag, the setting, its declared type and the value given.
    """
    declared = settings_of(config)
    if key in declared:
        kind = declared[key].declared_type
        name = kind.__name__ if isinstance(kind, type) else str(kind).replace("collections.abc.", "")
        name = name.replace("typing.", "")
    else:  # RLlib's own attribute
        current = getattr(config, key)
        if current is None:
            kind, name = Any, "any literal"
        elif isinstance(current, dict):  # RLlib merges a dict setting (env_config, ...) into its current dict
            kind, name = type(current), type(current).__name__
        else:
            kind, name = type(current) | None, type(current).__name__
    accepted, value = converted(raw, kind)
    if not accepted:
        raise ValueError(f"{flag} {key}={raw}: {key} takes {name} ({description(kind)}), got {raw!r}")
    return value


def converted(raw: str, kind: Any) -> tuple[bool, Any]:
    """(whether `raw` spells a value of type `kind`, that value)."""
    value = parse_literal(raw)
    members = typing.get_args(kind) if _is_union(kind) else (kind,)
    # Text last: every value is also a text.
    for member in sorted(members, key=lambda member: member is str):
        if member is Any:
            return True, value
        if member is type(None) and value is None:
            return True, None
        origin = typing.get_origin(member) or member
        if origin is str:
            return True, raw
        if origin is bool and isinstance(value, bool):
            return True, value
        if origin is int and isinstance(value, int) and not isinstance(value, bool):
            return True, value
        if origin is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, float(value)
        if origin in (tuple, list) and isinstance(value, (tuple, list)):
            return True, origin(value)
        if isinstance(origin, type) and issubclass(origin, Mapping) and isinstance(value, dict):
            return True, value
    return False, None


def description(kind: Any) -> str:
    """What a user may write for a value of type `kind`: `int | None` -> "an integer or None"."""
    if _is_union(kind):
        return " or ".join(description(member) for member in typing.get_args(kind))
    origin = typing.get_origin(kind) or kind
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return "a dict, e.g. {'key': 1}"
    return _DESCRIPTIONS.get(origin, "a Python literal")


def _is_union(kind: Any) -> bool:
    return isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union


_DESCRIPTIONS: dict[Any, str] = {
    bool: "True or False",
    int: "an integer",
    float: "a number, e.g. 1e-5",
    str: "any text",
    tuple: "a list or tuple, e.g. [1, 2]",
    list: "a list or tuple, e.g. [1, 2]",
    type(None): "None",
}
