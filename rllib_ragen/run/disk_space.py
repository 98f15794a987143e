"""A write that runs out of disk space, as one clear error: what was being written, and the space it needs.

A full disk shows up as an OSError with errno ENOSPC (EDQUOT past a quota), sometimes wrapped
in another library's exception. The writers of `rllib_ragen.run.checkpoints` and
`rllib_ragen.run.atomic_files` turn it into a `DiskFullError` naming the path and the free space
needed, after deleting what they had half-written (which frees that space again and leaves the
previous version of the target in place).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from envs.user_errors import UserError

_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(UserError, OSError):
    """No space left for a write of this package; the message names the path and the space needed.

    An OSError with errno ENOSPC, so code that handles a full disk as such still does, and a
    `UserError`: the entry points report it as one `error:` line (the user frees space and resumes).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.errno = errno.ENOSPC


def is_disk_full(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from or while handling, is "no space left"."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno in _FULL:
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def disk_full_error(target: Path, *, what: str, needs_bytes: int, at_least: bool, then: str) -> DiskFullError:
    """The error of a write of `what` to `target` that ran out of space (call it after deleting the half-written copy).

    Args:
        target: The path being written.
        what: What it is, e.g. "the checkpoint".
        needs_bytes: Its size: an estimate, or (`at_least`) what had been written when the space ran out.
        at_least: Whether `needs_bytes` is only a lower bound.
        then: What to do once space is freed.
    """
    free = free_bytes(target)
    needed = f"{'at least' if at_least else 'about'} {megabytes(needs_bytes)}"
    shortfall = needs_bytes - free
    to_free = f"free at least {megabytes(shortfall)} more" if shortfall > 0 else "free some space"
    return DiskFullError(
        f"no space left on the device for {what} {target}: it needs {needed}, and "
        f"{megabytes(free)} is free there; {to_free}, then {then}"
    )


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged process may still write on the file system of `path` (or of its nearest parent)."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    stats = os.statvfs(existing)
    return stats.f_bavail * stats.f_frsize


def tree_bytes(root: Path) -> int:
    """Bytes of the files under `root` (0 when it is missing)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def megabytes(count: int) -> str:
    """`count` bytes as `12.3 MB`."""
    return f"{count / 1e6:.1f} MB"
