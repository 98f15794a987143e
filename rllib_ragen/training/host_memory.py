"""Host memory of the learner's process: freed pages handed back between phases, and each phase's peak.

glibc's allocator keeps the pages of freed heap blocks for reuse, and torch
on CPU allocates activations of a new size for every micro-batch shape: after
a warm start or an update, the process's resident set stays near its
high-water mark although little of it is live, and the next phase's peak is
added on top. `malloc_trim(0)` returns those free pages (measured in
docs/results/memory.md). Elsewhere (macOS, musl) there is nothing to do.

`phase_peak` measures the resident set's high-water mark (VmHWM) of one
phase: Linux resets it on request (`/proc/self/clear_refs`), so the peak of
each phase of an iteration (rollout, update, weight sync, evaluation) is its
own, not the largest so far. Elsewhere it measures nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_PROC = Path("/proc/self")


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


def peak_resident_bytes() -> int | None:
    """The process's resident-set high-water mark since start or the last reset (None off Linux)."""
    try:
        status = (_PROC / "status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # reported in kB
    return None


def reset_peak_resident() -> bool:
    """Starts a new high-water mark at the current resident set; False where Linux does not allow it."""
    try:
        (_PROC / "clear_refs").write_text("5")  # 5: reset the peak resident set size (proc(5))
    except OSError:
        return False
    return True


@contextlib.contextmanager
def phase_peak() -> Iterator[dict[str, int]]:
    """Measures the peak resident set of the block: `{"bytes": peak}` once it ends (empty off Linux)."""
    out: dict[str, int] = {}
    measurable = reset_peak_resident()
    try:
        yield out
    finally:
        peak = peak_resident_bytes() if measurable else None
        if peak is not None:
            out["bytes"] = peak
