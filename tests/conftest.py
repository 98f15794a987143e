"""Shared fixtures: offline Hugging Face, and the tiny random model built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Nothing in the test suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
    from rllib_ragen.connectors.chat_template import ChatTemplate

    return ChatTemplate.from_tokenizer(tiny_tokenizer)


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray for the tests of one module, shut down after them (tests ask for it by name)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
