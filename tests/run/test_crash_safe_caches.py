"""What start-up writes is complete or absent after a SIGKILL at any moment: model builds and warm
starts in the model cache, checkpoints, the final policy, MLflow artifacts and other outputs. A
killed write leaves a `.partial-` entry that is never taken for the real one and is cleared by
the next write."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rllib_ragen.models import MARKER_FILE, BuiltinModel, ModelNotFoundError, prepare_builtin, read_marker
from rllib_ragen.run.atomic_files import write_dir_atomic, write_text_atomic
from rllib_ragen.run.checkpoints import COMPLETE_MARKER, latest_checkpoint, save_checkpoint, tracking_state
from rllib_ragen.run.tracking import MLflowTracker

ROOT = Path(__file__).resolve().parents[2]
CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _killed_mid_write(script: str, *args: str, started: Path) -> None:
    """Runs `script` in its own process group, SIGKILLs the group once it touched `started`."""
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args, str(started)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=CHILD_ENV,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while not started.exists():
            assert process.poll() is None, process.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the child never started its write"
            time.sleep(0.05)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL


# A build that writes half a model, says so, and sleeps until it is killed.
_SLOW_BUILD = """
    import sys, time
    from pathlib import Path
    from rllib_ragen.models import BuiltinModel, prepare_builtin

    models_dir, name, started = sys.argv[1:]

    def build(out_dir, report):
        (out_dir / "pytorch_model.bin").write_bytes(b"half")
        report("half the weights")
        Path(started).touch()
        time.sleep(600)

    model = BuiltinModel(name=name, description="slow", source="test", n_steps=2, build=build)
    prepare_builtin(model, models_dir=Path(models_dir))
"""


def _builtin(name: str, calls: list[Path]) -> BuiltinModel:
    def build(out_dir: Path, report) -> None:
        calls.append(out_dir)
        (out_dir / "pytorch_model.bin").write_bytes(b"whole")
        report("weights")
        (out_dir / "config.json").write_text("{}")
        report("config")

    return BuiltinModel(name=name, description="fast", source="test", n_steps=2, build=build)


@pytest.mark.parametrize("name", ["slow-model", "warm-start-0123456789ab"])
def test_a_model_build_killed_midway_is_never_reused_and_the_next_run_builds_it_whole(tmp_path, name):
    models = tmp_path / "models"
    _killed_mid_write(_SLOW_BUILD, str(models), name, started=tmp_path / "started")
    target = models / name
    assert not target.exists()  # not in place: readers find no entry rather than half of one
    (partial,) = models.glob(f".{name}.partial-*")
    assert (partial / "pytorch_model.bin").read_bytes() == b"half" and not (partial / MARKER_FILE).exists()
    with pytest.raises(ModelNotFoundError, match="not a complete built-in model"):
        read_marker(target)

    calls: list[Path] = []
    path = prepare_builtin(_builtin(name, calls), models_dir=models)
    assert path == target.resolve() and read_marker(path)["name"] == name
    assert (path / "pytorch_model.bin").read_bytes() == b"whole" and (path / "config.json").is_file()
    assert calls[0].name.startswith(f".{name}.partial-")  # built under a temporary name, renamed last
    assert not list(models.glob(f".{name}.partial-*"))
    # A complete entry is reused: no second build.
    assert prepare_builtin(_builtin(name, calls), models_dir=models) == path and len(calls) == 1


def test_an_entry_without_its_marker_is_rebuilt_not_reused(tmp_path):
    models, calls = tmp_path / "models", []
    unmarked = models / "copied-model"
    unmarked.mkdir(parents=True)
    (unmarked / "pytorch_model.bin").write_bytes(b"half")  # e.g. copied by hand, or by an old version
    path = prepare_builtin(_builtin("copied-model", calls), models_dir=models)
    assert len(calls) == 1 and (path / "pytorch_model.bin").read_bytes() == b"whole"
    assert (path / MARKER_FILE).is_file()


def test_the_warm_start_is_built_into_a_marker_checked_cache_entry(tiny_model_path, tmp_path, monkeypatch):
    from rllib_ragen.run import warm_start as ws

    calls: list[Path] = []

    def fake_training(base_path, config, out_dir, report):  # the BC run, without Ray
        calls.append(out_dir)
        (out_dir / "config.json").write_text("{}")
        (out_dir / "pytorch_model.bin").write_bytes(b"weights")  # a reused entry is checked to hold a model
        for step in range(config.num_steps):
            report(f"step {step}")

    monkeypatch.setattr(ws, "_train", fake_training)
    config = ws.WarmStartSettings(env="bandit", num_examples=2, epochs=1)
    cache = tmp_path / "cache"
    name = f"warm-start-{config.fingerprint(str(tiny_model_path))}"
    leftover = cache / "models" / f".{name}.partial-killed"  # what a killed warm start leaves
    leftover.mkdir(parents=True)
    path = ws.warm_start(str(tiny_model_path), config, cache_dir=cache)
    assert path == (cache / "models" / name).resolve() and read_marker(path)["name"] == name
    assert calls[0].name.startswith(f".{name}.partial-") and not leftover.exists()
    assert ws.warm_start(str(tiny_model_path), config, cache_dir=cache) == path and len(calls) == 1


class _Algo:
    """What `save_checkpoint` uses of an algorithm: its iteration and `save_to_path`."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def save_to_path(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "state.pkl").write_bytes(b"state %d" % self.iteration)


