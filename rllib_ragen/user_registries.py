"""Name -> function registries that users extend (advantage estimators, token mask policies)."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping


def add_to_registry(
    registry: MutableMapping[str, Callable], kind: str, name: str, entry: Callable, *, overwrite: bool
) -> None:
    """Adds `entry` under `name`; `kind` names the registry in the errors (e.g. "advantage estimator")."""
    if name in registry and not overwrite:
        raise ValueError(f"{kind} {name!r} already exists; pass overwrite=True to replace it")
    if not callable(entry):
        raise TypeError(f"{kind} {name!r} must be callable, got {type(entry).__name__}")
    registry[name] = entry
