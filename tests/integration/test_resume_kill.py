"""Crash safety: a checkpoint is complete or ignored, metrics reach MLflow
exactly once per step, Ctrl-C checkpoints before it stops, and a tuned example
SIGKILLed mid-run resumes with the same iteration counter, seed stream,
optimiser state and MLflow run."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from ray.rllib.callbacks.callbacks import RLlibCallback
from run_helpers import ROOT, driver_args, small_filesystem, tiny_config

from rllib_ragen.run.callbacks import (
    MLflowCallback,
    MLflowSettings,
    mlflow_callback_of,
    with_mlflow,
)
from rllib_ragen.run.checkpoints import (
    COMPLETE_MARKER,
    TRACKING_FILE,
    checkpoint_iteration,
    latest_checkpoint,
    save_checkpoint,
    tracking_state,
)
from rllib_ragen.run.tracking import (
    CHECKPOINT_DIR_TAG,
    RUN_FILE,
    MLflowTracker,
    mark_orphans_killed,
    metrics_from_json,
    recorded_run,
    resumable_run,
)
from rllib_ragen.run.train_loop import run

TRAIN_SEED_START = 10_000  # StarPOConfig's default


def _bandit_config(model_path):
    return (
        tiny_config(model_path, env="bandit")
        .rollouts(max_turns=1, max_actions_per_turn=1, response_length=8)
        .starpo_evaluation(eval_interval=0)
    )


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_half_written_checkpoints_are_never_resumed_and_older_ones_beyond_keep_are_removed(ray_session, tiny_model_path, tmp_path):
    algo = _bandit_config(tiny_model_path).build_algo()
    try:
        algo.train()
        complete = save_checkpoint(algo, tmp_path, tracking={"run_id": "r1", "metrics": []})
        assert complete.name == "iter_000001" and latest_checkpoint(tmp_path) == complete
        # What kills leave behind: a save cut off mid-write (no marker, a
        # truncated state file) and a newer-named copy that lost its marker.
        cut = tmp_path / ".partial-iter_000002"
        shutil.copytree(complete, cut)
        (cut / COMPLETE_MARKER).unlink()
        state = cut / "learner_group" / "learner" / "state.pkl"
        state.write_bytes(state.read_bytes()[:100])
        unmarked = tmp_path / "iter_000003"
        shutil.copytree(complete, unmarked)
        (unmarked / COMPLETE_MARKER).unlink()
        assert latest_checkpoint(tmp_path) == complete
        with pytest.raises(ValueError, match="not a complete checkpoint"):
            tracking_state(unmarked)

        algo.train()
        newer = save_checkpoint(algo, tmp_path, tracking={"run_id": "r1", "metrics": [["m", 1.0, 5, 2]]})
        assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_000002"]
        assert latest_checkpoint(tmp_path) == newer and checkpoint_iteration(newer) == 2
        assert tracking_state(newer) == {"run_id": "r1", "metrics": [["m", 1.0, 5, 2]]}
        # An iteration's checkpoint is written once: saving it again keeps it.
        assert save_checkpoint(algo, tmp_path, tracking={"run_id": "other", "metrics": []}) == newer
        assert tracking_state(newer)["run_id"] == "r1"

        # keep=2: the newest two complete checkpoints stay, older ones go; never the one just written.
        for names in (["iter_000002", "iter_000003"], ["iter_000003", "iter_000004"]):
            algo.train()
            saved = save_checkpoint(algo, tmp_path, tracking={"run_id": "r1", "metrics": []}, keep=2)
            assert sorted(p.name for p in tmp_path.iterdir()) == names and latest_checkpoint(tmp_path) == saved
        with pytest.raises(ValueError, match="keep must be >= 1"):
            save_checkpoint(algo, tmp_path, tracking={}, keep=0)
    finally:
        algo.stop()


def test_metrics_wait_for_their_checkpoint_and_restore_logs_each_once(ray_session, tiny_model_path, tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(store)
    settings = MLflowSettings(
        tracking_uri=store, experiment="restore", checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=2,
        stop_iters=10,
    )
    algo = with_mlflow(_bandit_config(tiny_model_path), settings).build_algo()
    try:
        algo.train()
        run_id = mlflow_callback_of(algo).tracker.run_id
        # No checkpoint covers iteration 1 yet, so MLflow has none of its metrics.
        assert latest_checkpoint(tmp_path / "ckpt") is None
        assert client.get_metric_history(run_id, "training_iteration") == []
        algo.train()
        checkpoint = latest_checkpoint(tmp_path / "ckpt")
        assert checkpoint.name == "iter_000002"
        assert _history(client, run_id, "training_iteration") == [(1, 1.0), (2, 2.0)]
        saved = metrics_from_json(tracking_state(checkpoint)["metrics"])
        assert {m.step for m in saved} == {1, 2} and tracking_state(checkpoint)["run_id"] == run_id

        # A kill after the checkpoint was saved but while its metrics were
        # being logged: a run holding only part of them.
        crashed_run = MLflowTracker(tracking_uri=store, experiment="restore")
        copy = tmp_path / "crashed" / checkpoint.name
        shutil.copytree(checkpoint, copy)
        tracking = dict(tracking_state(checkpoint), run_id=crashed_run.run_id)
        (copy / TRACKING_FILE).write_text(json.dumps(tracking))
        crashed_run.log_metric_entities(saved[: len(saved) // 3])
        for _ in range(2):  # a second crash during the restore changes nothing
            restarted = MLflowCallback(settings)
            restarted.restore(algo, copy)
            assert restarted.tracker.run_id == crashed_run.run_id and algo.iteration == 2
        for key in {m.key for m in saved}:
            expected = sorted((m.step, m.value) for m in saved if m.key == key)
            assert _history(client, crashed_run.run_id, key) == expected, key
    finally:
        algo.stop()


def test_orphans_of_a_checkpoint_dir_are_found_in_the_store_and_in_its_run_file(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, here, other = MlflowClient(store), str(tmp_path / "ckpt"), str(tmp_path / "other")
    orphan = MLflowTracker(tracking_uri=store, experiment="e", tags={CHECKPOINT_DIR_TAG: here}).run_id
    done = MLflowTracker(tracking_uri=store, experiment="e", tags={CHECKPOINT_DIR_TAG: here})
    done.end("FINISHED")
    elsewhere = MLflowTracker(tracking_uri=store, experiment="e", tags={CHECKPOINT_DIR_TAG: other}).run_id
    # Recorded in the directory's run file, but in another experiment (a resume with other flags).
    recorded = MLflowTracker(tracking_uri=store, experiment="e2").run_id
    assert mark_orphans_killed(client, "e", checkpoint_dir=here, also=recorded) == sorted([orphan, recorded])
    status = {run_id: client.get_run(run_id).info.status for run_id in (orphan, done.run_id, elsewhere, recorded)}
    assert status == {orphan: "KILLED", done.run_id: "FINISHED", elsewhere: "RUNNING", recorded: "KILLED"}
    assert mark_orphans_killed(client, "no-such-experiment", checkpoint_dir=here, also=None) == []
    # Resumable: an unfinished run the store holds, whatever ended it; never a finished, deleted or unknown one.
    client.delete_run(elsewhere)
    assert [resumable_run(client, r) for r in (orphan, done.run_id, elsewhere, "0" * 32, None)] == [
        orphan, None, None, None, None,
    ]  # fmt: skip
    assert recorded_run(here, store) is None


def test_a_training_run_keeps_one_mlflow_run_across_kills_before_its_first_checkpoint(
    ray_session, tiny_model_path, tmp_path
):
    store, checkpoints = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "ckpt"
    client = MlflowClient(store)
    settings = MLflowSettings(tracking_uri=store, experiment="one-run", checkpoint_dir=str(checkpoints))
    algo = _bandit_config(tiny_model_path).build_algo()

    def start(*, resume: bool) -> str:
        """A process's start in `checkpoint_dir`; dropping the callback unclosed is what a SIGKILL leaves."""
        callback = MLflowCallback(dataclasses.replace(settings, resume=resume))
        return callback.start(algo).run_id

    try:
        first = start(resume=False)
        # Recorded beside the checkpoints at once, whole (no temporary copy left), and tagged.
        assert recorded_run(checkpoints, store) == first and recorded_run(checkpoints, "sqlite:///x.db") is None
        assert [p.name for p in checkpoints.iterdir()] == [RUN_FILE]
        assert client.get_run(first).data.tags[CHECKPOINT_DIR_TAG] == str(checkpoints)
        assert start(resume=True) == first  # killed before its first checkpoint: --resume continues it
        client.set_terminated(first, status="KILLED")  # a SIGTERM closes it KILLED: still resumed
        assert start(resume=True) == first and client.get_run(first).info.status == "RUNNING"

        fresh = start(resume=False)  # a new run in the same directory: the orphan is closed
        assert fresh != first and client.get_run(first).info.status == "KILLED"
        assert recorded_run(checkpoints, store) == fresh
        client.set_terminated(fresh, status="FINISHED")
        assert start(resume=True) not in (first, fresh)  # a finished run is never reopened
    finally:
        algo.stop()
    experiment = client.get_experiment_by_name("one-run")
    assert [r.info.status for r in client.search_runs([experiment.experiment_id])].count("RUNNING") == 1


