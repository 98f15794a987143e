"""CPU feature detection for the bf16 levers."""

from __future__ import annotations

import pytest

from rllib_ragen import hardware
from rllib_ragen.algorithm.presets import cpu_preset
from rllib_ragen.hardware import cpu_flags


def test_cpu_flags_are_read_from_cpuinfo():
    cpuinfo = "processor\t: 0\nflags\t\t: fpu sse avx512_bf16 amx_tile\nbugs\t\t: spectre\n"
    assert {"avx512_bf16", "amx_tile"} <= cpu_flags(cpuinfo)
    assert cpu_flags("no flags here") == frozenset()


@pytest.mark.parametrize(("native_bf16", "expected"), [(True, "bfloat16"), (False, "float32")])
def test_cpu_preset_computes_in_bf16_only_where_the_cpu_has_it(monkeypatch, native_bf16, expected):
    """Without AMX / AVX-512 BF16 (e.g. an AVX2-only EPYC) learner and engine stay float32, never emulated bf16."""
    monkeypatch.setattr(hardware, "fast_bf16", lambda: native_bf16)
    config = cpu_preset("sokoban")
    assert (config.rollout_engine.dtype, config.scoring.autocast_dtype or "float32", config.llm_module.dtype) == (expected, expected, "float32")


def test_cpu_model_and_flags_come_from_the_first_cpu_of_cpuinfo():
    from rllib_ragen.hardware import cpu_flags, cpu_model

    info = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nmodel name\t: other\n"
    assert cpu_model(info) == "AMD EPYC" and cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    # KVM names Zen 2 and Zen 4 alike: the family and model numbers tell them apart.
    numbered = "processor\t: 0\ncpu family\t: 23\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
    assert cpu_model(numbered) == "AMD EPYC (family 23, model 1)"
    assert cpu_model("") == "unknown CPU" and cpu_flags("") == frozenset()


@pytest.mark.parametrize(
    ("native_bf16", "budget", "noted"), [(False, 27.0, True), (True, 27.0, False), (False, None, False)]
)
def test_a_job_budget_on_a_cpu_without_fast_bf16_is_noted(monkeypatch, native_bf16, budget, noted):
    """The tuned jobs' budgets assume AMX / AVX-512 BF16: elsewhere the console says so before the warm start."""
    from rllib_ragen.run.experiment import slow_bf16_notice

    monkeypatch.setattr(hardware, "fast_bf16", lambda: native_bf16)
    monkeypatch.setattr(hardware, "cpu_model", lambda: "AMD EPYC")
    notice = slow_bf16_notice(budget)
    assert (notice is not None) == noted
    if noted:
        assert notice.startswith("note: this CPU, AMD EPYC, has no AMX or AVX-512 BF16, so training computes in")
        assert "27-minute job budget" in notice and "--job-budget-min" in notice
