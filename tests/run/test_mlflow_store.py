"""The MLflow SQLite store a crash cannot half-create (`rllib_ragen.run.mlflow_store`): a half-migrated
store without runs is set aside and rebuilt, one with runs is never changed, two processes starting
together migrate once, and a kill mid-creation leaves no store rather than a broken one."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sqlalchemy
from alembic import command
from mlflow.store.db.utils import _get_alembic_config
from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase
from mlflow.tracking import MlflowClient

from rllib_ragen.run.mlflow_store import TrackingStoreError, ensure_store, sqlite_path
from rllib_ragen.run.tracking import MLflowTracker

ROOT = Path(__file__).resolve().parents[2]
# Left by a SIGKILL while MLflow created a store (see the README beside it); outside the repository.
FIXTURE = ROOT.parent / "shared" / "fixtures" / "mlflow_half_migrated.db"
# The migration MLflow stopped after, and the index the next one (bd07f7e963c5) creates.
STOPPED_AT, NEXT_INDEX = "c48cb773bb87", "index_params_run_uuid"
CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _half_migrated(path: Path, *, next_index: bool = True) -> Path:
    """A store MLflow's migrations stopped in: tables up to `STOPPED_AT`, and (`next_index`)
    the first statement of the next migration already run, as a kill leaves it."""
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    InitialBase.metadata.create_all(engine)
    config = _get_alembic_config(str(engine.url))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, STOPPED_AT)
    if next_index:
        with engine.begin() as connection:
            connection.exec_driver_sql(f"CREATE INDEX {NEXT_INDEX} ON params (run_uuid)")
    engine.dispose()
    return path


def _add_run(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute(
            "INSERT INTO runs (run_uuid, name, status, lifecycle_stage, experiment_id) "
            "VALUES (?, 'precious', 'FINISHED', 'active', 0)",
            ("a" * 32,),
        )
    connection.close()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(params=["built", "fixture"])
def broken_store(request, tmp_path) -> Path:
    """`<tmp>/mlflow.db`: half-migrated, no runs; built here, or the shared fixture's copy when present."""
    store = tmp_path / "mlflow.db"
    if request.param == "built":
        return _half_migrated(store)
    if not FIXTURE.is_file():
        pytest.skip(f"no {FIXTURE} (the built store covers the same case)")
    store.write_bytes(FIXTURE.read_bytes())
    return store


def test_a_half_migrated_store_without_runs_is_set_aside_and_the_run_starts(broken_store, tmp_path, capsys):
    uri = f"sqlite:///{broken_store}"
    probe = tmp_path / "probe.db"  # what MLflow alone makes of it: every process fails
    probe.write_bytes(broken_store.read_bytes())
    with pytest.raises(Exception, match=f"{NEXT_INDEX} already exists"):
        MlflowClient(f"sqlite:///{probe}").search_experiments()
    broken = _sha(broken_store)

    tracker = MLflowTracker(tracking_uri=uri, experiment="e")
    tracker.log_metrics({"m": 1.5}, step=1)

    (aside,) = tmp_path.glob("mlflow.db.broken-*")
    assert _sha(aside) == broken  # set aside as it was, not deleted
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("MLflow store:")]
    assert len(lines) == 1 and str(broken_store) in lines[0] and str(aside) in lines[0] and "no runs" in lines[0]
    # A new process (a new client) opens the new store and finds the run.
    history = MlflowClient(uri).get_metric_history(tracker.run_id, "m")
    assert [(m.step, m.value) for m in history] == [(1, 1.5)]
    assert not list(tmp_path.glob(".mlflow.db.partial-*"))


def test_a_store_with_runs_that_does_not_open_is_never_changed_and_the_error_names_it(tmp_path):
    store = _half_migrated(tmp_path / "mlflow.db")
    _add_run(store)
    before, files = _sha(store), sorted(p.name for p in tmp_path.iterdir())
    for _ in range(2):  # a second attempt finds it as the first left it
        with pytest.raises(TrackingStoreError) as error:
            MLflowTracker(tracking_uri=f"sqlite:///{store}", experiment="e")
        message = str(error.value)
        assert str(store) in message and "holds 1 run," in message and f"{NEXT_INDEX} already exists" in message
        assert "mlflow db upgrade" in message and "--tracking-uri" in message and "\n" not in message
    assert _sha(store) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".lock") == files  # nothing set aside or left


def test_the_driver_reports_a_store_with_runs_that_does_not_open_in_one_line_before_ray(tmp_path):
    store = _half_migrated(tmp_path / "mlflow.db")
    _add_run(store)
    before = _sha(store)
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    driver = [sys.executable, str(ROOT / "tuned_examples" / "bandit_starpo.py"), "--model", "tiny-random"]
    done = subprocess.run(
        driver, cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**CHILD_ENV, "RAY_TMPDIR": str(ray_tmp)}
    )
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: the MLflow store {store} does not open") and "mlflow db upgrade" in line
    assert _sha(store) == before and list(ray_tmp.iterdir()) == []


