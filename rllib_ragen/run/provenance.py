"""Where a measurement comes from: date, commit, machine and command, written above every result file."""

from __future__ import annotations

import datetime
import os
import shlex
import subprocess
import sys
from pathlib import Path

from rllib_ragen.hardware import cpu_flags, cpu_model, fast_bf16


def commit(repo: Path) -> str:
    """The checkout's short commit, with "+changes" when the work tree differs from it."""

    def git(*args: str) -> str:
        # No optional locks: reading the commit must never hold .git/index.lock against the user's own git.
        command = ["git", "--no-optional-locks", "-C", str(repo), *args]
        return subprocess.run(command, capture_output=True, text=True, check=False).stdout

    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no").strip() else "")


def machine() -> str:
    """CPU model, cores and whether bf16 runs natively: every timing depends on them."""
    flags = cpu_flags()
    units = "AMX" if "amx_bf16" in flags else "AVX-512 BF16" if "avx512_bf16" in flags else "no AMX or AVX-512 BF16"
    return f"{cpu_model()}, {os.cpu_count()} cores, {units}, bf16 {'native' if fast_bf16() else 'emulated'}"


def header(repo: Path, argv: list[str] | None = None) -> str:
    """Markdown lines naming the date, commit, machine and the command that made a result."""
    command = shlex.join([Path(sys.argv[0]).as_posix(), *(sys.argv[1:] if argv is None else argv)])
    return (
        f"- date: {datetime.date.today().isoformat()}\n- commit: {commit(repo)}\n"
        f"- machine: {machine()}\n- command: `python {command}`\n"
    )
