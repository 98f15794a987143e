"""What this machine computes fast: bfloat16 matrix units, detected rather than assumed.

bfloat16 pays off on CPUs with AMX (`amx_bf16`) or AVX-512 BF16 (`avx512_bf16`)
and on GPUs that support it; elsewhere the CPU emulates it and float32 is
faster. The CPU preset picks its learner autocast and engine dtype from this.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The feature flags of the first CPU in /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    return frozenset(_first_cpu_field("flags", cpuinfo).split())


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name from /proc/cpuinfo with its family and model numbers where it gives them, e.g.
    "AMD EPYC (family 23, model 1)" ("unknown CPU" where there is none): a virtual machine's name alone
    hides the generation (Zen 2 and Zen 4 are both "AMD EPYC")."""
    name = _first_cpu_field("model name", cpuinfo) or "unknown CPU"
    family, model = _first_cpu_field("cpu family", cpuinfo), _first_cpu_field("model", cpuinfo)
    return f"{name} (family {family}, model {model})" if family and model else name


def _first_cpu_field(name: str, cpuinfo: str | None) -> str:
    """The value of the first `name: value` line of /proc/cpuinfo (or of `cpuinfo`); "" where there is none."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.is_file() else ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return ""


@functools.lru_cache(maxsize=1)
def fast_bf16() -> bool:
    """True when bfloat16 matmuls run natively: a bf16-capable GPU, or a CPU with AMX / AVX-512 BF16."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return any(flag in cpu_flags() for flag in BF16_CPU_FLAGS)
