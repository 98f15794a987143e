"""How a settings group becomes flat `StarPOConfig` settings: the binding, and each field's doc.

A setting is a field of a frozen settings group (its type, default, check and doc
declared there once); a `SettingsBinding` says which config attribute it becomes
(RLlib and Tune need flat attributes) and which builder method sets it. The doc of a
field is its entry in the group docstring's `Attributes:`/`Args:` section.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting as `StarPOConfig` exposes it: a field of a settings group.

    Args:
        attribute: The config's attribute.
        keyword: The builder keyword that sets it.
        builder: The builder method.
        annotation: The field's type as its group writes it (e.g. "int | None").
        declared_type: The field's type, resolved (e.g. `int | None`).
        default: The field's default.
        doc: The field's entry in its group's docstring.
    """

    attribute: str
    keyword: str
    builder: str
    annotation: str
    declared_type: Any
    default: Any
    doc: str


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
    """

    group: type
    builder: str
    renames: Mapping[str, str] = dataclasses.field(default_factory=dict)
    derived: Mapping[str, Callable[[Any], Any]] = dataclasses.field(default_factory=dict)
    builders: Mapping[str, str] = dataclasses.field(default_factory=dict)
    keywords: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def property_name(self) -> str:
        """The config property holding the group: its name in snake case."""
        return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", self.group.__name__).lower()

    def settings(self) -> list[Setting]:
        """Every field the config holds, as a setting."""
        docs, types, out = field_docs(self.group), typing.get_type_hints(self.group), []
        for f in dataclasses.fields(self.group):
            if f.name in self.derived:
                continue
            attribute = self.renames.get(f.name, f.name)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            keyword, builder = self.keywords.get(f.name, attribute), self.builders.get(f.name, self.builder)
            annotation = f.type if isinstance(f.type, str) else f.type.__name__
            out.append(Setting(attribute, keyword, builder, annotation, types[f.name], default, docs.get(f.name, "")))
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
