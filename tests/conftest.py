"""Shared fixtures: offline Hugging Face, and the tiny random model built once per session; the two
test tiers (`--slow-tier`); the gate of optional packages such as vLLM for the tests marked `vllm`
(a skip here, a failure under CI)."""

from __future__ import annotations

import functools
import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import hypothesis
import hypothesis.configuration
import pytest

# Nothing in the test suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Hypothesis keeps its example database and caches out of the checkout (the suite must leave it
# as it found it): no database, and its storage directory (constants, unicode data) in a temp dir.
hypothesis.settings.register_profile("hermetic", database=None)
hypothesis.settings.load_profile("hermetic")
hypothesis.configuration.set_hypothesis_home_dir(tempfile.mkdtemp(prefix="hypothesis-"))

REPO = Path(__file__).resolve().parents[1]
# Left by any Python run, and ignored for that reason.
_CACHE_PARTS = ("__pycache__", ".pytest_cache")
_BEFORE = pytest.StashKey[set | None]()


def _untracked_and_ignored() -> set[str] | None:
    """`git status --porcelain --ignored` entries of the checkout, without caches; None outside git."""
    try:
        # --no-optional-locks: a status that times out (a loaded machine) must not leave .git/index.lock behind.
        out = subprocess.run(["git", "--no-optional-locks", "-C", str(REPO), "status", "--porcelain", "--ignored"],
                             check=True, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {line for line in out.splitlines() if not any(part in line for part in _CACHE_PARTS)}


def _xdist_worker(config: pytest.Config) -> bool:
    """Under pytest-xdist (`-n 2`), whether this process is a worker: only the controller, which starts
    before and ends after every worker, checks the checkout (a worker would see the others' files)."""
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _xdist_worker(session.config):
        session.config.stash[_BEFORE] = _untracked_and_ignored()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite is hermetic: it fails if it left files in the checkout (git status, ignored ones too)."""
    before, after = session.config.stash.get(_BEFORE, None), _untracked_and_ignored()
    if before is None or after is None or session.config.option.collectonly:
        return
    left = sorted(after - before)
    if left:
        print("\nthe test suite left files in the checkout:\n  " + "\n  ".join(left), file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ---------------------------------------------------------------------- the two tiers
# A test marked with any of these belongs to the slow tier (pyproject.toml describes each marker).
SLOW_TIER_MARKERS = ("slow", "vllm", "learning")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow-tier", action="store_true", default=False,
        help="run the slow tier only: the tests marked slow, vllm or learning (which the default, "
             "fast tier deselects). A -m expression selects within the tier.",
    )


def in_slow_tier(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(marker) for marker in SLOW_TIER_MARKERS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keeps one tier: by default the tests without a slow-tier marker, with --slow-tier those with one.
    The others are reported as deselected (not skipped)."""
    slow_tier = config.getoption("--slow-tier")
    kept = [item for item in items if in_slow_tier(item) == slow_tier]
    if len(kept) < len(items):
        kept_ids = {id(item) for item in kept}
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept_ids])
        items[:] = kept


# ---------------------------------------------------------------------- optional packages
def running_in_ci() -> bool:
    """CI sets CI (GitHub Actions, GitLab, ... set CI=true); "", "0", "false" and "no" mean not CI."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@functools.cache
def _import_error(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as error:  # not installed, or an install that cannot be imported
        return f"{type(error).__name__}: {error}"
    return None


def require_extra(module: str, extras: str) -> None:
    """The one gate of every test that needs an optional package: skips the test (or, called at module
    level, the module) where `module` cannot be imported, except under CI, where that fails it
    (.ci/run installs every extra the tests need; a skip there would hide a broken install).

    Args:
        module: What the test imports, e.g. "textarena".
        extras: The install.sh extras that bring it, e.g. "cpu,test,textarena".
    """
    error = _import_error(module)
    if error is None:
        return
    message = f"needs {module} (bash scripts/install.sh {extras}), which cannot be imported: {error}"
    if running_in_ci():
        pytest.fail(f"CI={os.environ['CI']}: {message}", pytrace=False)
    pytest.skip(message, allow_module_level=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked `vllm` pass the gate before any of their fixtures (engine pools, algorithms) is built."""
    if item.get_closest_marker("vllm"):
        require_extra("vllm", "cpu,test")


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    """A built `tiny-random` model directory (SmolLM2's tokenizer, random tiny weights)."""
    from rllib_ragen.models import resolve_model

    return resolve_model("tiny-random", cache_dir=tmp_path_factory.mktemp("model_cache"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path):
    from rllib_ragen.models import load_tokenizer

    return load_tokenizer(tiny_model_path)


@pytest.fixture(scope="session")
def chat_template(tiny_tokenizer):
    from rllib_ragen.rollout.prompt.token_history import ChatTemplate

    return ChatTemplate.from_tokenizer(tiny_tokenizer)


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray for the tests of one module, shut down after them (tests ask for it by name)."""
    import gc

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    # Offline data of finished tests still holds an open Ray Data iterator: close it while Ray is up.
    gc.collect()
    ray.shutdown()
