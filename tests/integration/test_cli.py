"""The tuned examples as a user runs them: one-line errors before Ray starts, and a
run of the README's custom env on a remote env runner, with a console that shows
only the job's own lines, bounded checkpoints and the run's MLflow record."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient
from run_helpers import ROOT, write_readme_env

BANDIT = str(ROOT / "tuned_examples" / "bandit_starpo.py")

# Every line the tuned-example driver (rllib_ragen/run/experiment.py) prints to stdout in a run
# without warm start or resume; a line of Ray, RLlib, vLLM or transformers matches none.
CLI_LINES = (
    r"note: this CPU, .+, has no AMX or AVX-512 BF16, so training computes in float32; .*",
    r"library logs: \S+run\.log \(--verbose: on the console too\)",
    r"MLflow store: creating \S+mlflow\.db",
    r"starting the algorithm: Ray, the inference engines and the learner\.\.\.",
    r"MLflow run: sqlite:///\S+ experiment \d+ run [0-9a-f]{32}",
    r"checkpoints: \S+ \(newest \d+ kept\)",
    r"\S+: \d+ groups x \d+ trajectories, \d+ turns, model \S+, estimator \w+",
    r"\[0\] evaluating the starting policy on the \d+ evaluation seeds\.\.\.",
    r"\[0\] before RL, on the \d+ evaluation seeds: success .*",
    r"\[\d+/\d+\] \| success [\d.]+ \| return .* \| [\d.]+s",
    r"success on \d+ evaluation seeds \(95% intervals\): before RL .*",
    r"the budget bought \d+ iterations?, \d+ trajectories trained and [\d.]+ min of RL, in a job of [\d.]+ min .*",
    r"done\. MLflow run: .*; final policy \(HF format\): \S+final_policy",
)


def test_user_errors_are_one_line_with_exit_code_2_before_ray_starts(tmp_path):
    bad_flags = {
        "--n-groups 0": "error: argument --n-groups: must be an integer >= 1, got '0'",
        "--set actor_lr=abc": "error: --set actor_lr=abc: actor_lr takes float (a number, e.g. 1e-5), got 'abc'",
        "--set history_window=x": (
            "error: --set history_window=x: history_window takes int | None (an integer or None), got 'x'"
        ),
        "--env nosuchenv": "error: unknown env 'nosuchenv'; registered envs: [",
    }
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    # In parallel: each process spends its time importing, not working.
    processes = {
        flags: subprocess.Popen(
            [sys.executable, BANDIT, *flags.split()],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env={**_env(), "RAY_TMPDIR": str(ray_tmp)},
        )
        for flags in bad_flags
    }
    for flags, process in processes.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 2, (flags, stderr)
        assert (
            stdout == ""
            and len(stderr.splitlines()) == 1
            and stderr.startswith(bad_flags[flags])
        ), (flags, stderr)
    assert list(ray_tmp.iterdir()) == [], "Ray was started"
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow  # a whole run in a new process: a remote env runner, 3 iterations, 2 evaluations
def test_readme_env_on_a_remote_runner_with_a_clean_console_and_bounded_checkpoints(
    tiny_model_path, tmp_path
):
    env = write_readme_env(
        tmp_path
    )  # guess_env.py in the working directory, as a user would
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = [
        sys.executable,
        BANDIT,
        "--env",
        env,
        "--model",
        str(tiny_model_path),
        "--engine",
        "hf",
        "--no-warm-start",
        "--stop-iters",
        "3",
        "--n-groups",
        "2",
        "--group-size",
        "2",
        "--max-turns",
        "2",
        "--eval-size",
        "2",
        "--checkpoint-every",
        "1",
        "--keep-checkpoints",
        "2",
        "--checkpoint-dir",
        "ckpt",
        "--tracking-uri",
        store,
        "--experiment",
        "cli",
        "--set",
        "response_length=8",
        "--set",
        "mini_batch_size=4",
        "--set",
        "micro_batch_size=2",
        "--set",
        "num_env_runners=1",
        "--set",
        "create_local_env_runner=False",
    ]
    out = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env=_env(),
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]

    lines = out.stdout.splitlines()
    foreign = [
        line
        for line in lines
        if not any(re.fullmatch(form, line) for form in CLI_LINES)
    ]
    assert foreign == [], f"stdout lines the CLI does not print: {foreign}"
    assert [line[:5] for line in lines if line.startswith("[")] == [
        "[0] e",
        "[0] b",
        "[1/3]",
        "[2/3]",
        "[3/3]",
    ]
    # The libraries' records went to the run's log file instead, beside the stages of each
    # iteration (what benchmarks/kill_campaign.py reads).
    log = (tmp_path / "ckpt" / "run.log").read_text()
    assert "iteration 3: checkpointing into" in log and "iteration 3: exporting the final policy" in log
    assert re.search(r"^\S+ \S+ \w+ (ray|py\.warnings)\b", log, re.MULTILINE), log[
        :2000
    ]

    # --keep-checkpoints 2: the newest two of three; beside them the MLflow run's id (`--resume` continues it).
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "final_policy",
        "iter_000002",
        "iter_000003",
        "mlflow_run.json",
        "run.log",
    ]

    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("cli").experiment_id])
    tags = run.data.tags
    assert (
        tags["env"],
        tags["base_model"],
        tags["warm_start_model"],
        tags["preset"],
    ) == (env, str(tiny_model_path), "none", "cpu")
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", tags["git_commit"])
    # The preset evaluates every 5 iterations and at the last; step 0 is before RL, logged once.
    iterations = [line for line in lines if re.match(r"\[\d+/", line)]
    assert ["eval success" in line for line in iterations] == [False, False, True]
    assert sorted(
        m.step
        for m in client.get_metric_history(run.info.run_id, "evaluation/success_rate")
    ) == [0, 3]
    assert not [key for key in run.data.metrics if key.startswith("env_runners/eval_")]
    # The final policy once, the before- and after-RL pages, no checkpoint (not asked for with
    # --log-checkpoint-every).
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"evaluation", "final_policy", "trajectories"}
    assert [a.path for a in client.list_artifacts(run.info.run_id, "evaluation")] == [
        "evaluation/after_rl.html",
        "evaluation/before_rl.html",
    ]


def _env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}


@pytest.mark.parametrize(
    ("env", "learned", "not_learned"), [("frozenlake", 0.891, 0.602), ("sokoban", 0.477, 0.266), ("bandit", 0.648, 0.445)]
)
def test_as_test_thresholds_pass_measured_runs_and_fail_below_them(env, learned, not_learned, capsys):
    """`--as-test` can fail: the tuned threshold sits between a measured run after RL and the warm start
    alone (a run that did not learn)."""
    from rllib_ragen.run.experiment import tuned_run
    from rllib_ragen.run.report import check_success

    threshold = tuned_run(env).success_threshold
    check_success({"evaluation": {"success_rate": learned}}, threshold)
    assert "--as-test passed" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        check_success({"evaluation": {"success_rate": not_learned}}, threshold)
    assert exit_info.value.code == 1 and "--as-test FAILED" in capsys.readouterr().err


@pytest.mark.parametrize("result", [{"evaluation": {"success_rate": float("nan")}}, {"env_runners": {}}, {}])
def test_as_test_fails_when_no_success_was_measured(result, capsys):
    """A NaN success (an evaluation with no episodes) or none at all is no evidence of learning:
    `--as-test` fails, whatever the threshold (`nan < t` alone would let it pass)."""
    from rllib_ragen.run.report import check_success

    with pytest.raises(SystemExit) as exit_info:
        check_success(result, 0.0)
    assert exit_info.value.code == 1 and "--as-test FAILED" in capsys.readouterr().err


def test_as_test_without_a_measured_threshold_is_a_flag_error(capsys):
    """Countdown has no measured run to set a threshold from: `--as-test` asks for one rather than
    passing on any success (a 0.0 threshold could never fail); given one, the flags parse."""
    from rllib_ragen.run.experiment import main, tuned_run
    from rllib_ragen.run.flags import build_parser

    assert tuned_run("countdown").success_threshold is None
    with pytest.raises(SystemExit) as exit_info:
        main(env="countdown", argv=["--as-test"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "error: --as-test needs --success-threshold" in err and "countdown" in err
    parser = build_parser(env="countdown", description="t", success_threshold=None, stop_iters=1)
    assert parser.parse_args(["--as-test", "--success-threshold", "0.3"]).success_threshold == 0.3
