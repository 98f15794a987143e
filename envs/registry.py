"""Env registry: names -> factories with default config, and import paths.

An env is named in one of two ways wherever a config takes an env:

- a registered name: `register_env("my_env", MyTextEnv, max_steps=20)`, then
  `make_env("my_env", max_steps=30)`. The registry lives in the process that
  registered it, so a name registered by user code exists there only;
- an import path `"module:Attribute"` (e.g. `"my_envs:MyTextEnv"`): any
  process imports `module` and calls `Attribute` (a TextEnv subclass or a
  factory) with the env config. This is how a custom env reaches remote env
  runners, Tune trials and Ray Jobs: the name is a plain string that travels
  in the config (and in MLflow params and checkpoints), and every Ray worker
  can import what the driver can (Ray puts the driver's working directory, and
  a job's `working_dir`, on the workers' `sys.path`);
- a scheme name `"scheme:rest"` for envs from another ecosystem, built by that
  scheme's adapter: `"textarena:GuessTheNumber-v0"` (a TextArena game,
  `envs.textarena`) or `"openenv:http://127.0.0.1:8000"` (an OpenEnv server,
  `envs.openenv_client`). Like import paths, these are plain strings every
  process resolves for itself; the adapter is imported only when its scheme is
  used, so its optional dependency is needed only then.

The built-in names are registered when `envs` is imported, in every process.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from envs.bandit import (
    PHOENIX_DRAGON,
    TEST_PAIRS,
    TRAIN_PAIRS,
    V1_LOW_PAYOFF,
    BanditEnv,
)
from envs.base import TextEnv, build_config, config_field_names
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
_IMPORT_SEPARATOR = ":"
# Scheme -> "module:function" of its resolver: rest of the name -> (factory, default config).
_SCHEMES: dict[str, str] = {
    "textarena": "envs.textarena:resolve_game",
    "openenv": "envs.openenv_client:resolve_server",
}


def register_env(name: str, factory: EnvFactory, *, overwrite: bool = False, **default_config: Any) -> None:
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
    if is_import_path(name):
        raise ValueError(f"env name {name!r} contains {_IMPORT_SEPARATOR!r}, which marks import paths (module:Class)")
    if not callable(factory):
        raise TypeError(f"factory for {name!r} must be a TextEnv subclass or a callable")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"env {name!r} is already registered; pass overwrite=True to replace it")
    accepted = accepted_config_keys(factory)
    _check_keys(name, default_config, accepted)
    _REGISTRY[name] = _Entry(factory, dict(default_config), accepted)


def make_env(name: str, **config: Any) -> TextEnv:
    """A new env named `name` (registered, or `"module:Attribute"`), with `config` overriding its defaults.

    Raises KeyError for an unknown name or an import path that does not
    import (naming what is missing) and TypeError for a config key the env
    does not accept (listing the accepted ones).
    """
    entry = _entry(name)
    _check_keys(name, config, entry.accepted_keys)
    env = entry.factory(**{**entry.default_config, **config})
    if not isinstance(env, TextEnv):
        raise TypeError(f"factory for {name!r} returned {type(env).__name__}, not a TextEnv")
    return env


def check_env(name: str, *, in_other_processes: bool = False) -> None:
    """Raises ValueError unless `name` is an env `make_env` can build here
    and, with `in_other_processes`, also in a fresh Ray worker process.

    A name registered by user code (not a built-in) exists only in the process
    that registered it: remote env runners and Tune trials would not know it.
    """
    try:
        _entry(name)
    except KeyError as error:
        raise ValueError(error.args[0]) from None
    if in_other_processes and not (is_import_path(name) or name in _BUILTINS):
        raise ValueError(
            f"env {name!r} is registered in this process only, so remote env runners and Tune trials, which "
            "start without it, cannot build it: name it by import path instead, e.g. "
            "environment('my_module:MyEnv') (my_module.py on the workers' path: the working directory or "
            "PYTHONPATH)"
        )


def check_env_config(name: str, env_config: dict[str, Any]) -> None:
    """Raises ValueError unless env `name` accepts `env_config`, without building the env.

    The keys are checked against the factory; a TextEnv with a `config_class`
    also gets that dataclass built from its defaults and `env_config`, which runs
    its checks (the env itself, its levels and solvers, is not made).
    """
    entry = _entry(name)
    config = {**entry.default_config, **env_config}
    try:
        _check_keys(name, dict(env_config), entry.accepted_keys)
        config_class = getattr(entry.factory, "config_class", None)
        if isinstance(entry.factory, type) and issubclass(entry.factory, TextEnv) and config_class is not None:
            build_config(config_class, None, config)
    except (TypeError, ValueError) as error:
        raise ValueError(f"env {name!r} rejects env_config {dict(env_config)}: {error}") from error


def is_import_path(name: str) -> bool:
    """`name` is a `"module:Attribute"` import path rather than a registered name."""
    return _IMPORT_SEPARATOR in name


def _entry(name: str) -> _Entry:
    if not isinstance(name, str) or not name:
        raise KeyError(f"env name must be a non-empty string, got {name!r}")
    if name in _REGISTRY:
        return _REGISTRY[name]
    if not is_import_path(name):
        raise KeyError(f"unknown env {name!r}; registered envs: {list_envs()} (or give an import path, module:Class)")
    scheme, _, rest = name.partition(_IMPORT_SEPARATOR)
    if scheme in _SCHEMES:
        return _scheme_entry(scheme, rest)
    return _import_entry(name)


def _scheme_entry(scheme: str, rest: str) -> _Entry:
    """The env `rest` names in `scheme`'s ecosystem, via the scheme's adapter (imported now)."""
    module_name, _, function = _SCHEMES[scheme].partition(_IMPORT_SEPARATOR)
    resolve = getattr(importlib.import_module(module_name), function)
    factory, default_config = resolve(rest)
    return _Entry(factory, dict(default_config), accepted_config_keys(factory))


def _import_entry(path: str) -> _Entry:
    """The factory at `"module:Attribute"` (dots allowed in both), imported now."""
    module_name, _, attribute = path.partition(_IMPORT_SEPARATOR)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise KeyError(f"unknown env {path!r}: cannot import module {module_name!r} ({error})") from None
    factory: Any = module
    for part in attribute.split("."):
        if not hasattr(factory, part):
            raise KeyError(f"unknown env {path!r}: module {module_name!r} has no attribute {attribute!r}")
        factory = getattr(factory, part)
    if not callable(factory):
        raise KeyError(f"unknown env {path!r}: {attribute!r} is a {type(factory).__name__}, not an env class")
    return _Entry(factory, {}, accepted_config_keys(factory))


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
    if accepted is None:
        return
    unknown = sorted(set(config) - set(accepted))
    if unknown:
        raise TypeError(f"env {name!r} does not accept config key(s) {unknown}; accepted keys: {list(accepted)}")


def _register_builtins() -> None:
    register_env("sokoban", SokobanEnv, dim_room=(6, 6), num_boxes=1, max_steps=100)
    register_env("larger_sokoban", SokobanEnv, dim_room=(8, 8), num_boxes=2, max_steps=100)
    register_env("sokoban_new_vocab", SokobanEnv, dim_room=(6, 6), num_boxes=1, max_steps=100, grid_vocabulary="new")
    register_env("frozenlake", FrozenLakeEnv)
    # RAGEN-2's bandit: train on its profession pairs, evaluate on the held-out ones.
    register_env("bandit", BanditEnv, arm_pairs=TRAIN_PAIRS)
    register_env("bandit_test", BanditEnv, arm_pairs=TEST_PAIRS)
    # RAGEN v1's Bandit and BanditRev: Phoenix/Dragon, then the same names with the roles swapped.
    register_env("bandit_phoenix_dragon", BanditEnv, arm_pairs=PHOENIX_DRAGON, low_payoff=V1_LOW_PAYOFF)
    register_env(
        "bandit_rev", BanditEnv, arm_pairs=tuple((high, low) for low, high in PHOENIX_DRAGON), low_payoff=V1_LOW_PAYOFF
    )
    register_env("countdown", CountdownEnv)
    register_env("corridor", CorridorEnv)


_register_builtins()
_BUILTINS = frozenset(_REGISTRY)
