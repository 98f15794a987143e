"""The `rllib-ragen` console script (`rllib_ragen.cli`), in this process: every subcommand answers
`--help` under its own name, `train` takes each env's tuned defaults, and pyproject.toml installs it."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest

from rllib_ragen.cli import COMMANDS, main

REPO = Path(__file__).resolve().parents[2]


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_the_console_script_is_rllib_ragen_cli_main():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["rllib-ragen"].partition(":")
    assert getattr(importlib.import_module(module), name) is main


def test_help_lists_every_command(capsys):
    out = _help(capsys)
    assert out.startswith("usage: rllib-ragen")
    assert set(COMMANDS) == {"train", "evaluate", "models", "sweep", "study"} and all(f"  {c} " in out for c in COMMANDS)


@pytest.mark.parametrize("command,flag", [
    ("train", "--stop-iters"), ("evaluate", "--generalisation"), ("models", "pull"), ("sweep", "--grid"),
    ("study", "--budget-min"),
])
def test_every_command_answers_help_under_its_own_name(capsys, command, flag):
    out = _help(capsys, command)
    assert out.startswith(f"usage: rllib-ragen {command}") and flag in out


def test_train_takes_the_envs_tuned_defaults(capsys):
    from rllib_ragen.run.experiment import TUNED_RUNS

    out = " ".join(_help(capsys, "train", "--env", "bandit").split())
    assert TUNED_RUNS["bandit"].description in out and "(default: 0.55)" in out  # the success threshold


def test_train_needs_an_env_and_an_unknown_command_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train"])
    assert exit_.value.code == 2 and "needs --env NAME" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["trian"])
    assert exit_.value.code == 2 and "invalid choice: 'trian'" in capsys.readouterr().err
