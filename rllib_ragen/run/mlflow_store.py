"""An MLflow SQLite store that a crash cannot leave half-created.

MLflow creates and migrates a SQLite store in place, with DDL that is not
transactional (mlflow/mlflow#5787): a process killed meanwhile leaves a store
that every later process fails to open (`index ... already exists`). Here a
new store is created, and an older one migrated, on a copy beside it
(`.mlflow.db.partial-*`) that `os.replace` moves into place, under a file
lock so that processes starting together migrate once: `mlflow.db` is absent
or complete.

A store that still fails to open (e.g. left half-migrated by an older
version) is set aside as `mlflow.db.broken-<time>` and rebuilt when it holds
no runs; one holding runs is never changed: `TrackingStoreError` names it and
says how to repair it. Other URIs (http, file, other databases) pass through.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import tempfile
import time
from pathlib import Path

import filelock
from mlflow.store.db.utils import _get_latest_schema_revision
from mlflow.tracking import MlflowClient

from envs.user_errors import UserError
from rllib_ragen.run.atomic_files import fsync_path, partial_prefix, remove_partials
from rllib_ragen.run.given_paths import SQLITE_PREFIX, sqlite_path

# SQLite's files beside a database: a hot journal left by a kill is rolled
# back into whichever database later bears the name, so it moves with its own.
_COMPANIONS = ("-journal", "-wal", "-shm")


class TrackingStoreError(UserError, ValueError):
    """A local MLflow store that fails to open and holds runs (never changed by this package),
    or a tracking URI that cannot be used: reported as one `error:` line (`envs.user_errors`)."""


def artifact_location_for(tracking_uri: str) -> str | None:
    """`<database dir>/mlruns` for a SQLite store; None (the server's choice) otherwise.

    MLflow's default artifact root for a database store is `./mlruns` of the
    process's working directory, so a run tracked in `/tmp/x/mlflow.db` would
    scatter its artifacts into whatever directory the job started in.
    """
    path = sqlite_path(tracking_uri)
    return None if path is None else (path.resolve().parent / "mlruns").as_uri()


def tracking_client(tracking_uri: str) -> MlflowClient:
    """An `MlflowClient` of `tracking_uri`, its SQLite store made complete first (`ensure_store`)."""
    ensure_store(tracking_uri)
    return MlflowClient(tracking_uri)


def ensure_store(tracking_uri: str) -> None:
    """Makes the SQLite store of `tracking_uri` exist at MLflow's schema; other URIs are left alone.

    Raises:
        TrackingStoreError: the store fails to open and holds runs.
    """
    path = sqlite_path(tracking_uri)
    if path is None or _is_current(path):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(f"{path}.lock"):
        if _is_current(path):  # another process made it while we waited
            return
        remove_partials(path)  # of killed creations: only the lock holder makes them
        if not path.exists():
            print(f"MLflow store: creating {path}", flush=True)
            _migrate_into_place(path, source=None)
        else:
            _upgrade_or_rebuild(path)


def _upgrade_or_rebuild(path: Path) -> None:
    """Migrates an existing store that is not at MLflow's schema; when that fails, sets it aside
    and starts a new one if it holds no runs."""
    try:
        _migrate_into_place(path, source=path)
    except Exception as error:  # whatever MLflow raises: the store does not open
        _rebuild_if_empty(path, reason=_first_line(error))
        return
    print(f"MLflow store: upgraded {path} to this MLflow's schema", flush=True)


def _rebuild_if_empty(path: Path, *, reason: str) -> None:
    """Sets a store that does not open aside and creates a new one, unless it holds runs.

    Raises:
        TrackingStoreError: it holds runs (or can't be read to tell): it is left as it is.
    """
    runs = _run_count(path)
    if runs != 0:
        held = "data that cannot be read" if runs is None else f"{runs} run{'' if runs == 1 else 's'}"
        raise TrackingStoreError(
            f"the MLflow store {path} does not open ({reason}) and holds {held}, so it is left as it is: "
            f"back it up, then repair it with `mlflow db upgrade sqlite:///{path}` or move it away, "
            "or pass another --tracking-uri"
        )
    aside = path.with_name(f"{path.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    for suffix in ("", *_COMPANIONS):
        with contextlib.suppress(FileNotFoundError):
            os.rename(f"{path}{suffix}", f"{aside}{suffix}")
    print(f"MLflow store: {path} did not open ({reason}) and held no runs: set aside as {aside}; creating a new one")
    _migrate_into_place(path, source=None)


def _first_line(error: Exception) -> str:
    # SQLAlchemy's messages go on with the SQL statement and a link.
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def _migrate_into_place(path: Path, *, source: Path | None) -> None:
    """Creates (from scratch, or from a copy of `source`) and migrates a store under a temporary
    name beside `path`, then moves it into place: a kill leaves at most a `.partial-` file."""
    fd, name = tempfile.mkstemp(prefix=partial_prefix(path), dir=path.parent)
    os.close(fd)
    partial = Path(name)
    try:
        if source is not None:
            _copy_database(source, partial)
        _migrate(partial)
        # mkstemp makes it private; the store keeps its mode (a new one: readable by all, as sqlite makes it).
        partial.chmod(0o644 if source is None else source.stat().st_mode & 0o777)
        fsync_path(partial)
        os.replace(partial, path)
        fsync_path(path.parent)
    finally:
        for suffix in ("", *_COMPANIONS):
            Path(f"{partial}{suffix}").unlink(missing_ok=True)


def _migrate(path: Path) -> None:
    """What MLflow does when it opens a store: create the tables, migrate them to its schema."""
    # Deferred: the SQLAlchemy store (and alembic) take seconds to import and only this path needs them.
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(f"{SQLITE_PREFIX}{path}", artifact_location_for(f"{SQLITE_PREFIX}{path}"))
    # Closes its connections, so nothing is open on the file once it is renamed.
    store.engine.dispose()


def _copy_database(source: Path, target: Path) -> None:
    """A consistent copy of `source` (SQLite's backup; it rolls back a hot journal of a killed writer)."""
    with (
        contextlib.closing(sqlite3.connect(_existing(source), uri=True)) as src,
        contextlib.closing(sqlite3.connect(target)) as dst,
    ):
        src.backup(dst)


def _is_current(path: Path) -> bool:
    """Whether `path` is a store at the schema this MLflow writes (plain sqlite3: nothing is migrated)."""
    return path.is_file() and _query(path, "SELECT version_num FROM alembic_version") == [(_schema_head(),)]


@functools.cache
def _schema_head() -> str:
    # MLflow's newest migration; reading its migration scripts takes a moment, once per process.
    return _get_latest_schema_revision()


def _run_count(path: Path) -> int | None:
    """Runs in the store (0 without a `runs` table); None when the file is no readable database."""
    tables = _query(path, "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'runs'")
    if tables is None or not tables:
        return None if tables is None else 0
    rows = _query(path, "SELECT COUNT(*) FROM runs")
    return None if rows is None else int(rows[0][0])


def _query(path: Path, sql: str) -> list[tuple] | None:
    """The rows of `sql` on an existing database file; None when it can't be read."""
    try:
        with contextlib.closing(sqlite3.connect(_existing(path), uri=True)) as connection:
            return connection.execute(sql).fetchall()
    except sqlite3.Error:
        return None


def _existing(path: Path) -> str:
    # An SQLite URI that opens the file without creating it (plain sqlite3.connect would make an empty one).
    return f"{path.resolve().as_uri()}?mode=rw"
