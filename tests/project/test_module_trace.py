"""`benchmarks/module_trace.py` names the project modules a call runs, and only those."""

from __future__ import annotations

from pathlib import Path

from run_helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
module_trace = load_script(ROOT / "benchmarks" / "module_trace.py")


def test_module_of_names_project_modules_only():
    assert module_trace.module_of(str(ROOT / "rllib_ragen" / "training" / "learner.py")) == "rllib_ragen.training.learner"
    assert module_trace.module_of(str(ROOT / "rllib_ragen" / "models" / "__init__.py")) == "rllib_ragen.models"
    assert module_trace.module_of(str(ROOT / "envs" / "sokoban.py")) == "envs.sokoban"
    assert module_trace.module_of("/usr/lib/python3.11/json/decoder.py") is None


def test_traced_modules_sees_the_calls_inside_the_block_and_none_after():
    from envs.base import parse_literal
    from rllib_ragen.intervals import wilson_interval

    with module_trace.traced_modules() as seen:
        wilson_interval(3, 4)
    parse_literal("1")  # after the block: not recorded
    assert seen == {"rllib_ragen.intervals"}


def test_in_package_splits_the_package_from_the_envs():
    modules = ["envs.base", "rllib_ragen", "rllib_ragen.logits", "rllib_ragen_extra.x", "envs_more.y"]
    assert module_trace.in_package(modules, "rllib_ragen") == ["rllib_ragen", "rllib_ragen.logits"]
    assert module_trace.in_package(modules, "envs") == ["envs.base"]
