"""Crash safety: a checkpoint is complete or ignored, metrics reach MLflow
exactly once per step, Ctrl-C checkpoints before it stops, and a tuned example
SIGKILLed mid-run resumes with the same iteration counter, seed stream,
optimiser state and MLflow run."""

from __future__ import annotations

import contextlib
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
from ray.rllib.core import DEFAULT_MODULE_ID
from run_helpers import ROOT, driver_args, tiny_config

from rllib_ragen.lora import is_adapter_weight
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
from rllib_ragen.run.tracking import MLflowTracker, metrics_from_json
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
# reset of a Bandit from seed FIRST_HELD_SEED on (iteration KILLED_IN's rollout) writes MARKER and waits
# there until the test kills it: the kill lands after iteration KILLED_IN - 1, before any later checkpoint.
HELD_DRIVER = """
import runpy, sys, time
from pathlib import Path

from envs.bandit import BanditEnv

MARKER, FIRST_HELD_SEED, SCRIPT = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
reset = BanditEnv.reset


def held_reset(self, *args, seed=None, **kwargs):
    if seed is not None and seed >= FIRST_HELD_SEED and not MARKER.exists():
        MARKER.write_text(str(seed))
        while True:
            time.sleep(1)
    return reset(self, *args, seed=seed, **kwargs)


BanditEnv.reset = held_reset
sys.argv = [SCRIPT, *sys.argv[4:]]
runpy.run_path(SCRIPT, run_name="__main__")
"""


def _driver_command(tmp_path: Path, model_path: Path, store: str, *extra: str, lora_rank: int = 0) -> list[str]:
    """The tuned example, held in iteration KILLED_IN's rollout the first time (`tmp_path / "held"` says when)."""
    driver = tmp_path / "held_driver.py"
    driver.write_text(HELD_DRIVER)
    first_held_seed = TRAIN_SEED_START + N_GROUPS * (KILLED_IN - 1)
    return [
        sys.executable, str(driver), str(tmp_path / "held"), str(first_held_seed),
        str(ROOT / "tuned_examples" / "bandit_starpo.py"), "--model", str(model_path),
        "--engine", "hf", "--no-warm-start", "--n-groups", str(N_GROUPS), "--group-size", "2",
        "--set", "response_length=8", "--set", "eval_interval=0", "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--tracking-uri", store, "--experiment", "kill", "--stop-iters", str(STOP_ITERS),
        "--checkpoint-every", str(CHECKPOINT_EVERY), "--set", f"lora_rank={lora_rank}",
        # The held reset blocks the rollout itself, not a worker thread that a timeout would abandon.
        "--set", "env_step_timeout_s=None", *extra,
    ]  # fmt: skip


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


def _module_state(checkpoint: Path) -> dict:
    path = checkpoint / "learner_group" / "learner" / "rl_module" / DEFAULT_MODULE_ID / "module_state.pkl"
    return pickle.loads(path.read_bytes())


def _next_train_seed(checkpoint: Path) -> int:
    # The algorithm's own state (its sampler's seed cursor), beside its components' directories.
    return pickle.loads((checkpoint / "algorithm_state.pkl").read_bytes())["next_train_seed"]


METRICS = ("training_iteration", "env_runners/episode_return_mean", "learners/default_policy/entropy")


def _logged(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float, int]]]:
    """Each of METRICS's MLflow records (step, value, timestamp), in step order."""
    return {
        key: sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key)) for key in METRICS
    }


@pytest.mark.slow
@pytest.mark.parametrize("lora_rank", [0, 8], ids=["full", "lora8"])
def test_sigkill_mid_run_then_resume_continues_with_each_iteration_logged_once(tiny_model_path, tmp_path, lora_rank):
    checkpoints, store = tmp_path / "ckpt", f"sqlite:///{tmp_path / 'mlflow.db'}"
    # Own Ray temp dir (short: Ray's socket paths must stay under 107 bytes) and
    # a local Ray per driver, never another test's cluster.
    ray_tmp = tempfile.mkdtemp(prefix="rk", dir="/tmp")
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_ADDRESS="local", RAY_TMPDIR=ray_tmp, PYTHONUNBUFFERED="1")
    logs = {name: tmp_path / f"{name}.log" for name in ("killed", "resumed")}
    command = _driver_command(tmp_path, tiny_model_path, store, lora_rank=lora_rank)
    try:
        with open(logs["killed"], "wb") as log:
            killed = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path, env=env
            )
            try:
                held = (tmp_path / "held").exists
                _wait(held, timeout_s=240, what=f"rollout of iteration {KILLED_IN}", process=killed)
            finally:
                _kill_session(killed)
        # Ray's processes share the driver's fate: none outlives the kill.
        _wait(lambda: not _session_pids(killed.pid), timeout_s=20, what="end of the killed driver's processes")
        killed_output = logs["killed"].read_text()
        progress = [line.split("]")[0] + "]" for line in killed_output.splitlines() if line.startswith("[")]
        assert progress == [f"[{i}/{STOP_ITERS}]" for i in range(1, KILLED_IN)], killed_output[-3000:]
        last = latest_checkpoint(checkpoints)
        restored = checkpoint_iteration(last)
        assert restored == CHECKPOINT_EVERY  # iteration 3 is done, but no checkpoint covers it: it is redone
        adam_steps_per_iteration = _adam_steps(last) / restored
        # Under LoRA the checkpoint's module state is the adapters alone.
        assert all(is_adapter_weight(name) for name in _module_state(last)) == (lora_rank > 0)
        assert adam_steps_per_iteration >= 1 and _next_train_seed(last) == TRAIN_SEED_START + N_GROUPS * restored
        client = MlflowClient(store)
        run_id = tracking_state(last)["run_id"]
        # The metrics of the checkpointed iterations, and nothing past the checkpoint, were logged.
        before_resume = _logged(client, run_id)
        assert all([step for step, _, _ in before_resume[key]] == [1, 2] for key in METRICS), before_resume

        with open(logs["resumed"], "wb") as log:
            resumed = subprocess.Popen(
                [*command, "--resume"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=tmp_path, env=env,
            )
            try:
                resumed.wait(timeout=240)
            finally:
                _kill_session(resumed)
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
