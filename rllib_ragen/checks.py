"""Argument checks shared by every settings group: each raises ValueError naming the setting."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def check_choice(name: str, value: Any, allowed: Iterable[Any]) -> None:
    """Raises ValueError unless `value` is one of `allowed`."""
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def check_positive(name: str, value: float) -> None:
    """Raises ValueError unless `value` > 0."""
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def check_at_least_one(group: object, *names: str) -> None:
    """Raises ValueError unless each field `names` of `group` is >= 1."""
    for name in names:
        if int(getattr(group, name)) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(group, name)}")
