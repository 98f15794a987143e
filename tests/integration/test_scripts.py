"""Every script answers --help; the tuned-example flags build valid configs."""

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from run_helpers import load_script

from envs.user_errors import UserError
from rllib_ragen.run import train_loop
from rllib_ragen.run.flags import build_parser, config_from_args
from rllib_ragen.run.settings_flag import apply_setting
from rllib_ragen.run.starting_model import choose_starting_model
from rllib_ragen.run.train_loop import is_last_in_budget, training_budget_s

ROOT = Path(__file__).resolve().parents[2]
# The commands: every file of these folders run as a script (a benchmark's helper module, e.g. cost_report.py,
# is imported by its command and has no `__main__` of its own).
SCRIPTS = [
    path
    for path in sorted((ROOT / "tuned_examples").glob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))
    if 'if __name__ == "__main__":' in path.read_text()
]


# Runs every script as `__main__` with `--help`, one after the other in one new interpreter, and prints
# {script: [exit code, stdout, error]} as JSON. One interpreter imports torch and Ray once for all of them (a
# new one per script spent minutes of the fast tier on imports); each script still runs as `python script
# --help` would run it, its own folder first on sys.path.
_HELP_DRIVER = """
import contextlib, io, json, runpy, sys, traceback
results = {}
for path in sys.argv[1:]:
    folder = path.rsplit("/", 1)[0]
    sys.path.insert(0, folder)
    sys.argv = [path, "--help"]
    out, code, error = io.StringIO(), 0, ""
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        code, error = 1, traceback.format_exc()
    finally:
        sys.path.remove(folder)
    results[path] = [code, out.getvalue(), error]
sys.__stdout__.write("HELP-RESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def help_results():
    out = subprocess.run([sys.executable, "-c", _HELP_DRIVER, *map(str, SCRIPTS)], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert "HELP-RESULTS " in out.stdout, out.stderr[-3000:]
    return json.loads(out.stdout.split("HELP-RESULTS ", 1)[1])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help(script, help_results):
    code, stdout, error = help_results[str(script)]
    assert code == 0, error
    assert "usage" in stdout.lower()


def _args(*argv):
    return build_parser(env="sokoban", description="t", success_threshold=0.5, stop_iters=3).parse_args(list(argv))


def test_flags_reach_the_config():
    config = config_from_args(_args("--n-groups", "3", "--group-size", "2", "--estimator", "grpo", "--no-think",
                                    "--set", "actor_lr=2e-5", "--set", "history_window=1"))
    assert (config.rollout.n_groups, config.rollout.group_size, config.advantages.advantage_estimator) == (3, 2, "grpo")
    assert config.llm_module.critic == "none" and not config.protocol.think and config.protocol.prefill
    assert config.optim.actor_lr == 2e-5 and config.protocol.history_window == 1


def test_a_critic_estimator_brings_the_presets_critic_and_a_critic_free_one_drops_it():
    # Sokoban's CPU preset trains GRPO without a critic; GAE reads one: the CPU preset's value head.
    assert config_from_args(_args()).llm_module.critic == "none"
    assert config_from_args(_args("--estimator", "bi_level_gae")).llm_module.critic == "head"
    assert config_from_args(_args("--estimator", "gae", "--set", "critic=separate")).llm_module.critic == "separate"
    assert config_from_args(_args("--estimator", "gae", "--preset", "gpu")).llm_module.critic == "separate"
    assert config_from_args(_args("--estimator", "brpo", "--preset", "gpu")).llm_module.critic == "none"


def test_unknown_setting_is_named():
    config = config_from_args(_args())
    with pytest.raises(ValueError, match="unknown config key 'actor_lrr'"):
        apply_setting(config, "actor_lrr=1")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        apply_setting(config, "actor_lr")


def test_a_given_warm_started_model_replaces_the_warm_start(tiny_model_path):
    config = config_from_args(_args())
    choose_starting_model(config, _args("--warm-start-model", str(tiny_model_path)))
    assert config.llm_module.model == str(tiny_model_path)
    with pytest.raises(ValueError, match="--warm-start-model and --no-warm-start"):
        choose_starting_model(config, _args("--warm-start-model", str(tiny_model_path), "--no-warm-start"))
    with pytest.raises(FileNotFoundError):
        choose_starting_model(config, _args("--warm-start-model", str(tiny_model_path / "missing")))


def test_no_warm_start_keeps_the_base_model():
    config = config_from_args(_args("--model", "tiny-random"))
    choose_starting_model(config, _args("--no-warm-start"))
    assert config.llm_module.model == "tiny-random"


def test_training_gets_what_the_job_budget_leaves_and_never_more_than_its_own(monkeypatch):
    now = 10_000.0  # the driver's clock, stopped: the figures do not depend on how fast this test runs
    monkeypatch.setattr(train_loop, "time", types.SimpleNamespace(perf_counter=lambda: now))
    started = now - 300.0  # the warm start and the first evaluation took 5 minutes
    assert training_budget_s(_args(), started) is None
    assert training_budget_s(_args("--time-budget-min", "10"), started) == 600.0
    assert training_budget_s(_args("--job-budget-min", "27"), started) == 27 * 60 - 300
    both = training_budget_s(_args("--job-budget-min", "27", "--time-budget-min", "10"), started)
    assert both == 600.0
    # A warm start that took the whole budget leaves none: training then runs its one evaluating iteration.
    assert training_budget_s(_args("--job-budget-min", "4"), started) < 0


def test_the_last_iteration_leaves_room_for_itself_and_its_evaluation():
    # 60 s iterations, a 300 s evaluation before RL, a 27-minute (1620 s) budget: an iteration then the final
    # one (60 + 360 s) still fit after 1200 s, not after 1201 s.
    assert not is_last_in_budget(1200.0, 60.0, 300.0, budget_s=1620.0)
    assert is_last_in_budget(1201.0, 60.0, 300.0, budget_s=1620.0)
    # Without an evaluation before RL, the final iteration's evaluation is guessed as one more iteration.
    assert not is_last_in_budget(1440.0, 60.0, None, budget_s=1620.0)
    assert is_last_in_budget(1441.0, 60.0, None, budget_s=1620.0)


def test_time_budget_ends_with_an_evaluation_and_intervals(tmp_path, tiny_model_path):
    """A budget the evaluation before RL uses up: the first iteration is the last (the evaluation's time is
    the estimate of the final one's), and it ends with an evaluation, the before/after summary and the final policy."""
    summary = tmp_path / "summary.json"
    command = [
        sys.executable, str(ROOT / "tuned_examples" / "bandit_starpo.py"), "--model", str(tiny_model_path),
        "--engine", "hf", "--no-warm-start", "--stop-iters", "5", "--time-budget-min", "0.001", "--eval-size", "4",
        "--n-groups", "2", "--group-size", "2", "--summary-json", str(summary),
        "--checkpoint-dir", str(tmp_path / "checkpoints"), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
    ]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[1/1]" in out.stdout and "[2/" not in out.stdout
    assert "success on 4 evaluation seeds (95% intervals): before RL" in out.stdout
    result = json.loads(summary.read_text())
    assert len(result["before"]) == len(result["after"]) == 4 and result["iterations"] == 1
    low, high = result["difference_interval"]
    assert low <= result["difference"] <= high
    # What the budget bought: one iteration, training at most its 2 x 2 trajectories, evaluated.
    (row,) = result["curve"]
    assert row["iteration"] == 1 and row["minutes"] > 0 and "eval_success" in row
    assert 0 < row["trajectories_trained"] == result["trajectories_trained"] <= 4
    assert f"the budget bought 1 iteration, {result['trajectories_trained']} trajectories trained" in out.stdout
    assert (tmp_path / "checkpoints" / "final_policy").is_dir()


@pytest.mark.slow  # six runs, each evaluated before and after its iteration
def test_paper_table_tiny_runs_every_table_4_setting(ray_session, tmp_path, monkeypatch):
    """`benchmarks/paper_table.py --tiny` end to end (in this process, sharing its Ray): each of the
    six settings trains 1 iteration through the tuned examples' driver and is evaluated before and after."""
    paper_table = load_script(ROOT / "benchmarks" / "paper_table.py")
    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    table = paper_table.main(["--tiny", "--tracking-uri", store, "--output", "table.md"])
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    assert [row[:3] for row in rows] == [
        ["Bandit", "bandit", "100.00%"], ["BanditRev", "bandit_rev", "67.58%"], ["Sokoban", "sokoban", "21.48%"],
        ["FrozenLake", "frozenlake", "19.92%"], ["LargerSokoban", "larger_sokoban", "2.34%"],
        ["SokobanNewVocab", "sokoban_new_vocab", "18.75%"],
    ]
    # 2 evaluation seeds before and after RL (a success rate with its Wilson interval), 1 iteration each.
    assert all(re.fullmatch(r"0\.\d{3} \[0\.\d{3}, [01]\.\d{3}\]", cell) for row in rows for cell in row[3:5])
    assert [row[5] for row in rows] == ["1"] * 6
    assert table in (tmp_path / "table.md").read_text()
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("paper-table").experiment_id])
    assert sorted(run.info.run_name for run in runs) == sorted(f"{env}-starpo" for env in paper_table.PAPER_STARPO_S)
    assert {run.info.status for run in runs} == {"FINISHED"}


def test_paper_table_names_unknown_settings():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "paper_table.py"), "--envs", "sokoban,maze"],
                         check=False, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2 and "['maze'] are not Table 4 settings" in out.stderr


def test_screening_variants_are_named_settings_and_ranked_by_success_after_rl():
    cpu_learning = load_script(ROOT / "benchmarks" / "cpu_learning.py")
    assert cpu_learning.parse_variant("lora lora_rank=16 'env_config={\"render\": \"words\"}'") == (
        "lora", ["lora_rank=16", 'env_config={"render": "words"}'])
    assert cpu_learning.parse_variant("preset") == ("preset", [])
    for bad in ("", "actor_lr=1e-5", "name actor_lr"):
        with pytest.raises(UserError, match="--variant"):
            cpu_learning.parse_variant(bad)
    runs = [{"variant": "a", "before": [0, 0, 1, 1], "after": [0, 1, 1, 1]},
            {"variant": "b", "before": [0, 0, 0, 0], "after": [1, 1, 1, 1]},
            {"variant": "c", "before": [1, 1, 1, 1], "after": [1, 1, 1, 0]}]
    assert [r["variant"] for r in cpu_learning.ranked(runs)] == ["b", "a", "c"]
