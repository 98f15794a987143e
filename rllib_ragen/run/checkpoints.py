"""Local algorithm checkpoints that are complete or absent: `<dir>/iter_NNNNNN`.

A checkpoint is written as `<dir>/.partial-iter_NNNNNN` (the RLlib state, then
`tracking.json`), flushed to disk, marked by a `COMPLETE` file written last,
and only then renamed into place. A process killed at any point leaves either
the previous checkpoints untouched plus a `.partial-*` directory, or the new
checkpoint whole. A full disk ends the save with a `DiskFullError` naming the
checkpoint and the space it needs, its half-written copy deleted and the
previous checkpoints untouched. `latest_checkpoint` only takes marked `iter_*` directories,
so a half-written one (a `.partial-*` directory, or an `iter_*` copied without
its marker) is never resumed from; the next save removes the leftovers and all
but the newest `keep` complete checkpoints (the one it just wrote among them),
which bounds a run's disk use at `keep` checkpoints.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rllib_ragen.run.atomic_files import fsync_path, fsync_tree
from rllib_ragen.run.disk_space import DiskFullError, disk_full_error, is_disk_full, tree_bytes

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm import Algorithm

COMPLETE_MARKER = "COMPLETE"
TRACKING_FILE = "tracking.json"
_NAME = re.compile(r"iter_(\d{6,})")
_PARTIAL_PREFIX = ".partial-"


def checkpoint_name(iteration: int) -> str:
    """`iter_000006` for iteration 6."""
    return f"iter_{iteration:06d}"


def save_checkpoint(algo: Algorithm, checkpoint_dir: str | Path, *, tracking: Mapping[str, Any], keep: int = 1) -> Path:
    """Saves `algo` (between iterations) as `<dir>/iter_NNNNNN`, complete or not at all.

    Args:
        algo: The algorithm; its `iteration` names the checkpoint.
        checkpoint_dir: Parent directory of the checkpoints (created when missing).
        tracking: JSON-serialisable data saved with the state (the MLflow run
            and the metrics this checkpoint covers), read by `tracking_state`.
        keep: Complete checkpoints left in `checkpoint_dir` afterwards: this
            one and the `keep - 1` newest before it (older ones are removed).

    Returns:
        The checkpoint directory. An existing complete checkpoint of the same
        iteration is kept as it is: the state of an iteration does not change.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (the newest checkpoint is never removed), got {keep}")
    checkpoint_dir = Path(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir / checkpoint_name(algo.iteration)
    if _is_complete(final):
        return final
    partial = checkpoint_dir / f"{_PARTIAL_PREFIX}{final.name}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        algo.save_to_path(str(partial))
        (partial / TRACKING_FILE).write_text(json.dumps(dict(tracking)))
        fsync_tree(partial)
        _write_synced(partial / COMPLETE_MARKER, f"{algo.iteration}\n")
    except Exception as error:
        if not is_disk_full(error):
            raise
        raise _checkpoint_disk_full(checkpoint_dir, final, partial) from error
    shutil.rmtree(final, ignore_errors=True)  # an unmarked leftover of the same name
    os.rename(partial, final)
    fsync_path(checkpoint_dir)
    _remove_older(checkpoint_dir, newest=final, keep=keep)
    return final


def _checkpoint_disk_full(checkpoint_dir: Path, final: Path, partial: Path) -> DiskFullError:
    """Deletes the half-written `partial` (giving its space back) and names what the checkpoint needs:
    about the newest complete checkpoint's size, or at least what was written without one."""
    written = tree_bytes(partial)
    shutil.rmtree(partial, ignore_errors=True)
    previous = latest_checkpoint(checkpoint_dir)
    then = (
        f"run again with --resume (the checkpoint {previous.name} is complete and is resumed from)"
        if previous is not None
        else "run again with --resume"
    )
    return disk_full_error(
        final,
        what="the checkpoint",
        needs_bytes=tree_bytes(previous) if previous is not None else written,
        at_least=previous is None,
        then=then,
    )


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The complete checkpoint of the highest iteration in `checkpoint_dir`, or None."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        return None
    complete = [p for p in checkpoint_dir.iterdir() if _NAME.fullmatch(p.name) and _is_complete(p)]
    return max(complete, key=checkpoint_iteration, default=None)


def checkpoint_iteration(checkpoint: Path) -> int:
    """The training iteration a checkpoint directory was saved at (from its name)."""
    match = _NAME.fullmatch(Path(checkpoint).name)
    if match is None:
        raise ValueError(f"{checkpoint} is not a checkpoint directory named iter_NNNNNN")
    return int(match.group(1))


def tracking_state(checkpoint: Path) -> dict[str, Any]:
    """The `tracking` dict saved with a complete checkpoint."""
    if not _is_complete(checkpoint):
        raise ValueError(f"{checkpoint} is not a complete checkpoint (no {COMPLETE_MARKER} marker)")
    return json.loads((checkpoint / TRACKING_FILE).read_text())


def _is_complete(path: Path) -> bool:
    return (path / COMPLETE_MARKER).is_file()


def _remove_older(checkpoint_dir: Path, *, newest: Path, keep: int) -> None:
    """Removes half-written leftovers and all complete checkpoints but the `keep`
    newest (run only after `newest` is complete; it is always among those kept)."""
    complete = sorted(
        (p for p in checkpoint_dir.iterdir() if _NAME.fullmatch(p.name) and _is_complete(p) and p != newest),
        key=checkpoint_iteration,
        reverse=True,
    )
    kept = {newest, *complete[: keep - 1]}
    for path in checkpoint_dir.iterdir():
        if path not in kept and path.is_dir() and (_NAME.fullmatch(path.name) or path.name.startswith(_PARTIAL_PREFIX)):
            # Unmarked first: a kill mid-removal must not leave a marked, gutted checkpoint.
            (path / COMPLETE_MARKER).unlink(missing_ok=True)
            shutil.rmtree(path, ignore_errors=True)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
