"""Each StarPO setting is named once, as a field of its settings group: the builders' keywords,
signatures and docs, the config's attributes and the group properties are derived from the fields."""

from __future__ import annotations

import ast
import inspect
import typing
from collections import Counter
from pathlib import Path

import pytest
from ray.rllib.algorithms.algorithm_config import NotProvided

from rllib_ragen.algorithm import builder_keywords
from rllib_ragen.algorithm.builder_keywords_codegen import GENERATED_FILE, builder_keywords_source, keywords_class_name
from rllib_ragen.algorithm.settings_binding import docstring_entries, field_docs
from rllib_ragen.algorithm.settings_groups import SETTINGS, SETTINGS_GROUPS
from rllib_ragen.algorithm.starpo import StarPOConfig

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("rllib_ragen", "envs")
BUILDERS = sorted({setting.builder for setting in SETTINGS})
SETTING_NAMES = {setting.attribute for setting in SETTINGS} | {setting.keyword for setting in SETTINGS}


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda setting: f"{setting.builder}-{setting.keyword}")
def test_every_setting_is_set_by_its_builder_and_documented_there(setting):
    config = StarPOConfig()
    value = object()
    unchanged = getattr(StarPOConfig(), setting.builder)(**{setting.keyword: NotProvided})
    assert getattr(unchanged, setting.attribute) == setting.default
    assert getattr(config, setting.builder)(**{setting.keyword: value}) is config
    assert getattr(config, setting.attribute) is value
    builder = getattr(StarPOConfig, setting.builder)
    parameter = inspect.signature(builder).parameters[setting.keyword]
    assert (parameter.kind, parameter.default) == (inspect.Parameter.KEYWORD_ONLY, NotProvided)
    assert setting.doc, f"{setting.attribute}: its group's docstring has no entry for it"
    assert docstring_entries(builder.__doc__)[setting.keyword] == f"{setting.doc} Default: {setting.default!r}."


def test_every_field_but_the_derived_ones_is_a_documented_setting():
    for binding in SETTINGS_GROUPS:
        held = set(binding.attributes())
        assert held | set(binding.derived) == {f for f in binding.group.__dataclass_fields__}
        assert held <= set(field_docs(binding.group)), binding.group


def test_each_builder_takes_exactly_its_settings():
    keywords = Counter(setting.keyword for setting in SETTINGS)
    assert [k for k, n in keywords.items() if n > 1] == []
    for name in BUILDERS:
        parameters = inspect.signature(getattr(StarPOConfig, name)).parameters
        declared = {p for p, spec in parameters.items() if spec.kind is inspect.Parameter.KEYWORD_ONLY}
        assert declared == {s.keyword for s in SETTINGS if s.builder == name}, name


def test_unknown_or_positional_arguments_are_a_clear_type_error():
    config = StarPOConfig()
    with pytest.raises(TypeError, match=r"StarPOConfig.llm\(\) got an unexpected keyword argument 'n_groups'; "
                                        r"set it with .rollouts\(n_groups=...\)"):
        config.llm(n_groups=4)
    with pytest.raises(TypeError, match=r"StarPOConfig.llm\(\) got an unexpected keyword argument 'llm_model'; "
                                        r"set it with .llm\(model=...\)"):
        config.llm(llm_model="tiny-random")
    with pytest.raises(TypeError, match=r"StarPOConfig.training\(\) got an unexpected keyword argument 'no_such'"):
        config.training(no_such=1)
    with pytest.raises(TypeError, match=r"StarPOConfig.rollouts\(\) takes keyword arguments only"):
        config.rollouts(8)
    assert config.n_groups == StarPOConfig().n_groups


def test_training_still_passes_rllibs_own_settings_on():
    config = StarPOConfig().training(grad_clip=3.0, shuffle_batch_per_epoch=False, gamma=0.5, actor_lr=1e-4)
    assert (config.grad_clip, config.shuffle_batch_per_epoch, config.gamma, config.actor_lr) == (3.0, False, 0.5, 1e-4)
    assert "**kwargs: RLlib's own training settings" in StarPOConfig.training.__doc__
    assert inspect.signature(StarPOConfig.training).parameters["kwargs"].kind is inspect.Parameter.VAR_KEYWORD


