"""A 2-arm x 2-seed study of the tiny model run as a user runs it (`python -m rllib_ragen study
module:STUDY`, a subprocess), SIGKILLed during its third trial, then run again: the two finished
trials are kept, the third is redone and the fourth runs; MLflow ends with 4 FINISHED runs, one per
trial, tagged with the study, arm and seed, each iteration logged once; and the study's figure,
table and verdict line come out.

Tune saves its record of the trials every 10 s or more, so a kill soon after a trial ended left
Tune believing it unfinished (a CI run did so). The killed run here saves that record only once, at
its start (`TUNE_GLOBAL_CHECKPOINT_S`), the worst case: the finished trials are kept from MLflow.

One test covers both the plain run and the resume: each trial costs Ray and model start-up, and the
slow tier is kept short."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient
from run_helpers import ROOT

from rllib_ragen.run.study import ARM_TAG, SEED_TAG, STUDY_TAG

STUDY_MODULE = """
from rllib_ragen.run.study import Study

STUDY = Study(
    name="tiny",
    question="Does a larger step end higher on the tiny model?",
    envs=("bandit",),
    arms={"small-step": {"actor_lr": 1e-5}, "large-step": {"actor_lr": 1e-3}},
    seeds=(0, 1),
    budget_min=0.01,
)
"""
THIRD_TRIAL = "small-step_seed1_bandit"
RUN_TIMEOUT_S = 900


def _command(model: Path) -> list[str]:
    tiny = [
        f"llm_model={model}", "engine=hf", "n_groups=2", "group_size=2", "response_length=8",
        "micro_batch_size=2", "eval_size=2", "eval_interval=3",
    ]
    settings = [arg for setting in tiny for arg in ("--set", setting)]
    return [sys.executable, "-m", "rllib_ragen", "study", "tiny_study:STUDY", "--no-warm-start", *settings,
            "--experiment", "studies"]


def _environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    paths = [str(ROOT), str(tmp_path), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    # A Ray of its own, never one another test or session left behind.
    return {
        **os.environ, "PYTHONPATH": os.pathsep.join(paths), "RAY_ADDRESS": "local", "PYTHONUNBUFFERED": "1", **extra
    }


def _session_members(session: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3]) == session:
                members.append(int(entry.name))
    return members


def _kill_session(process: subprocess.Popen) -> None:
    """SIGKILL to the study's process group, then waits for every process of its session (Ray's
    workers leave once their raylet is gone) and kills what is left after a minute."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    deadline = time.monotonic() + 60
    while _session_members(process.pid) and time.monotonic() < deadline:
        time.sleep(1)
    for pid in _session_members(process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _run_until_third_trial_reports(command: list[str], tmp_path: Path) -> list[str]:
    """Starts the study and SIGKILLs it at the third trial's first result; returns its output."""
    process = subprocess.Popen(
        command, cwd=tmp_path, env=_environment(tmp_path, TUNE_GLOBAL_CHECKPOINT_S="100000"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    seen, deadline = [], time.monotonic() + RUN_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=1))
                if seen[-1].startswith(f"{THIRD_TRIAL} [1]"):
                    return seen
            if process.poll() is not None and lines.empty():
                break
        raise AssertionError("the third trial never reported:\n" + "".join(seen[-40:]))
    finally:
        _kill_session(process)


def _runs(client: MlflowClient, view: int = ViewType.ACTIVE_ONLY) -> list:
    experiment = client.get_experiment_by_name("studies").experiment_id
    return [r for r in client.search_runs([experiment], run_view_type=view) if r.data.tags.get(STUDY_TAG) == "tiny"]


@pytest.mark.slow
def test_a_study_killed_in_its_third_trial_resumes_with_one_complete_run_per_trial(tiny_model_path, tmp_path):
    (tmp_path / "tiny_study.py").write_text(STUDY_MODULE)
    command = _command(tiny_model_path)
    _run_until_third_trial_reports(command, tmp_path)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    before = {(r.data.tags[ARM_TAG], r.data.tags[SEED_TAG]): r for r in _runs(client)}
    finished_before = {key: r.info.run_id for key, r in before.items() if r.info.status == "FINISHED"}
    assert set(finished_before) == {("small-step", "0"), ("large-step", "0")}
    assert before[("small-step", "1")].info.status == "RUNNING"  # killed mid-trial

    resumed = subprocess.run(
        command, cwd=tmp_path, env=_environment(tmp_path), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming study tiny" in resumed.stdout
    # A quiet console: the trials' own output (RLlib, vLLM, Tune) goes to Ray's logs, the driver's libraries' to a file.
    assert "pid=" not in resumed.stdout + resumed.stderr, resumed.stdout[-3000:]
    assert "View detailed results" not in resumed.stdout and "tensorboard" not in resumed.stdout, resumed.stdout[-3000:]
    assert (tmp_path / "studies" / "tiny.log").is_file()
    trained = {line.split(" [")[0] for line in resumed.stdout.splitlines() if " min | success " in line}
    assert trained == {THIRD_TRIAL, "large-step_seed1_bandit"}
    kept = {line.split(":")[0] for line in resumed.stdout.splitlines() if ": kept, its MLflow run " in line}
    assert kept == {"small-step_seed0_bandit", "large-step_seed0_bandit"}  # Tune's record had them unfinished

    runs = _runs(client)
    assert sorted((r.data.tags[ARM_TAG], r.data.tags[SEED_TAG]) for r in runs) == [
        ("large-step", "0"), ("large-step", "1"), ("small-step", "0"), ("small-step", "1"),
    ]
    assert all(r.info.status == "FINISHED" and r.data.tags["env"] == "bandit" for r in runs)
    after = {(r.data.tags[ARM_TAG], r.data.tags[SEED_TAG]): r.info.run_id for r in runs}
    assert {key: after[key] for key in finished_before} == finished_before  # the same runs, untouched
    for run in runs:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "training_iteration")]
        assert steps == sorted(set(steps)) and steps[0] == 1, (run.info.run_name, steps)
        # Each trial ends on an evaluated iteration (an earlier one may have evaluated when its time looked spent).
        evaluated = [m.step for m in client.get_metric_history(run.info.run_id, "evaluation/success_rate")]
        assert evaluated[-1] == steps[-1] and evaluated == sorted(set(evaluated)), (run.info.run_name, evaluated)
        assert float(run.data.params["actor_lr"]) == {"small-step": 1e-5, "large-step": 1e-3}[run.data.tags[ARM_TAG]]
    # The killed attempt's run is deleted, not left beside the redone one.
    deleted = _runs(client, ViewType.DELETED_ONLY)
    assert [(r.data.tags[ARM_TAG], r.data.tags[SEED_TAG]) for r in deleted] == [("small-step", "1")]

    verdicts = [line for line in resumed.stdout.splitlines() if line.startswith("tiny on bandit: ")]
    assert len(verdicts) == 1 and "does large-step end above small-step?" in verdicts[0]
    assert "by training seed (0, 1)" in verdicts[0]
    assert (tmp_path / "studies" / "tiny" / "figure.png").stat().st_size > 10_000
    assert verdicts[0][len("tiny on bandit: "):] in (tmp_path / "studies" / "tiny" / "report.md").read_text()
