"""Env registry: names -> factories with default config.

Adding an env is one call:

    register_env("my_env", MyTextEnv, max_steps=20)
    env = make_env("my_env", max_steps=30)

The registry lives in the process that imports it: register custom envs in a
module that every Ray worker imports too (or at the top of the driver script
that the workers re-import), not interactively.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from envs.bandit import BanditEnv
from envs.base import TextEnv, config_field_names
from envs.corridor import CorridorEnv
from envs.countdown import CountdownEnv
from envs.frozenlake import FrozenLakeEnv
from envs.sokoban import SokobanEnv

EnvFactory = Callable[..., TextEnv]


@dataclasses.dataclass(frozen=True)
class _Entry:
    factory: EnvFactory
    default_config: dict[str, Any]
    accepted_keys: tuple[str, ...] | None  # None: the factory takes **kwargs


_REGISTRY: dict[str, _Entry] = {}


def register_env(
    name: str, factory: EnvFactory, *, overwrite: bool = False, **default_config: Any
) -> None:
    """Registers `factory` under `name` with `default_config` as its defaults.

    Args:
        name: the env's name for `make_env` and configs.
        factory: a TextEnv subclass, or any callable returning a TextEnv; it is
            called with the merged config as keyword arguments.
        overwrite: replace an existing entry instead of raising ValueError.
        default_config: config keys this name sets (checked against the factory now).
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"env name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise TypeError(f"factory for {name!r} must be a TextEnv subclass or a callable")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"env {name!r} is already registered; pass overwrite=True to replace it")
    accepted = accepted_config_keys(factory)
    _check_keys(name, default_config, accepted)
    _REGISTRY[name] = _Entry(factory, dict(default_config), accepted)


def make_env(name: str, **config: Any) -> TextEnv:
    """A new env registered as `name`, with `config` overriding its defaults.

    Raises KeyError for an unknown name (listing the known ones) and TypeError
    for a config key the env does not accept (listing the accepted ones).
    """
    if name not in _REGISTRY:
        raise KeyError(f"unknown env {name!r}; registered envs: {list_envs()}")
    entry = _REGISTRY[name]
    _check_keys(name, config, entry.accepted_keys)
    env = entry.factory(**{**entry.default_config, **config})
    if not isinstance(env, TextEnv):
        raise TypeError(f"factory for {name!r} returned {type(env).__name__}, not a TextEnv")
    return env


def list_envs() -> list[str]:
    """Registered env names, sorted."""
    return sorted(_REGISTRY)


def accepted_config_keys(factory: EnvFactory) -> tuple[str, ...] | None:
    """Config keys `factory` accepts, or None if it takes arbitrary **kwargs.

    A TextEnv with a `config_class` accepts that dataclass's fields; any other
    callable accepts its keyword parameters.
    """
    config_class = getattr(factory, "config_class", None)
    if isinstance(factory, type) and issubclass(factory, TextEnv) and config_class is not None:
        return config_field_names(config_class)
    params = inspect.signature(factory).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in params if p.kind in kinds)


def _check_keys(name: str, config: dict[str, Any], accepted: tuple[str, ...] | None) -> None:
    unknown = sorted(set(config) - set(accepted)) if accepted is not None else []
    if unknown:
        raise TypeError(
            f"env {name!r} does not accept config key(s) {unknown}; "
            f"accepted keys: {list(accepted)}"
        )


def _register_builtins() -> None:
    register_env("sokoban", SokobanEnv, dim_room=(6, 6), num_boxes=1, max_steps=100)
    register_env("larger_sokoban", SokobanEnv, dim_room=(8, 8), num_boxes=2, max_steps=100)
    register_env("frozenlake", FrozenLakeEnv)
    register_env("bandit", BanditEnv, low_arm="Phoenix", high_arm="Dragon")
    register_env("bandit_test", BanditEnv, low_arm="Trader", high_arm="Librarian")
    register_env("countdown", CountdownEnv)
    register_env("corridor", CorridorEnv)


_register_builtins()