class _SigtermAtIteration1(RLlibCallback):
    def on_train_result(self, *, algorithm, result, **kwargs) -> None:
        signal.raise_signal(signal.SIGTERM)


class _ErrorAtIteration1(RLlibCallback):
    def on_train_result(self, *, algorithm, result, **kwargs) -> None:
        raise RuntimeError("a bug in iteration 1")


@pytest.mark.slow  # a run through the driver each
@pytest.mark.parametrize(
    ("callback", "raised", "status"),
    [(_SigtermAtIteration1, SystemExit, "KILLED"), (_ErrorAtIteration1, RuntimeError, "FAILED")],
    ids=["sigterm", "error"],
)
def test_a_run_whose_process_ends_by_sigterm_or_an_error_is_closed_killed_or_failed(
    ray_session, tiny_model_path, tmp_path, callback, raised, status
):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    flags = ("--tracking-uri", store, "--experiment", "ends", "--checkpoint-dir", str(tmp_path / "ckpt"))
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(raised) as ended:
        run(_bandit_config(tiny_model_path).callbacks(callbacks_class=callback), driver_args(*flags, stop_iters=3))
    assert signal.getsignal(signal.SIGTERM) is previous  # the run's SIGTERM handler is gone with it
    if raised is SystemExit:
        assert ended.value.code == 128 + signal.SIGTERM
    client = MlflowClient(store)
    (only,) = client.search_runs([client.get_experiment_by_name("ends").experiment_id])
    assert only.info.status == status and only.info.run_id == recorded_run(tmp_path / "ckpt", store)


