"""`StarPOConfig`'s builder methods and group properties, made from the settings groups.

`settings_builder` turns a docstring-only method into the builder of the settings
`SETTINGS_GROUPS` give its name; type checkers read each builder's keywords from its
`**settings: Unpack[...Keywords]` annotation (`rllib_ragen.algorithm.builder_keywords`,
generated from the same groups). `SettingsGroups` holds each group as a config property,
built (so checked) once: at validation, or at first use, and again only after a setting
changed.
"""

from __future__ import annotations

import functools
import inspect
import textwrap
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.utils.annotations import override

from rllib_ragen.algorithm.builder_keywords import SettingsGroupProperties
from rllib_ragen.algorithm.settings_binding import Setting, SettingsBinding
from rllib_ragen.algorithm.settings_groups import SETTINGS, SETTINGS_GROUPS

BuilderT = TypeVar("BuilderT", bound=Callable[..., Any])

# The builders that also take RLlib's own keywords (passed on to their body), and whose.
RLLIB_KEYWORDS: dict[str, Callable[..., Any]] = {"training": AlgorithmConfig.training}


def settings_builder(method: BuilderT) -> BuilderT:
    """Makes `method` a `StarPOConfig` builder of the settings `SETTINGS_GROUPS` give its name.

    The builder takes each of them as a keyword-only argument; it calls
    `method(config, **other_keywords)`, sets the settings given (NotProvided leaves one
    unchanged) and returns the config. Other keywords raise TypeError unless the builder
    takes RLlib's own (`RLLIB_KEYWORDS`; it then overrides RLlib's builder, with `@override`).
    Its signature and docstring (`help()`) list every setting with its doc: the docstring
    is `method`'s, its `Args:` section led by the settings.
    """
    name = method.__name__
    settings = {setting.keyword: setting for setting in SETTINGS if setting.builder == name}
    takes_others = name in RLLIB_KEYWORDS

    @functools.wraps(method)
    def builder(self: AlgorithmConfig, *args: Any, **kwargs: Any) -> Any:
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

    # typeshed's functools._Wrapped does not declare __signature__, which inspect.signature reads.
    builder.__signature__ = _builder_signature(method, settings.values(), takes_others)  # type: ignore[attr-defined]
    builder.__doc__ = _builder_doc(method.__doc__, settings.values())
    if takes_others:  # it overrides RLlib's builder; marked here, where the type checker does not see RLlib's Any
        return cast(BuilderT, override(AlgorithmConfig)(builder))
    return cast(BuilderT, builder)


def _builder_signature(
    method: Callable[..., Any], settings: Iterable[Setting], takes_others: bool
) -> inspect.Signature:
    """`method`'s own parameters (its **kwargs only if it takes RLlib's), then each setting, keyword-only."""
    signature = inspect.signature(method)
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    others = [p for p in signature.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD and takes_others]
    keywords = [
        inspect.Parameter(s.keyword, inspect.Parameter.KEYWORD_ONLY, default=NotProvided, annotation=s.declared_type)
        for s in settings
    ]
    return signature.replace(parameters=[*own, *keywords, *others])


def _builder_doc(doc: str | None, settings: Iterable[Setting]) -> str:
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


class SettingsGroups(SettingsGroupProperties):
    """Mixin of `StarPOConfig`: each settings group as a property (`SettingsBinding.property_name`).

    The properties are made below from `SETTINGS_GROUPS`; `SettingsGroupProperties` (generated with
    the builders' keywords) declares each with its group's type, for type checkers.

    A group is built, so checked, once from the current settings: by `settings_groups()`
    (validation) or at its first use, and kept until a setting is set again. It lives in a slot,
    not among the attributes (RLlib's `to_dict()`, Tune and checkpoints skip it), and
    travels with the config to the learners, which so read the validated groups.
    """

    __slots__ = ("_built_groups",)
    _built_groups: dict[str, Any]

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_built_groups":
            # Not a setting: kept on a frozen config too (pickle and copy restore it through setattr).
            object.__setattr__(self, name, value)
            return
        super().__setattr__(name, value)
        if not name.startswith("_"):  # a setting (RLlib's private bookkeeping, e.g. freezing, changes none)
            self._built_groups = {}

    def settings_group(self, binding: SettingsBinding) -> Any:
        """The group `binding` binds, built from the current settings once."""
        built = getattr(self, "_built_groups", {})
        if binding.property_name not in built:
            self._built_groups = {**built, binding.property_name: binding.build(self)}
        return self._built_groups[binding.property_name]

    def settings_groups(self) -> list[Any]:
        """Every settings group, built anew (so checked) from the current settings, as validation does:
        a value changed in place (a dict's entry) counts too. The groups other settings feed come last."""
        self._built_groups = {}
        return [self.settings_group(b) for b in sorted(SETTINGS_GROUPS, key=lambda b: bool(b.derived))]


for _binding in SETTINGS_GROUPS:
    setattr(
        SettingsGroups,
        _binding.property_name,
        property(
            functools.partial(SettingsGroups.settings_group, binding=_binding),
            doc=f"The `{_binding.group.__name__}` of the current settings (built, so checked, once).",
        ),
    )
