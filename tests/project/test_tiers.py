"""The two tiers of the README's test commands: `pytest` (the fast tier) and `pytest --slow-tier`
(the tests marked slow, vllm or learning) split the suite in two, and a test marked `vllm` skips
without vllm, except under CI, where it fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

# Loaded into the collecting pytest (-p): every collected test id, before the tiers' selection
# (tryfirst) and after it, with the tier markers of each.
PROBE = '''
import json, os
import pytest

_COLLECTED = []

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    _COLLECTED.extend(item.nodeid for item in items)

def pytest_collection_finish(session):
    kept = {
        item.nodeid: sorted(m for m in ("slow", "vllm", "learning") if item.get_closest_marker(m))
        for item in session.items
    }
    with open(os.environ["TIERS_PROBE_OUT"], "w") as out:
        json.dump({"collected": _COLLECTED, "kept": kept}, out)
'''


def _collect_both_tiers(tmp_path: Path) -> dict[str, dict]:
    """`python -m pytest --collect-only -q` and the same with --slow-tier, in parallel, from the checkout."""
    (tmp_path / "tiers_probe.py").write_text(PROBE)
    processes = {}
    for tier, extra in (("fast", []), ("slow", ["--slow-tier"])):
        env = {
            **os.environ,
            "TIERS_PROBE_OUT": str(tmp_path / f"{tier}.json"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        }
        processes[tier] = subprocess.Popen(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "tiers_probe",
             *extra],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
    runs = {}
    for tier, process in processes.items():
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, output[-3000:]
        runs[tier] = {**json.loads((tmp_path / f"{tier}.json").read_text()), "output": output}
    return runs


def test_the_tiers_split_the_suite_and_the_learning_tests_are_slow(tmp_path):
    runs = _collect_both_tiers(tmp_path)
    suite = set(runs["fast"]["collected"])
    assert set(runs["slow"]["collected"]) == suite and len(suite) == len(runs["fast"]["collected"])
    fast, slow = runs["fast"]["kept"], runs["slow"]["kept"]
    assert fast and slow
    assert set(fast).isdisjoint(slow)
    assert set(fast) | set(slow) == suite
    # Each tier is what its markers say; the rest of the suite is reported as deselected.
    assert all(markers == [] for markers in fast.values())
    assert all(markers != [] for markers in slow.values())
    for tier, kept in (("fast", fast), ("slow", slow)):
        assert f"{len(kept)}/{len(suite)} tests collected ({len(suite) - len(kept)} deselected)" in runs[tier]["output"]
    learning = {test for test in suite if test.startswith("tests/learning/")}
    assert learning and learning <= set(slow)
    assert "tests/project/test_tiers.py::test_the_tiers_split_the_suite_and_the_learning_tests_are_slow" in fast


def test_no_test_skips_on_a_missing_package_by_itself():
    """conftest's `require_extra` is the only gate of an optional package (the `vllm` marker calls it):
    a skip of a test's own would pass in CI."""
    for path in sorted(Path(__file__).resolve().parents[1].rglob("test_*.py")):
        text = path.read_text()
        for own_gate in ("importorskip(", "find_spec("):
            assert own_gate not in text or path == Path(__file__).resolve(), (path.name, own_gate)


def _run_marked_test(tmp_path: Path, ci: str | None, *args: str) -> subprocess.CompletedProcess:
    """A one-test suite with this conftest, where `import vllm` fails, run in a new pytest."""
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: s\n    vllm: v\n    learning: l\n")
    (tmp_path / "vllm.py").write_text('raise ImportError("this vllm cannot be imported")\n')
    (tmp_path / "test_engine.py").write_text(textwrap.dedent('''
        import pytest

        @pytest.mark.vllm
        def test_engine():
            pass

        def test_unit():
            pass
    '''))
    env = {key: value for key, value in os.environ.items() if key not in ("CI", "PYTEST_ADDOPTS")}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )


def test_a_vllm_test_without_vllm_skips_here_and_fails_under_ci(tmp_path):
    skipped = _run_marked_test(tmp_path, None, "--slow-tier")
    assert skipped.returncode == 0, skipped.stdout[-3000:]
    assert "1 skipped, 1 deselected" in skipped.stdout
    assert "needs vllm" in skipped.stdout and "this vllm cannot be imported" in skipped.stdout

    failed = _run_marked_test(tmp_path, "true", "--slow-tier")
    assert failed.returncode == 1, failed.stdout[-3000:]
    assert "1 deselected, 1 error" in failed.stdout
    assert "CI=true: needs vllm" in failed.stdout and "this vllm cannot be imported" in failed.stdout

    # The fast tier deselects it, and "false" is no CI.
    fast = _run_marked_test(tmp_path, "false")
    assert fast.returncode == 0 and "1 passed, 1 deselected" in fast.stdout, fast.stdout[-3000:]