class _CtrlCAtIteration2(RLlibCallback):
    def on_train_result(self, *, algorithm, result, **kwargs) -> None:
        if result["training_iteration"] == 2:
            signal.raise_signal(signal.SIGINT)


@pytest.mark.slow  # two runs through the driver: interrupted at iteration 2, then resumed
def test_ctrl_c_stops_after_the_iteration_with_a_checkpoint_then_resume_finishes(
    ray_session, tiny_model_path, tmp_path
):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(store)
    flags = ("--tracking-uri", store, "--experiment", "ctrl-c", "--checkpoint-dir", str(tmp_path / "ckpt"))
    config = _bandit_config(tiny_model_path).callbacks(callbacks_class=_CtrlCAtIteration2)
    with pytest.raises(KeyboardInterrupt):
        run(config, driver_args(*flags, "--checkpoint-every", "3", stop_iters=4))
    # Iteration 2 is no periodic checkpoint (every 3): this one is the exit's.
    checkpoint = latest_checkpoint(tmp_path / "ckpt")
    assert checkpoint.name == "iter_000002"
    run_id = tracking_state(checkpoint)["run_id"]
    assert client.get_run(run_id).info.status == "KILLED"
    assert _history(client, run_id, "training_iteration") == [(1, 1.0), (2, 2.0)]

    run(_bandit_config(tiny_model_path), driver_args(*flags, "--resume", stop_iters=3))
    assert client.get_run(run_id).info.status == "FINISHED"
    assert _history(client, run_id, "training_iteration") == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert len(client.search_runs([client.get_experiment_by_name("ctrl-c").experiment_id])) == 1


