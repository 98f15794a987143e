"""Every script answers --help; the tuned-example flags build valid configs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rllib_ragen.experiment import apply_setting, build_parser, choose_starting_model, config_from_args

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "tuned_examples").glob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help(script):
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "usage" in out.stdout.lower()


def _args(*argv):
    return build_parser(env="sokoban", description="t", success_threshold=0.5, stop_iters=3).parse_args(list(argv))


def test_flags_reach_the_config():
    config = config_from_args(_args("--n-groups", "3", "--group-size", "2", "--estimator", "grpo", "--no-think",
                                    "--set", "actor_lr=2e-5", "--set", "history_window=1"))
    assert (config.n_groups, config.group_size, config.advantage_estimator) == (3, 2, "grpo")
    assert config.critic == "none" and not config.think and config.prefill
    assert config.actor_lr == 2e-5 and config.history_window == 1


def test_unknown_setting_is_named():
    config = config_from_args(_args())
    with pytest.raises(ValueError, match="unknown config key 'actor_lrr'"):
        apply_setting(config, "actor_lrr=1")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        apply_setting(config, "actor_lr")


def test_a_given_warm_started_model_replaces_the_warm_start(tiny_model_path):
    config = config_from_args(_args())
    choose_starting_model(config, _args("--warm-start-model", str(tiny_model_path)))
    assert config.llm_model == str(tiny_model_path)
    with pytest.raises(ValueError, match="--warm-start-model and --no-warm-start"):
        choose_starting_model(config, _args("--warm-start-model", str(tiny_model_path), "--no-warm-start"))
    with pytest.raises(FileNotFoundError):
        choose_starting_model(config, _args("--warm-start-model", str(tiny_model_path / "missing")))


def test_no_warm_start_keeps_the_base_model():
    config = config_from_args(_args("--model", "tiny-random"))
    choose_starting_model(config, _args("--no-warm-start"))
    assert config.llm_model == "tiny-random"


def test_time_budget_ends_with_an_evaluation_and_intervals(tmp_path, tiny_model_path):
    """A budget the first iteration uses up: the second (the first with a time estimate) is the last,
    and it ends with an evaluation, the before/after summary and the final policy."""
    summary = tmp_path / "summary.json"
    command = [
        sys.executable, str(ROOT / "tuned_examples" / "bandit_starpo.py"), "--model", str(tiny_model_path),
        "--engine", "hf", "--no-warm-start", "--stop-iters", "5", "--time-budget-min", "0.001", "--eval-size", "4",
        "--n-groups", "2", "--group-size", "2", "--summary-json", str(summary),
        "--checkpoint-dir", str(tmp_path / "checkpoints"), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
    ]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[1/5]" in out.stdout and "[2/2]" in out.stdout and "[3/" not in out.stdout
    assert "success on 4 evaluation seeds (95% intervals): before RL" in out.stdout
    result = json.loads(summary.read_text())
    assert len(result["before"]) == len(result["after"]) == 4 and result["iterations"] == 2
    low, high = result["difference_interval"]
    assert low <= result["difference"] <= high
    assert (tmp_path / "checkpoints" / "final_policy").is_dir()