_SLOW_CHECKPOINT = """
    import sys, time
    from pathlib import Path
    from rllib_ragen.run.checkpoints import save_checkpoint

    checkpoints, started = sys.argv[1:]

    class SlowAlgo:
        iteration = 2
        def save_to_path(self, path):
            Path(path).mkdir(parents=True, exist_ok=True)
            (Path(path) / "state.pkl").write_bytes(b"half")
            Path(started).touch()
            time.sleep(600)

    save_checkpoint(SlowAlgo(), checkpoints, tracking={"run_id": "r", "metrics": []})
"""


def test_a_checkpoint_killed_midway_is_never_resumed_from(tmp_path):
    checkpoints = tmp_path / "ckpt"
    first = save_checkpoint(_Algo(1), checkpoints, tracking={"run_id": "r", "metrics": []})
    _killed_mid_write(_SLOW_CHECKPOINT, str(checkpoints), started=tmp_path / "started")
    assert latest_checkpoint(checkpoints) == first
    (partial,) = checkpoints.glob(".partial-iter_000002")
    assert not (partial / COMPLETE_MARKER).exists()
    second = save_checkpoint(_Algo(2), checkpoints, tracking={"run_id": "r", "metrics": [["m", 1.0, 0, 2]]})
    assert latest_checkpoint(checkpoints) == second and (second / "state.pkl").read_bytes() == b"state 2"
    assert tracking_state(second)["metrics"] == [["m", 1.0, 0, 2]]
    assert not (checkpoints / ".partial-iter_000002").exists()


_SLOW_DIRECTORY = """
    import sys, time
    from pathlib import Path
    from rllib_ragen.run.atomic_files import write_dir_atomic

    target, started = sys.argv[1:]

    def fill(out):
        (out / "model.safetensors").write_bytes(b"half")
        Path(started).touch()
        time.sleep(600)

    write_dir_atomic(target, fill)
"""


def test_a_directory_replaced_by_a_killed_writer_keeps_its_old_content(tmp_path):
    policy = tmp_path / "final_policy"  # as the final policy beside the checkpoints
    write_dir_atomic(policy, lambda out: (out / "model.safetensors").write_bytes(b"old"))
    _killed_mid_write(_SLOW_DIRECTORY, str(policy), started=tmp_path / "started")
    assert [p.name for p in policy.iterdir()] == ["model.safetensors"]
    assert (policy / "model.safetensors").read_bytes() == b"old"
    assert len(list(tmp_path.glob(".final_policy.partial-*"))) >= 1
    write_dir_atomic(policy, lambda out: (out / "config.json").write_text("{}"))
    assert [p.name for p in policy.iterdir()] == ["config.json"]  # replaced, not merged
    assert not list(tmp_path.glob(".final_policy.partial-*"))


