"""Shared fixtures: offline Hugging Face, and the tiny random model built once per session."""

from __future__ import annotations

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
        out = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--ignored"],
                             check=True, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {line for line in out.splitlines() if not any(part in line for part in _CACHE_PARTS)}


def pytest_sessionstart(session: pytest.Session) -> None:
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
    from rllib_ragen.rollout.prompt.chat_template import ChatTemplate

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
