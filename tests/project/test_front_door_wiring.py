"""Every entry point goes through the one converter of bad input (`envs.user_errors.front_door`), and
nothing else writes an `error:` line: a grep of the sources, no import."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONVERTER = ROOT / "envs" / "user_errors.py"
# The commands: every script under these folders, and the modules behind `rllib-ragen` and the OpenEnv server.
ENTRY_FOLDERS = ("rllib_ragen/run", "tuned_examples", "benchmarks")
ENTRY_MODULES = ("rllib_ragen/cli.py", "rllib_ragen/models/models_cli.py", "envs/openenv_server.py")
# Benchmarks that take no path (nor a model): their flags are numbers and names only.
BENCHMARKS_WITHOUT_PATHS = ("freed_memory", "group_randomness", "prefix_cache_blocks", "process_memory",
                            "textarena_games", "token_sampling")
MAIN_IS_WRAPPED = re.compile(r"^@front_door\n(?:@.*\n)*def main\(", re.M)
IMPORTED_MAIN = re.compile(r"^from ([\w.]+) import main$", re.M)
OWN_ERROR_LINE = re.compile(r"""["']error: |parser\.exit\(|sys\.exit\(2\)""")


def _entry_points() -> list[Path]:
    scripts = [
        path for folder in ENTRY_FOLDERS for path in sorted((ROOT / folder).glob("*.py"))
        if 'if __name__ == "__main__":' in path.read_text() and path.stem not in BENCHMARKS_WITHOUT_PATHS
    ]
    return scripts + [ROOT / module for module in ENTRY_MODULES]


def _goes_through_the_converter(path: Path) -> bool:
    text = path.read_text()
    if MAIN_IS_WRAPPED.search(text):
        return True
    imported = IMPORTED_MAIN.search(text)  # a tuned example running a driver's main
    return imported is not None and _goes_through_the_converter(ROOT / (imported.group(1).replace(".", "/") + ".py"))


def test_every_entry_point_goes_through_the_one_converter():
    entry_points = {path.relative_to(ROOT).as_posix(): path for path in _entry_points()}
    names = set(entry_points)
    assert {"rllib_ragen/run/evaluate.py", "rllib_ragen/run/gpu_smoke.py", "tuned_examples/frozenlake_starpo.py",
            "tuned_examples/sweep_starpo.py", "tuned_examples/sokoban_offline.py"} <= names, names
    assert len([n for n in names if n.startswith("tuned_examples/")]) == len(list((ROOT / "tuned_examples").glob("*.py")))
    unwrapped = [name for name, path in entry_points.items() if not _goes_through_the_converter(path)]
    assert not unwrapped, f"entry points whose main is not @front_door: {unwrapped}"


def test_the_wiring_check_can_fail(tmp_path):
    bare = tmp_path / "bare.py"
    bare.write_text('def main() -> None:\n    pass\n\n\nif __name__ == "__main__":\n    main()\n')
    assert not _goes_through_the_converter(bare)
    bare.write_text(f"@front_door\n{bare.read_text()}")
    assert _goes_through_the_converter(bare)


def test_only_the_converter_writes_error_lines():
    writers = [
        path.relative_to(ROOT).as_posix()
        for folder in ("rllib_ragen", "envs", "tuned_examples", "benchmarks")
        for path in (ROOT / folder).rglob("*.py")
        if path != CONVERTER and OWN_ERROR_LINE.search(path.read_text())
    ]
    assert not writers, f"these write their own error line instead of raising a UserError: {writers}"
