"""The type checker sees every builder keyword and settings group: mypy flags a misspelled or mistyped
keyword, a misspelled group field or an unannotated function in a planted file, and a misspelled read of a
group's field planted in copies of the package's own modules; it passes the same code spelled right (the
negative control: the rest of each file, and the package's unchanged modules)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MYPY = Path(sys.executable).with_name("mypy")
PLANTED = """from rllib_ragen.algorithm.starpo import StarPOConfig

StarPOConfig().training(actor_lrr=1e-5)
StarPOConfig().rollouts(n_groups="8")
StarPOConfig().training(actor_lr=1e-5, grad_clip=1.0).rollouts(n_groups=8, history_window=None)
StarPOConfig().llm(model="tiny-random").inference(engine="hf").starpo_evaluation(eval_size=4).diagnostics()
StarPOConfig().rollout_engine.kv_blok_size
block: int | None = StarPOConfig().rollout_engine.kv_block_size


def unannotated(config):
    return config.rollout_engine.kv_block_size
"""
# A misspelled field read planted in a copy of a package module: (module, correct read, misspelled read).
TYPOS = {
    "validation": ("rllib_ragen/algorithm/validation.py", "config.rollout.response_length", "config.rollout.response_lenght"),
    "sampler_factory": (
        "rllib_ragen/algorithm/group_sampling/sampler_factory.py",
        "config.async_rollout.async_rollouts",
        "config.async_rollout.async_rollout",
    ),
}


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory) -> dict[str, dict[int, list[str]]]:
    """One mypy run over the planted files: file stem -> line -> its errors."""
    tmp = tmp_path_factory.mktemp("planted")
    # A new first line each run: mypy's cache (shared with the package's check) never answers for an old file.
    files = {"planted_builder_calls": f"# {uuid.uuid4()}\n{PLANTED}"}
    for name, (module, right, wrong) in TYPOS.items():
        source = (REPO / module).read_text()
        assert right in source, f"{module} no longer reads {right}: plant the typo elsewhere"
        files[f"planted_{name}"] = f"# {uuid.uuid4()}\n" + source.replace(right, wrong, 1)
    for stem, text in files.items():
        (tmp / f"{stem}.py").write_text(text)
    out = subprocess.run(
        # The package's own options: its check's cache (CI runs it first) serves the imports.
        [str(MYPY), "--config-file", str(REPO / "pyproject.toml"), *(str(tmp / f"{stem}.py") for stem in files)],
        cwd=REPO, capture_output=True, text=True, timeout=1200,
        env={**os.environ, "MYPYPATH": str(REPO)},  # this tree's rllib_ragen, not an installed one
    )
    assert out.returncode == 1, out.stdout + out.stderr
    errors: dict[str, dict[int, list[str]]] = {stem: {} for stem in files}
    for stem, line, message in re.findall(rf"^{re.escape(str(tmp))}/(\w+)\.py:(\d+): error: (.*)$", out.stdout, re.M):
        errors[stem].setdefault(int(line), []).append(message)
    return errors


def test_mypy_flags_a_misspelled_or_mistyped_builder_keyword(mypy_errors):
    assert mypy_errors["planted_builder_calls"] == {
        4: ['Unexpected keyword argument "actor_lrr" for "training" of "StarPOSettings"; did you mean "actor_lr"?  '
            "[call-arg]"],
        5: ['Argument "n_groups" to "rollouts" of "StarPOSettings" has incompatible type "str"; expected "int"  '
            "[arg-type]"],
        # A settings group is typed: a misspelled field is flagged too.
        8: ['"EngineSettings" has no attribute "kv_blok_size"; maybe "kv_block_size" or "block_size"?  [attr-defined]'],
        # disallow_untyped_defs: a function must say what it takes (the package's every function does).
        12: ["Function is missing a type annotation  [no-untyped-def]"],
    }


@pytest.mark.parametrize("name", sorted(TYPOS))
def test_mypy_flags_a_misspelled_group_field_read_inside_the_package(name, mypy_errors):
    module, _, wrong = TYPOS[name]
    line = 1 + next(i for i, text in enumerate((REPO / module).read_text().splitlines(), 1) if TYPOS[name][1] in text)
    group, typo = wrong.split(".")[1:]
    (messages,) = mypy_errors[f"planted_{name}"].values()
    assert list(mypy_errors[f"planted_{name}"]) == [line]
    assert len(messages) == 1 and re.match(rf'"\w+Settings" has no attribute "{typo}"', messages[0]), messages
