"""The type checker sees every builder keyword and settings group: mypy flags a misspelled or mistyped
keyword, a misspelled group field or an unannotated function in a planted file, and passes the same calls
spelled right (the negative control, in the same file)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MYPY = Path(sys.executable).with_name("mypy")
PLANTED = """from rllib_ragen.algorithm.starpo import StarPOConfig

StarPOConfig().training(actor_lrr=1e-5)
StarPOConfig().rollouts(n_groups="8")
StarPOConfig().training(actor_lr=1e-5, grad_clip=1.0).rollouts(n_groups=8, history_window=None)
StarPOConfig().llm(model="tiny-random").inference(engine="hf").starpo_evaluation(eval_size=4).diagnostics()
StarPOConfig().engine_settings.kv_blok_size
block: int | None = StarPOConfig().engine_settings.kv_block_size


def unannotated(config):
    return config.engine_settings.kv_block_size
"""


def test_mypy_flags_a_misspelled_or_mistyped_builder_keyword(tmp_path):
    planted = tmp_path / "planted_builder_calls.py"
    # A new first line each run: mypy's cache (shared with the package's check) never answers for an old file.
    planted.write_text(f"# {uuid.uuid4()}\n{PLANTED}")
    out = subprocess.run(
        # The package's own options: its check's cache (CI runs it first) serves the imports.
        [str(MYPY), "--config-file", str(REPO / "pyproject.toml"), str(planted)],
        cwd=REPO, capture_output=True, text=True, timeout=1200,
        env={**os.environ, "MYPYPATH": str(REPO)},  # this tree's rllib_ragen, not an installed one
    )
    errors: dict[int, list[str]] = {}
    for line, message in re.findall(rf"^{re.escape(str(planted))}:(\d+): error: (.*)$", out.stdout, re.MULTILINE):
        errors.setdefault(int(line), []).append(message)
    assert out.returncode == 1, out.stdout + out.stderr
    assert errors == {
        4: ['Unexpected keyword argument "actor_lrr" for "training" of "StarPOConfig"; did you mean "actor_lr"?  '
            "[call-arg]"],
        5: ['Argument "n_groups" to "rollouts" of "StarPOConfig" has incompatible type "str"; expected "int"  '
            "[arg-type]"],
        # A settings group's property is typed as its group: a misspelled field is flagged too.
        8: ['"EngineSettings" has no attribute "kv_blok_size"; maybe "kv_block_size" or "block_size"?  [attr-defined]'],
        # disallow_untyped_defs: a function must say what it takes (the package's every function does).
        12: ["Function is missing a type annotation  [no-untyped-def]"],
    }, out.stdout
