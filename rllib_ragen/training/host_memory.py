"""Freed host memory handed back to the OS between phases of an iteration.

glibc's allocator keeps the pages of freed heap blocks for reuse, and torch
on CPU allocates activations of a new size for every micro-batch shape: after
a warm start or an update, the process's resident set stays near its
high-water mark although little of it is live, and the next phase's peak is
added on top. `malloc_trim(0)` returns those free pages (measured in
docs/results/memory.md). Elsewhere (macOS, musl) there is nothing to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.lru_cache(maxsize=1)
def _glibc() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    return libc if hasattr(libc, "malloc_trim") else None


def release_freed_memory() -> bool:
    """Returns the heap's free pages to the OS; True when some were released (False without glibc)."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))
