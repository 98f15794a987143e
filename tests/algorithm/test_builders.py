"""Each StarPO setting is a field of a settings group the config holds, set by one builder keyword: written
out with a keyword-only signature (`NotProvided` leaves the field as it is) and documented in the builder's
docstring, and named once more in `settings_groups` for `--set`, `to_dict()` and Tune."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided

from rllib_ragen.algorithm.settings_groups import settings_of
from rllib_ragen.algorithm.starpo import StarPOConfig

BUILDERS = (
    "llm",
    "rollouts",
    "inference",
    "training",
    "reward_shaping",
    "diagnostics",
    "starpo_evaluation",
    "rollout_recording",
    "self_play",
)
SETTINGS = settings_of(StarPOConfig())


def _keyword(name: str) -> str:
    return "model" if name == "llm_model" else name  # `.llm(model=...)`: RLlib's config has its own `model`


def _own_keywords(builder: str) -> dict[str, inspect.Parameter]:
    parameters = inspect.signature(getattr(StarPOConfig, builder)).parameters
    return {name: p for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _documented_arguments(builder: str) -> set[str]:
    doc = inspect.getdoc(getattr(StarPOConfig, builder)) or ""
    return set(re.findall(r"^    (\*{0,2}\w+):", doc.partition("\nArgs:\n")[2], re.MULTILINE))


@pytest.fixture
def unchecked_groups(monkeypatch):
    """Groups that accept any value: a sentinel then shows which field a keyword sets."""
    for group in {type(value) for value in vars(StarPOConfig()).values() if dataclasses.is_dataclass(value)}:
        monkeypatch.setattr(group, "__post_init__", lambda self: None, raising=False)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_each_setting_is_set_by_exactly_one_builder_keyword(name, unchecked_groups):
    setting = SETTINGS[name]
    builders = [b for b in BUILDERS if _keyword(name) in _own_keywords(b)]
    assert len(builders) == 1, (name, builders)
    config, value = StarPOConfig(), object()
    assert getattr(config, builders[0])(**{_keyword(name): value}) is config
    assert getattr(getattr(config, setting.group), setting.field) is value
    others = {n: s for n, s in SETTINGS.items() if n != name}
    assert all(getattr(getattr(config, s.group), s.field) is not value for s in others.values())


@pytest.mark.parametrize("builder", BUILDERS)
def test_builders_take_only_settings_keyword_only_leave_unprovided_ones_and_document_each(builder):
    keywords = _own_keywords(builder)
    assert set(keywords) == {_keyword(n) for n in SETTINGS if _keyword(n) in keywords}
    assert all(p.default is NotProvided for p in keywords.values())
    assert set(keywords) <= _documented_arguments(builder), builder
    unchanged = getattr(StarPOConfig(), builder)(**dict.fromkeys(keywords, NotProvided))
    assert unchanged.to_dict() == StarPOConfig().to_dict()


def test_every_field_of_every_group_has_a_setting_name_used_once():
    config = StarPOConfig()
    fields = {(a, f.name) for a, g in vars(config).items() if dataclasses.is_dataclass(g) for f in dataclasses.fields(g)}
    assert {(s.group, s.field) for s in SETTINGS.values()} == fields and len(SETTINGS) == len(fields)
    assert not SETTINGS.keys() & {name for name in vars(config) if not name.startswith("_")} - {"gamma"}


def test_no_group_hides_a_method_or_an_rllib_setting_of_the_config():
    """A group named like a builder (`config.rollouts`) would shadow it; like an RLlib setting, replace it."""
    groups = {name for name, value in vars(StarPOConfig()).items() if dataclasses.is_dataclass(value)}
    rllib_settings = set(vars(AlgorithmConfig()))
    assert not groups & (set(dir(StarPOConfig)) | rllib_settings)


def test_unknown_or_positional_arguments_are_a_type_error():
    config = StarPOConfig()
    with pytest.raises(TypeError, match=r"llm\(\) got an unexpected keyword argument 'n_groups'"):
        config.llm(n_groups=4)
    with pytest.raises(TypeError, match=r"StarPOConfig.training\(\) got an unexpected keyword argument 'no_such'"):
        config.training(no_such=1)
    with pytest.raises(TypeError, match=r"rollouts\(\) takes 1 positional argument but 2 were given"):
        config.rollouts(8)
    assert config.rollout.n_groups == StarPOConfig().rollout.n_groups


def test_training_still_passes_rllibs_own_settings_on():
    config = StarPOConfig().training(grad_clip=3.0, shuffle_batch_per_epoch=False, gamma=0.5, actor_lr=1e-4)
    assert (config.grad_clip, config.shuffle_batch_per_epoch) == (3.0, False)
    assert (config.advantages.gamma, config.optim.actor_lr) == (0.5, 1e-4)
    assert "**kwargs" in _documented_arguments("training")
    assert inspect.signature(StarPOConfig.training).parameters["kwargs"].kind is inspect.Parameter.VAR_KEYWORD