def test_a_text_file_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    summary = write_text_atomic(tmp_path / "out" / "summary.json", '{"done": 1}')

    def killed(*args):
        raise KeyboardInterrupt  # stands for a kill after the data was written, before the rename

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(summary, '{"done": 2}')
    monkeypatch.undo()
    assert summary.read_text() == '{"done": 1}' and [p.name for p in summary.parent.iterdir()] == ["summary.json"]
    assert oct(summary.stat().st_mode & 0o777) == oct(0o644)


def _tracker(tmp_path: Path) -> tuple[MLflowTracker, Path]:
    tracker = MLflowTracker(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="e")
    artifacts = Path(tracker.client.get_run(tracker.run_id).info.artifact_uri.removeprefix("file://"))
    return tracker, artifacts


def test_an_mlflow_directory_artifact_is_logged_whole_or_not_at_all(tmp_path, monkeypatch):
    tracker, artifacts = _tracker(tmp_path)
    first, second = tmp_path / "v1", tmp_path / "v2"
    for directory, names in ((first, ["a.bin", "b.bin"]), (second, ["c.bin", "d.bin"])):
        directory.mkdir()
        for name in names:
            (directory / name).write_text(name)
    tracker.log_artifacts(first, "final_policy")
    copytree = shutil.copytree

    def killed_after_one_file(src, dst, **kwargs):
        shutil.copy2(Path(src) / "c.bin", dst)
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "copytree", killed_after_one_file)
    with pytest.raises(KeyboardInterrupt):
        tracker.log_artifacts(second, "final_policy")
    monkeypatch.setattr(shutil, "copytree", copytree)
    assert sorted(p.name for p in (artifacts / "final_policy").iterdir()) == ["a.bin", "b.bin"]
    tracker.log_artifacts(second, "final_policy")
    listed = MlflowClient(tracker.tracking_uri).list_artifacts(tracker.run_id, "final_policy")
    assert sorted(Path(f.path).name for f in listed) == ["c.bin", "d.bin"]  # replaced: nothing half-logged
    assert not [p for p in artifacts.iterdir() if ".partial-" in p.name]


def test_a_trajectory_page_reaches_the_mlflow_store_only_whole(tmp_path, monkeypatch):
    # MLflow's local artifact store writes a file to a temporary name and renames it: what this
    # package relies on for its trajectory pages (logged with log_text).
    tracker, artifacts = _tracker(tmp_path)
    tracker.log_text("<html>iteration 4</html>", "trajectories/eval_iter_0004.html")

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        tracker.log_text("<html>iteration 6</html>", "trajectories/eval_iter_0006.html")
    monkeypatch.undo()
    assert [p.name for p in (artifacts / "trajectories").iterdir()] == ["eval_iter_0004.html"]


class _Policy:
    """What `MLflowCallback.finish` uses of an algorithm: its iteration and `export_policy`."""

    iteration = 3

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail

    def export_policy(self, directory: Path) -> Path:
        (Path(directory) / "model.safetensors").write_bytes(b"policy")
        if self.fail:
            raise KeyboardInterrupt  # stands for a kill mid-export
        (Path(directory) / "config.json").write_text("{}")
        return Path(directory)


def test_the_final_policy_beside_the_checkpoints_and_in_mlflow_is_whole_or_the_previous_one(tmp_path):
    from rllib_ragen.run.callbacks import FINAL_POLICY, MLflowCallback, MLflowSettings

    tracker, artifacts = _tracker(tmp_path)
    settings = MLflowSettings(tracking_uri=tracker.tracking_uri, experiment="e", checkpoint_dir=str(tmp_path / "ckpt"))
    callback = MLflowCallback(settings)
    callback.tracker = tracker
    with pytest.raises(KeyboardInterrupt):
        callback.finish(_Policy(fail=True))
    assert not (tmp_path / "ckpt" / FINAL_POLICY).exists() and not list((tmp_path / "ckpt").iterdir())
    callback.finish(_Policy())  # what --resume does after such a kill
    for policy in (tmp_path / "ckpt" / FINAL_POLICY, artifacts / FINAL_POLICY):
        assert sorted(p.name for p in policy.iterdir()) == ["config.json", "model.safetensors"], policy
    assert tracker.client.get_run(tracker.run_id).info.status == "FINISHED"