def test_the_typed_keywords_are_generated_from_the_groups_and_name_each_builders_settings():
    assert GENERATED_FILE.read_text() == builder_keywords_source(), (
        "stale: run python -m rllib_ragen.algorithm.builder_keywords_codegen"
    )
    for name in BUILDERS:
        method = getattr(StarPOConfig, name).__wrapped__
        (settings,) = [p for p in inspect.signature(method, eval_str=True).parameters.values()
                       if p.kind is inspect.Parameter.VAR_KEYWORD]
        keywords = getattr(builder_keywords, keywords_class_name(name))
        assert settings.annotation == typing.Unpack[keywords], name
        assert {s.keyword for s in SETTINGS if s.builder == name} <= set(keywords.__annotations__), name


def test_every_group_is_a_property_of_the_config():
    config, names = StarPOConfig(), [binding.property_name for binding in SETTINGS_GROUPS]
    assert len(set(names)) == len(names) and not set(names) & (SETTING_NAMES | set(BUILDERS))
    for binding in SETTINGS_GROUPS:
        assert isinstance(getattr(config, binding.property_name), binding.group)
    # The names the code base uses.
    assert {"engine_settings", "llm_module_settings", "turn_budget_settings", "off_policy_correction_settings",
            "async_rollout_settings", "reward_shaping_settings", "echo_trap_settings"} <= set(names)
    # One suffix: each group is named after what it sets, then "Settings", and its property after the group.
    assert all(binding.group.__name__.endswith("Settings") for binding in SETTINGS_GROUPS)
    assert all(name.endswith("_settings") for name in names)


# ---------------------------------------------------------------- the source names each setting once
def _takes_not_provided(node: ast.AST) -> bool:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    defaults = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
    return any(isinstance(d, ast.Name) and d.id == "NotProvided" for d in defaults)


def _is_algorithm_config(node: ast.AST) -> bool:
    return isinstance(node, ast.ClassDef) and any(
        (base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")).endswith("AlgorithmConfig")
        for base in node.bases
    )


def builder_boilerplate(source: str, names: set[str]) -> Counter:
    """How often `source` names each of `names` in hand-written builder code.

    Builder code: the body of a class deriving from `AlgorithmConfig`, and any function
    with a parameter defaulting to `NotProvided` (a builder written out by hand). In it,
    an occurrence of a setting is any of:
    - a function parameter named after it (`n_groups: int | None = NotProvided`);
    - a keyword argument named after it whose value is a bare variable
      (`_set(n_groups=n_groups)`, `self._set(llm_model=model)`);
    - a string constant naming it, as a call's argument (`_set("n_groups", n_groups)`,
      `setattr(self, "n_groups", value)`);
    - an entry for it in an `Args:`/`Attributes:` section of a docstring in that code.
    Passing a setting on as a value (`TokenRows(history_window=self.history_window)`)
    is not counted; a settings group's declaration is never builder code.
    """
    counts, tree = Counter(), ast.parse(source)
    scopes = [node for node in ast.walk(tree) if _is_algorithm_config(node) or _takes_not_provided(node)]
    seen = set()
    for scope in scopes:
        for node in ast.walk(scope):
            if id(node) in seen:  # a builder inside a config class: counted once
                continue
            seen.add(id(node))
            if isinstance(node, ast.arg):
                counts[node.arg] += 1
            elif isinstance(node, ast.keyword) and isinstance(node.value, ast.Name):
                counts[node.arg] += 1
            elif isinstance(node, ast.Call):
                counts.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                counts.update(list(docstring_entries(ast.get_docstring(node))))
    return Counter({name: n for name, n in counts.items() if name in names})


OLD_STYLE_BUILDER = '''
class SomeConfig(AlgorithmConfig):
    def rollouts(self, *, n_groups: int | None = NotProvided, model: str | None = NotProvided):
        """How trajectories are sampled.

        Args:
            n_groups: Groups per iteration.
            model: The model.
        """
        setattr(self, "group_size", 3)
        return self._set(n_groups=n_groups, llm_model=model)
'''


def test_the_count_finds_hand_written_builders():
    counts = builder_boilerplate(OLD_STYLE_BUILDER, SETTING_NAMES)
    # n_groups: parameter, doc entry, `_set` keyword; model: parameter, doc entry (set as llm_model).
    assert counts == Counter({"n_groups": 3, "model": 2, "llm_model": 1, "group_size": 1})
    assert builder_boilerplate("def f(history_window=None):\n    return g(history_window=history_window)\n",
                               SETTING_NAMES) == Counter()


def test_no_setting_is_named_in_builder_code_outside_its_group():
    counts = Counter()
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            counts.update(builder_boilerplate(path.read_text(), SETTING_NAMES))
    assert counts == Counter(), f"settings written out by hand (declare them in their settings group): {counts}"
