"""Local algorithm checkpoints kept as `<dir>/latest`, replaced atomically."""

from __future__ import annotations

import shutil
from pathlib import Path

from ray.rllib.algorithms.algorithm import Algorithm

LATEST = "latest"


def save_checkpoint(algo: Algorithm, checkpoint_dir: str | Path) -> Path:
    """Saves to `<dir>/latest`; a crash mid-save never loses the previous one."""
    checkpoint_dir = Path(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    partial = checkpoint_dir / f"{LATEST}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    algo.save_to_path(str(partial))
    latest = checkpoint_dir / LATEST
    previous = checkpoint_dir / f"{LATEST}.previous"
    shutil.rmtree(previous, ignore_errors=True)
    if latest.exists():
        latest.rename(previous)
    partial.rename(latest)
    shutil.rmtree(previous, ignore_errors=True)
    return latest


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """`<dir>/latest` when a complete checkpoint is there, else None."""
    latest = Path(checkpoint_dir) / LATEST
    return latest if latest.is_dir() else None
