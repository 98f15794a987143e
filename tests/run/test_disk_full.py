"""A full disk, on a small tmpfs the test mounts (as root): a directory write that runs out of space
raises one clear `DiskFullError` naming the target and the space it needs, deletes its half-written
copy and keeps the previous version; a full disk is recognised under another library's exception."""

from __future__ import annotations

import errno
import os

import pytest
from run_helpers import small_filesystem

from rllib_ragen.run.atomic_files import write_dir_atomic
from rllib_ragen.run.disk_space import DiskFullError, is_disk_full


def _write_megabytes(count: int):
    def fill(out):
        (out / "weights.bin").write_bytes(os.urandom(count * 1_000_000))

    return fill


def test_a_directory_write_that_fills_the_disk_names_the_space_it_needs_and_keeps_the_old_one(tmp_path):
    with small_filesystem(tmp_path / "disk", megabytes=4) as disk:
        target = write_dir_atomic(disk / "policy", _write_megabytes(1))
        old = (target / "weights.bin").read_bytes()
        with pytest.raises(DiskFullError) as raised:
            write_dir_atomic(target, _write_megabytes(5))
        message = str(raised.value)
        assert "\n" not in message and raised.value.errno == errno.ENOSPC
        assert message.startswith(f"no space left on the device for the directory {target}: it needs about 1.0 MB,")
        assert is_disk_full(raised.value.__cause__)
        # The half-written copy is gone (its space given back), the old directory untouched.
        assert sorted(p.name for p in disk.iterdir()) == ["policy"] and (target / "weights.bin").read_bytes() == old
        with pytest.raises(DiskFullError, match=r"directory .*/fresh: it needs at least [0-9.]+ MB"):
            write_dir_atomic(disk / "fresh", _write_megabytes(5))  # nothing to compare with: a lower bound


def test_a_full_disk_is_recognised_through_the_exceptions_raised_from_it():
    full = OSError(errno.ENOSPC, "No space left on device")
    try:
        try:
            raise full
        except OSError as error:
            raise RuntimeError("file write failed") from error
    except RuntimeError as wrapped:
        assert is_disk_full(wrapped)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied")) and not is_disk_full(ValueError("x"))
