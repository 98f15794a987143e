"""CPU feature detection for the bf16 levers."""

from __future__ import annotations

from rllib_ragen.run.hardware import cpu_flags


def test_cpu_flags_are_read_from_cpuinfo():
    cpuinfo = "processor\t: 0\nflags\t\t: fpu sse avx512_bf16 amx_tile\nbugs\t\t: spectre\n"
    assert {"avx512_bf16", "amx_tile"} <= cpu_flags(cpuinfo)
    assert cpu_flags("no flags here") == frozenset()
