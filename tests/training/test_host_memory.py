"""Freed heap pages go back to the OS: the resident set falls once they are released; and each
phase's peak resident set is its own."""

import ctypes

import torch

from rllib_ragen.training.host_memory import _glibc, phase_peak, release_freed_memory

BLOCK = 64 * 1024  # below glibc's mmap threshold: from the heap, kept there once freed
BLOCKS = 4096  # 256 MiB


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_released_heap_pages_leave_the_resident_set():
    libc = _glibc()
    assert libc is not None, "this test needs glibc (Linux)"
    libc.malloc.restype = ctypes.c_void_p
    blocks = [libc.malloc(BLOCK) for _ in range(BLOCKS)]
    for block in blocks:
        ctypes.memset(block, 1, BLOCK)  # touch every page
    for block in blocks[:-1]:  # the last block pins the heap's top, so free() alone trims nothing
        libc.free(ctypes.c_void_p(block))
    held = _resident_bytes()
    assert release_freed_memory()
    released = _resident_bytes()
    libc.free(ctypes.c_void_p(blocks[-1]))
    assert held - released > 200 * 2**20, (held, released)


def test_each_phase_reports_its_own_peak():
    """A phase that touches 400 MiB peaks at least that far above the resident set it started from; the
    next phase, which allocates nothing, peaks near its own start: a peak that were not reset per
    phase would still show the first phase's."""
    with phase_peak() as busy:
        start = _resident_bytes()
        block = torch.ones(100 * 2**20, dtype=torch.float32)  # 400 MiB, every page touched
        del block
    release_freed_memory()
    with phase_peak() as idle:
        idle_start = _resident_bytes()
    assert busy["bytes"] - start > 380 * 2**20, (busy, start)
    assert idle["bytes"] - idle_start < 50 * 2**20, (idle, idle_start)
    assert busy["bytes"] - idle["bytes"] > 300 * 2**20, (busy, idle)
