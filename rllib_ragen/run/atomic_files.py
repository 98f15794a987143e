"""Files and directories that are complete or absent: written under a temporary name, then renamed.

A process killed while writing leaves a `.NAME.partial-*` entry beside the
target, never a truncated target; the next write of the same target removes
such leftovers (one writer per target: a run writes its own outputs). Data is
flushed to disk before the rename, so the name can't reach the disk before
the data it stands for. A directory write that runs out of space deletes its
temporary copy and raises a `DiskFullError` naming the target and the space it needs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rllib_ragen.run.disk_space import DiskFullError, disk_full_error, is_disk_full, tree_bytes


def partial_prefix(target: Path) -> str:
    """The name prefix of `target`'s temporary copies: `.NAME.partial-`."""
    return f".{target.name}.partial-"


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Writes `text` to `path` (parent dirs created): the old content or the new, never part of it.

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_partials(path)
    fd, name = tempfile.mkstemp(prefix=partial_prefix(path), dir=path.parent)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(name, 0o644)  # mkstemp makes it private; an output is for everyone who reads the run
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    fsync_path(path.parent)
    return path


def write_dir_atomic(target: str | Path, fill: Callable[[Path], Any]) -> Path:
    """Replaces directory `target` by what `fill(empty_dir)` writes: the old directory or the new one.

    The new one is filled under a temporary name, flushed, and renamed into
    place; an old `target` is moved aside first and deleted last (a kill
    between the two renames leaves no `target`, never a partial one).

    Args:
        target: The directory to (re)place; its parent is created when missing.
        fill: Writes the content into the empty directory it is given.

    Returns:
        `target`.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_partials(target)
    partial = Path(tempfile.mkdtemp(prefix=partial_prefix(target), dir=target.parent))
    try:
        fill(partial)
        fsync_tree(partial)
        partial.chmod(0o755)  # mkdtemp makes it private; a model or artifact is read by other processes
        old = Path(tempfile.mkdtemp(prefix=f"{partial_prefix(target)}old-", dir=target.parent))
        if target.exists():
            os.replace(target, old)  # onto the empty directory mkdtemp made
        os.rename(partial, target)
    except BaseException as error:
        written = tree_bytes(partial)
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(error, Exception) and is_disk_full(error):
            raise _dir_disk_full(target, written) from error
        raise
    fsync_path(target.parent)
    shutil.rmtree(old, ignore_errors=True)
    return target


def _dir_disk_full(target: Path, written: int) -> DiskFullError:
    """The error of a directory write that ran out of space: it needs about the size of the `target`
    it replaces, or at least the `written` bytes when there is none."""
    size = tree_bytes(target)
    return disk_full_error(
        target,
        what="the directory",
        needs_bytes=size or written,
        at_least=size == 0,
        then="run the command again (a training run: with --resume)",
    )


def remove_partials(target: Path) -> None:
    """Deletes the temporary copies of `target` that killed writers left."""
    for leftover in target.parent.glob(f"{partial_prefix(target)}*"):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def fsync_tree(root: Path) -> None:
    """Flushes every file and directory under `root` to disk, so a name or marker written
    after this can't reach the disk before the data it vouches for."""
    for path in root.rglob("*"):
        if path.is_file():
            fsync_path(path)
    for directory in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        fsync_path(directory)


def fsync_path(path: str | Path) -> None:
    """Flushes a file's or a directory's entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
