"""The model cache: built-in and derived models built once into `<cache>/models/NAME`.

Builds are safe for several processes at once (a file lock, a private build
directory, a marker file written last, a rename into place), so readers never
see a partial model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock
import huggingface_hub
import transformers
from tqdm import tqdm

from rllib_ragen.models.model_directory import ModelNotFoundError, validated_model_dir

CACHE_ENV_VAR = "RLLIB_RAGEN_CACHE"
MARKER_FILE = ".rllib_ragen_model.json"  # written last: its presence means "complete"


@dataclasses.dataclass(frozen=True)
class BuiltinModel:
    """A model this package can build into its cache without the hub.

    Args:
        name: The name users pass to `resolve_model`.
        description: One line for `list` and error messages.
        source: Where the weights come from (recorded in the cache marker).
        n_steps: Number of `report` calls `build` makes (the progress bar's length).
        build: `build(out_dir, report)` writes the model into the empty `out_dir`,
            calling `report(what_was_done)` after each of its `n_steps` steps.
    """

    name: str
    description: str
    source: str
    n_steps: int
    build: Callable[[Path, Callable[[str], None]], None]

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"built-in model name must be non-empty without '/', got {self.name!r}")
        if self.n_steps < 1:
            raise ValueError(f"n_steps of built-in model {self.name!r} must be >= 1, got {self.n_steps}")


def default_cache_dir() -> Path:
    """The cache root: `$RLLIB_RAGEN_CACHE`, else `~/.cache/rllib_ragen`."""
    return Path(os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "rllib_ragen").expanduser()


def prepare_builtin(model: BuiltinModel, *, models_dir: Path, progress: bool = False) -> Path:
    """Return `models_dir/NAME`, building it with `model.build` first if no complete copy exists.

    Safe for several processes at once: builders serialise on a file lock, build
    in a private temporary directory, write the marker last and rename the
    directory into place, so readers never see a partial model. Also used for
    derived models (e.g. warm starts) that are cached like the built-ins.
    """
    target = models_dir / model.name
    if (target / MARKER_FILE).is_file():
        return _intact(target)
    models_dir.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(models_dir / f"{model.name}.lock"):
        if (target / MARKER_FILE).is_file():  # another process finished it while we waited
            return _intact(target)
        _remove_stale_builds(target)
        print(f"building {model.name} into {target} (once: later runs reuse it)", flush=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{model.name}.partial-", dir=models_dir))
        try:
            _build_with_progress(model, partial, progress=progress)
            _write_marker(model, partial)
            partial.chmod(0o755)  # mkdtemp makes it private; the cache is read by every worker
            partial.rename(target)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return target.resolve()


def _intact(target: Path) -> Path:
    """A complete cache entry, checked to still hold its model (a disk or a hand may have damaged it since).

    Raises:
        ModelNotFoundError: naming the entry and what is wrong; it is left for the user to remove.
    """
    try:
        return validated_model_dir(target)
    except ModelNotFoundError as error:
        raise ModelNotFoundError(
            f"the cached model {str(target)!r} is damaged ({error}): remove that directory and run again to rebuild it"
        ) from error


def _remove_stale_builds(target: Path) -> None:
    """Delete leftovers of builds that died (only the lock holder builds, so any found are dead)."""
    for stale in target.parent.glob(f".{target.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if target.exists():  # present but without marker: incomplete
        shutil.rmtree(target)


def _build_with_progress(model: BuiltinModel, out_dir: Path, *, progress: bool) -> None:
    with tqdm(total=model.n_steps, desc=f"building {model.name}", disable=not progress, unit="step") as bar:

        def report(done: str) -> None:
            bar.set_postfix_str(done)
            bar.update(1)

        # The step bar is the progress; the libraries' bars inside a step (weight loading) are noise.
        with library_progress_bars(enabled=False):
            model.build(out_dir, report)


@contextmanager
def library_progress_bars(*, enabled: bool) -> Iterator[None]:
    """Show or hide the progress bars of transformers and huggingface_hub, then restore them.

    Both libraries only offer process-wide switches.
    """
    transformers_bars = transformers.utils.logging.is_progress_bar_enabled()
    hub_bars = not huggingface_hub.utils.are_progress_bars_disabled()
    _setlibrary_progress_bars(transformers_bars=enabled, hub_bars=enabled)
    try:
        yield
    finally:
        _setlibrary_progress_bars(transformers_bars=transformers_bars, hub_bars=hub_bars)


def _setlibrary_progress_bars(*, transformers_bars: bool, hub_bars: bool) -> None:
    logging = transformers.utils.logging
    (logging.enable_progress_bar if transformers_bars else logging.disable_progress_bar)()
    hub = huggingface_hub.utils
    (hub.enable_progress_bars if hub_bars else hub.disable_progress_bars)()


def _write_marker(model: BuiltinModel, out_dir: Path) -> None:
    marker = {
        "name": model.name,
        "source": model.source,
        "transformers": transformers.__version__,
        "created_unix": time.time(),
        "builder_pid": os.getpid(),
    }
    (out_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")


def read_marker(model_dir: str | Path) -> dict[str, object]:
    """The provenance record of a built-in model directory (name, source, builder)."""
    marker = Path(model_dir) / MARKER_FILE
    if not marker.is_file():
        raise ModelNotFoundError(f"{str(model_dir)!r} is not a complete built-in model: no {MARKER_FILE}.")
    return json.loads(marker.read_text())