STOP_ITERS = 5
N_GROUPS = 2
CHECKPOINT_EVERY = 2
KILLED_IN = 4  # the iteration whose rollout the killed driver is held in: checkpoint 2 is its last
# Runs the tuned example as `python tuned_examples/bandit_starpo.py FLAGS` does, except that the first
# reset of a Bandit from seed FIRST_HELD_SEED on (the rollout of an iteration chosen by the test) writes
# MARKER and then, with ACTION "hold", waits there until the test kills it; with ACTION a directory, it
# fills that directory's file system up to its last FREE_LEFT bytes and goes on.
HELD_DRIVER = """
import os, runpy, sys, time
from pathlib import Path

from envs.bandit import BanditEnv

MARKER, FIRST_HELD_SEED, ACTION, SCRIPT = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
FREE_LEFT = 256 * 1024
reset = BanditEnv.reset


def fill(directory):
    stats = os.statvfs(directory)
    with open(Path(directory) / "filler", "wb") as filler:
        filler.truncate(0)
        os.posix_fallocate(filler.fileno(), 0, stats.f_bavail * stats.f_frsize - FREE_LEFT)


def held_reset(self, *args, seed=None, **kwargs):
    if seed is not None and seed >= FIRST_HELD_SEED and not MARKER.exists():
        MARKER.write_text(str(seed))
        if ACTION != "hold":
            fill(ACTION)
        while ACTION == "hold":
            time.sleep(1)
    return reset(self, *args, seed=seed, **kwargs)


BanditEnv.reset = held_reset
sys.argv = [SCRIPT, *sys.argv[5:]]
runpy.run_path(SCRIPT, run_name="__main__")
"""


def _driver_command(
    tmp_path: Path, model_path: Path, store: str, *extra: str, held_in: int = KILLED_IN,
    action: str = "hold", checkpoints: Path | None = None, marker: str = "held",
) -> list[str]:  # fmt: skip
    """The tuned example, held (or the disk filled: `action`) in iteration `held_in`'s rollout the first time
    (`tmp_path / marker` says when)."""
    driver = tmp_path / "held_driver.py"
    driver.write_text(HELD_DRIVER)
    first_held_seed = TRAIN_SEED_START + N_GROUPS * (held_in - 1)
    return [
        sys.executable, str(driver), str(tmp_path / marker), str(first_held_seed), action,
        str(ROOT / "tuned_examples" / "bandit_starpo.py"), "--model", str(model_path),
        "--engine", "hf", "--no-warm-start", "--n-groups", str(N_GROUPS), "--group-size", "2",
        "--set", "response_length=8", "--set", "eval_interval=0",
        "--checkpoint-dir", str(checkpoints or tmp_path / "ckpt"),
        "--tracking-uri", store, "--experiment", "kill", "--stop-iters", str(STOP_ITERS),
        "--checkpoint-every", str(CHECKPOINT_EVERY),
        # The held reset blocks the rollout itself, not a worker thread that a timeout would abandon.
        "--set", "env_step_timeout_s=None", *extra,
    ]  # fmt: skip


def _driver_env(ray_tmp: str) -> dict[str, str]:
    """Offline, unbuffered, this checkout first, and a local Ray of the driver's own (in `ray_tmp`, short:
    Ray's socket paths must stay under 107 bytes), never another test's cluster."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, HF_HUB_OFFLINE="1", RAY_ADDRESS="local", RAY_TMPDIR=ray_tmp, PYTHONUNBUFFERED="1",
                PYTHONPATH=path)  # fmt: skip


def _run_held_then_kill(command: list[str], tmp_path: Path, env: dict[str, str], log_path: Path, *, what: str) -> None:
    """Runs `command` until it is held (`tmp_path / "held"`), then SIGKILLs its session; waits for its processes' end."""
    with open(log_path, "wb") as log:
        killed = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path, env=env
        )
        try:
            _wait((tmp_path / "held").exists, timeout_s=240, what=what, process=killed)
        finally:
            _kill_session(killed)
    # Ray's processes share the driver's fate: none outlives the kill.
    _wait(lambda: not _session_pids(killed.pid), timeout_s=20, what="end of the killed driver's processes")


def _run_to_end(
    command: list[str], tmp_path: Path, env: dict[str, str], log_path: Path, *, stderr: Path | None = None
) -> subprocess.Popen:
    """Runs `command` to its end (at most 240 s), its output in `log_path` (stderr too, or in `stderr`);
    then nothing of its session is left."""
    with open(log_path, "wb") as log, open(stderr or os.devnull, "wb") as err:
        process = subprocess.Popen(
            command, stdout=log, stderr=err if stderr else subprocess.STDOUT, start_new_session=True, cwd=tmp_path,
            env=env,
        )  # fmt: skip
        try:
            process.wait(timeout=240)
        finally:
            _kill_session(process)
    return process


