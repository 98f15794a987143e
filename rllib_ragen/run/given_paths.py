"""The paths and servers a user names, checked before any work starts (no Ray, no torch imported).

A checkpoint directory that cannot be written fails a run at its first checkpoint, minutes or
hours in; a tracking server that does not answer makes MLflow retry for minutes. Each check
here raises a `UserError` (one `error:` line, `envs.user_errors`) naming the flag and the path.
"""

from __future__ import annotations

import argparse
import os
import urllib.error
import urllib.request
from pathlib import Path

from envs.user_errors import UserError

SQLITE_PREFIX = "sqlite:///"
RLLIB_CHECKPOINT_FILE = "rllib_checkpoint.json"  # RLlib's marker of a checkpoint directory
# How long a tracking server may take to answer its health check before the command gives up on it.
TRACKING_ANSWER_TIMEOUT_S = 5.0


def check_writable_dir(path: str | Path, *, flag: str) -> None:
    """Raises UserError unless `path` is a directory this process can write, or can be created as one."""
    problem = unwritable_reason(Path(path))
    if problem is not None:
        raise UserError(f"{flag} {path} cannot be used: {problem}")


def unwritable_reason(directory: Path) -> str | None:
    """Why `directory` can neither be written nor created (None: it can)."""
    directory = directory.expanduser().absolute()
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"no write permission on {existing}"
    return None


def output_file(text: str) -> Path:
    """An argparse type: a file path whose directory exists, or can be created, and can be written."""
    path = Path(text).expanduser()
    problem = f"{path} is a directory" if path.is_dir() else unwritable_reason(path.parent)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text} cannot be written: {problem}")
    return path


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI; None for other URIs and in-memory databases."""
    if not tracking_uri.startswith(SQLITE_PREFIX):
        return None
    path = tracking_uri[len(SQLITE_PREFIX) :].partition("?")[0]
    return None if path in ("", ":memory:") else Path(path)


def check_tracking_uri(uri: str, *, timeout_s: float = TRACKING_ANSWER_TIMEOUT_S) -> None:
    """Raises UserError unless `uri`'s SQLite file can be written, or its server answers within `timeout_s`."""
    database = sqlite_path(uri)
    if database is not None:
        if database.is_dir():
            raise UserError(f"--tracking-uri {uri}: {database} is a directory, not an SQLite file")
        problem = unwritable_reason(database.parent)
        if problem is not None:
            raise UserError(f"--tracking-uri {uri} cannot be used: {problem}")
    elif uri.startswith(("http://", "https://")):
        _check_answers(uri, timeout_s=timeout_s)


def existing_store(uri: str) -> None:
    """Raises UserError if `uri` names an SQLite store that does not exist (reading one would create it empty)."""
    database = sqlite_path(uri)
    if database is not None and not database.is_file():
        raise UserError(f"no MLflow store at {database} (tracking URI {uri})")


def _check_answers(uri: str, *, timeout_s: float) -> None:
    """Raises UserError unless the server at `uri` gives any HTTP answer to `/health` within `timeout_s`."""
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return  # an answer: the server is there (MLflow's own calls report what it refuses)
    except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
        reason = getattr(error, "reason", error)
        raise UserError(
            f"the MLflow tracking server {uri} did not answer within {timeout_s:g} s ({reason}): "
            "start it, or pass another --tracking-uri"
        ) from None


def check_resumable(checkpoint: Path) -> None:
    """Raises UserError unless the complete checkpoint `--resume` picked holds an RLlib checkpoint."""
    from rllib_ragen.run.checkpoints import TRACKING_FILE

    missing = [name for name in (RLLIB_CHECKPOINT_FILE, TRACKING_FILE) if not (checkpoint / name).is_file()]
    if missing:
        raise UserError(
            f"--resume: {checkpoint} is marked complete but is not a StarPO checkpoint (no {', '.join(missing)}): "
            "move it away, or pass another --checkpoint-dir"
        )
