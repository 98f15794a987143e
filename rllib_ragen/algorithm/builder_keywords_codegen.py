"""Writes `builder_keywords.py`: each `StarPOConfig` builder's keywords and their types, for type checkers.

The builders are made at import time from the settings groups (`settings_builder`),
which a type checker does not run; so their keywords are also written out, generated
from the same groups, as one `TypedDict` per builder that the builder's
`**settings: Unpack[...]` annotation names (PEP 692). After changing a settings group:

    python -m rllib_ragen.algorithm.builder_keywords_codegen

`--check` only compares (exit code 1 when the file is stale; the tests run it).
"""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

from rllib_ragen.algorithm.builders import RLLIB_KEYWORDS
from rllib_ragen.algorithm.ignored_rllib_settings import IGNORED_RLLIB_SETTINGS
from rllib_ragen.algorithm.settings_groups import SETTINGS, SETTINGS_GROUPS

GENERATED_FILE = Path(__file__).with_name("builder_keywords.py")

_HEADER = '''"""The keywords of each `StarPOConfig` builder and their types, as a TypedDict for its `**settings`,
and each settings group's property with its type (`SettingsGroupProperties`).

Generated from the settings groups by `python -m rllib_ragen.algorithm.builder_keywords_codegen`:
do not edit (a test fails when it is stale). Each builder also takes `NotProvided` (leave unchanged).
"""

from __future__ import annotations
'''


def keywords_class_name(builder: str) -> str:
    """The TypedDict of `builder`'s keywords: `rollout_recording` -> `RolloutRecordingKeywords`."""
    return "".join(part.title() for part in builder.split("_")) + "Keywords"


def builder_keywords_source() -> str:
    """The text of `builder_keywords.py`, from the settings as they are declared now."""
    builders = list(dict.fromkeys(setting.builder for setting in SETTINGS))
    needs_mapping = any("Mapping[" in setting.annotation for setting in SETTINGS)
    lines = [_HEADER]
    if needs_mapping:
        lines.append("from collections.abc import Mapping")
    lines.append(f"from typing import TYPE_CHECKING, {'Any, ' if RLLIB_KEYWORDS else ''}TypedDict")
    for builder in builders:
        lines += ["", "", f"class {keywords_class_name(builder)}(TypedDict, total=False):"]
        own = {s.keyword: s.annotation for s in SETTINGS if s.builder == builder}
        lines += [f"    {keyword}: {annotation}" for keyword, annotation in own.items()]
        if builder in RLLIB_KEYWORDS:
            lines.append(f"    # RLlib's own (AlgorithmConfig.{builder}), but those StarPO refuses or sets")
            rllib = inspect.signature(RLLIB_KEYWORDS[builder]).parameters
            lines += [f"    {name}: Any" for name in rllib if name not in {"self", *IGNORED_RLLIB_SETTINGS, *own}]
    lines += group_properties_source()
    return "\n".join(lines) + "\n"


def group_properties_source() -> list[str]:
    """`SettingsGroupProperties`: each group's config property typed as its group (the properties
    themselves are made at import time, which a type checker does not run)."""
    by_module: dict[str, set[str]] = {}
    for binding in SETTINGS_GROUPS:
        by_module.setdefault(binding.group.__module__, set()).add(binding.group.__name__)
    lines = ["", "", "if TYPE_CHECKING:"]
    lines += [f"    from {module} import {', '.join(sorted(names))}" for module, names in sorted(by_module.items())]
    lines += [
        "",
        "",
        "class SettingsGroupProperties:",
        '    """Each group property of `StarPOConfig` and its type (read-only: `SettingsGroups` makes them)."""',
        "",
    ]
    lines += [f"    {binding.property_name}: {binding.group.__name__}" for binding in SETTINGS_GROUPS]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale; write nothing")
    args = parser.parse_args(argv)
    source = builder_keywords_source()
    if args.check:
        stale = GENERATED_FILE.read_text() != source
        if stale:
            print(f"{GENERATED_FILE} is stale: run python -m rllib_ragen.algorithm.builder_keywords_codegen")
        return int(stale)
    GENERATED_FILE.write_text(source)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