def _session_pids(session_id: int) -> list[int]:
    """Processes of a session (the driver's own process group and anything Ray forked from it)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == session_id and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def _wait(predicate, *, timeout_s: float, what: str, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the driver exited with {process.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s} s")
        time.sleep(0.1)


def _kill_session(process: subprocess.Popen) -> None:
    """SIGKILL to the driver's process group (no handler, no `finally` runs),
    then to anything left in its session."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    for pid in _session_pids(process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _adam_steps(checkpoint: Path) -> float:
    learner = pickle.loads((checkpoint / "learner_group" / "learner" / "state.pkl").read_bytes())
    optimizer = learner["optimizer"]["default_policy_policy"]["state"]["state"]
    return float(next(iter(optimizer.values()))["step"])


def _next_train_seed(checkpoint: Path) -> int:
    # The algorithm's own state (its sampler's seed cursor), beside its components' directories.
    return pickle.loads((checkpoint / "algorithm_state.pkl").read_bytes())["next_train_seed"]


METRICS = ("training_iteration", "env_runners/episode_return_mean", "learners/default_policy/entropy")


def _logged(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float, int]]]:
    """Each of METRICS's MLflow records (step, value, timestamp), in step order."""
    return {
        key: sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key)) for key in METRICS
    }


# Full fine-tuning only: a LoRA checkpoint's adapters and their optimiser state, and their restore, are
# tests/test_lora.py's; the kill and the resume take the same path either way (a second run cost 38 s of CI).
@pytest.mark.slow
def test_sigkill_mid_run_then_resume_continues_with_each_iteration_logged_once(tiny_model_path, tmp_path):
    checkpoints, store = tmp_path / "ckpt", f"sqlite:///{tmp_path / 'mlflow.db'}"
    ray_tmp = tempfile.mkdtemp(prefix="rk", dir="/tmp")
    env = _driver_env(ray_tmp)
    logs = {name: tmp_path / f"{name}.log" for name in ("killed", "resumed")}
    command = _driver_command(tmp_path, tiny_model_path, store)
    try:
        _run_held_then_kill(command, tmp_path, env, logs["killed"], what=f"rollout of iteration {KILLED_IN}")
        killed_output = logs["killed"].read_text()
        progress = [line.split("]")[0] + "]" for line in killed_output.splitlines() if line.startswith("[")]
        assert progress == [f"[{i}/{STOP_ITERS}]" for i in range(1, KILLED_IN)], killed_output[-3000:]
        last = latest_checkpoint(checkpoints)
        restored = checkpoint_iteration(last)
        assert restored == CHECKPOINT_EVERY  # iteration 3 is done, but no checkpoint covers it: it is redone
        adam_steps_per_iteration = _adam_steps(last) / restored
        assert adam_steps_per_iteration >= 1 and _next_train_seed(last) == TRAIN_SEED_START + N_GROUPS * restored
        client = MlflowClient(store)
        run_id = tracking_state(last)["run_id"]
        # The metrics of the checkpointed iterations, and nothing past the checkpoint, were logged.
        before_resume = _logged(client, run_id)
        assert all([step for step, _, _ in before_resume[key]] == [1, 2] for key in METRICS), before_resume

        resumed = _run_to_end([*command, "--resume"], tmp_path, env, logs["resumed"])
        output = logs["resumed"].read_text()
        assert resumed.returncode == 0, output[-3000:]
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)

    assert f"at iteration {restored}\n" in output
    progress = [line.split("]")[0] + "]" for line in output.splitlines() if line.startswith("[")]
    assert progress == [f"[{i}/{STOP_ITERS}]" for i in range(restored + 1, STOP_ITERS + 1)]

    experiment = client.get_experiment_by_name("kill")
    (only_run,) = client.search_runs([experiment.experiment_id])
    assert only_run.info.run_id == run_id and only_run.info.status == "FINISHED"
    after_resume = _logged(client, run_id)
    for key in METRICS:
        assert [step for step, _, _ in after_resume[key]] == list(range(1, STOP_ITERS + 1)), key
        # Steps up to the checkpoint are the killed driver's records, untouched; the resumed one logged the rest.
        assert after_resume[key][:restored] == before_resume[key], key
    assert _history(client, run_id, "training_iteration") == [(i, float(i)) for i in range(1, STOP_ITERS + 1)]

    final = latest_checkpoint(checkpoints)
    assert checkpoint_iteration(final) == STOP_ITERS
    # Seed cursor and optimiser went on from the checkpoint, not from scratch.
    assert _next_train_seed(final) == TRAIN_SEED_START + N_GROUPS * STOP_ITERS
    assert _adam_steps(final) == adam_steps_per_iteration * STOP_ITERS
    assert (checkpoints / "final_policy" / "model.safetensors").is_file()