def test_a_store_at_an_older_schema_is_migrated_on_a_copy_and_keeps_its_runs(tmp_path, capsys):
    store = _half_migrated(tmp_path / "mlflow.db", next_index=False)  # older, but whole
    _add_run(store)
    ensure_store(f"sqlite:///{store}")
    assert "MLflow store: upgraded" in capsys.readouterr().out
    with sqlite3.connect(store) as connection:
        assert connection.execute("SELECT name FROM runs").fetchall() == [("precious",)]
    connection.close()
    assert not list(tmp_path.glob("mlflow.db.broken-*")) and not list(tmp_path.glob(".mlflow.db.partial-*"))
    MlflowClient(f"sqlite:///{store}").search_experiments()  # opens as it is now


# Imports, says it is ready, waits for the go, then opens the store through the tracker. The
# migration is slowed down and announced, so a second migrating process would overlap the first.
_OPENER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from rllib_ragen.run import mlflow_store
    from rllib_ragen.run.tracking import MLflowTracker

    uri, name, go, sleep_s = sys.argv[1:]
    migrate = mlflow_store._migrate
    def announced(path):
        print("migrating", flush=True)
        Path(name + ".migrating").touch()
        time.sleep(float(sleep_s))
        migrate(path)
    mlflow_store._migrate = announced
    Path(name + ".ready").touch()
    while not Path(go).exists():
        time.sleep(0.01)
    MLflowTracker(tracking_uri=uri, experiment="e").log_metrics({"m": 1.0}, step=1)
    """
)


def _opener(tmp_path: Path, name: str, *, go: Path, sleep_s: float) -> subprocess.Popen:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return subprocess.Popen(
        [sys.executable, "-c", _OPENER, uri, str(tmp_path / name), str(go), str(sleep_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env=CHILD_ENV,
        start_new_session=True,
    )


def _wait_for(paths: list[Path], processes: list[subprocess.Popen], *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        assert all(p.poll() is None for p in processes), [p.communicate()[0][-2000:] for p in processes]
        assert time.monotonic() < deadline, f"none of {paths} within {timeout_s} s"
        time.sleep(0.05)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def test_two_processes_opening_a_fresh_store_at_once_both_succeed_and_only_one_migrates(tmp_path):
    go = tmp_path / "go"
    processes = [_opener(tmp_path, name, go=go, sleep_s=2.0) for name in ("a", "b")]
    try:
        _wait_for([tmp_path / "a.ready", tmp_path / "b.ready"], processes, timeout_s=300)
        go.touch()  # both imported: they open the store together
        outputs = [process.communicate(timeout=300)[0] for process in processes]
    finally:
        for process in processes:
            _stop(process)
    assert [process.returncode for process in processes] == [0, 0], [o[-2000:] for o in outputs]
    assert sum(output.count("migrating") for output in outputs) == 1, outputs
    assert sum(output.count("MLflow store: creating") for output in outputs) == 1, outputs
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert len(client.search_runs([client.get_experiment_by_name("e").experiment_id])) == 2


def test_a_kill_while_the_store_is_created_leaves_no_store_and_the_next_run_creates_it(tmp_path):
    store = tmp_path / "mlflow.db"
    go = tmp_path / "go"
    go.touch()
    process = _opener(tmp_path, "a", go=go, sleep_s=600)
    try:
        _wait_for([tmp_path / "a.migrating"], [process], timeout_s=300)
    finally:
        _stop(process)  # SIGKILL mid-creation
    assert not store.exists() and len(list(tmp_path.glob(".mlflow.db.partial-*"))) == 1
    tracker = MLflowTracker(tracking_uri=f"sqlite:///{store}", experiment="e")
    tracker.log_metrics({"m": 2.0}, step=3)
    assert [m.step for m in MlflowClient(f"sqlite:///{store}").get_metric_history(tracker.run_id, "m")] == [3]
    assert not list(tmp_path.glob(".mlflow.db.partial-*")) and not list(tmp_path.glob("mlflow.db.broken-*"))


def test_only_sqlite_files_are_managed(tmp_path):
    assert sqlite_path(f"sqlite:///{tmp_path}/x.db?timeout=5") == tmp_path / "x.db"
    assert sqlite_path("sqlite:///relative.db") == Path("relative.db")
    for uri in ("http://127.0.0.1:1", f"file://{tmp_path}/mlruns", "sqlite:///:memory:", "postgresql://h/db"):
        assert sqlite_path(uri) is None
        ensure_store(uri)  # passes through: no connection, no file
    assert list(tmp_path.iterdir()) == []