def _loads(checkpoint: Path) -> None:
    """Every state file of the checkpoint unpickles, and its tracking state reads."""
    tracking_state(checkpoint)
    for state in checkpoint.rglob("*.pkl"):
        pickle.loads(state.read_bytes())


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_then_out_of_disk_stays_one_mlflow_run_and_finishes(
    tiny_model_path, tmp_path
):
    """1. SIGKILLed in iteration 2, before its first checkpoint (every 2): a RUNNING run without metrics.
    2. `--resume` continues that run; iteration 3's rollout fills the disk, so checkpoint 4 (the last) can't be
       written: one line naming it and the space it needs, checkpoint 2 kept and loadable, the run FAILED.
    3. Space freed, `--resume` goes on from checkpoint 2: one FINISHED run, each iteration logged once."""
    with small_filesystem(tmp_path / "disk", megabytes=200) as disk:
        checkpoints, store = disk / "ckpt", f"sqlite:///{disk / 'mlflow.db'}"
        ray_tmp = tempfile.mkdtemp(prefix="rk", dir="/tmp")
        env = _driver_env(ray_tmp)
        command = _driver_command(tmp_path, tiny_model_path, store, "--stop-iters", "4", held_in=2, checkpoints=checkpoints)
        try:
            _run_held_then_kill(command, tmp_path, env, tmp_path / "killed.log", what="rollout of iteration 2")
            assert latest_checkpoint(checkpoints) is None
            client = MlflowClient(store)
            (orphan,) = client.search_runs([client.get_experiment_by_name("kill").experiment_id])
            assert orphan.info.status == "RUNNING" and orphan.data.metrics == {}
            assert recorded_run(checkpoints, store) == orphan.info.run_id

            filling = _driver_command(
                tmp_path, tiny_model_path, store, "--stop-iters", "4", "--resume", held_in=3, action=str(disk),
                checkpoints=checkpoints, marker="filled",
            )  # fmt: skip
            full = _run_to_end(filling, tmp_path, env, tmp_path / "full.log", stderr=tmp_path / "full.err")
            assert (tmp_path / "filled").exists()  # the disk was filled in iteration 3
            assert "--resume: no complete checkpoint" in (tmp_path / "full.log").read_text()
            stderr = (tmp_path / "full.err").read_text().splitlines()
            message = f"no space left on the device for the checkpoint {checkpoints / 'iter_000004'}: it needs about "
            # The whole message is stderr's last line, as the entry points' converter writes a user-facing error.
            assert full.returncode == 2 and stderr[-1].startswith(f"error: {message}"), stderr[-30:]
            assert stderr[-1].endswith("then run again with --resume (the checkpoint iter_000002 is complete and is "
                                       "resumed from)"), stderr[-1]  # fmt: skip
            # The half-written checkpoint is gone, the previous one loads; the run (the same one) ended FAILED.
            assert sorted(p.name for p in checkpoints.glob("*iter_*")) == ["iter_000002"]
            _loads(latest_checkpoint(checkpoints))
            (failed,) = client.search_runs([client.get_experiment_by_name("kill").experiment_id])
            assert failed.info.run_id == orphan.info.run_id and failed.info.status == "FAILED"

            (disk / "filler").unlink()  # space freed
            resumed = _run_to_end([*command, "--resume"], tmp_path, env, tmp_path / "resumed.log")
            output = (tmp_path / "resumed.log").read_text()
            assert resumed.returncode == 0, output[-3000:]
            assert "at iteration 2\n" in output
        finally:
            shutil.rmtree(ray_tmp, ignore_errors=True)
        (only_run,) = client.search_runs([client.get_experiment_by_name("kill").experiment_id])
        assert only_run.info.run_id == orphan.info.run_id and only_run.info.status == "FINISHED"
        for key in METRICS:  # one series per metric, each iteration once
            assert [step for step, _, _ in _logged(client, orphan.info.run_id)[key]] == [1, 2, 3, 4], key
        _loads(latest_checkpoint(checkpoints))
