"""What a training job shows on its console: its own lines, and a progress bar on a terminal.

By default the libraries' logs and warnings (Ray, Ray Data, RLlib, vLLM,
transformers, ...) go to a log file in the run's directory; the console keeps
the job's header, one line per iteration, its summary, and this package's own
warnings (stderr). `verbose=True` leaves every library's output where the
library sends it, and still writes the log file.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
OWN_LOGGER = "rllib_ragen"
# Read at import by huggingface_hub/transformers (weight-loading bars) and Ray Data
# (its progress bars), in this process and in the Ray workers it starts.
_QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
}


def quiet_progress_bars() -> None:
    """Turns off the libraries' own progress bars; call before importing them."""
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)


def quiet_console(log_file: Path, *, verbose: bool) -> None:
    """`route_library_logs` to `log_file`, saying where they go; also turns off the libraries'
    progress bars in the Ray workers started after it."""
    quiet_progress_bars()
    if not verbose:
        # Tune's newer console output prints the experiment's folder and a TensorBoard command at
        # every fit, whatever its verbosity; its older reporter prints nothing at verbosity 0.
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    route_library_logs(log_file, verbose=verbose)
    print(f"library logs: {log_file}" + ("" if verbose else " (--verbose: on the console too)"), flush=True)


def trial_failed_line(name: str, error_file: str | None) -> str:
    """The console's line for a trial that raised: the error's last line and the file holding it all
    (a sweep's or study's trials print to Ray's logs, not to the console)."""
    if not error_file or not Path(error_file).is_file():
        return f"{name} failed (Tune kept no error file)"
    lines = [line for line in Path(error_file).read_text(errors="replace").splitlines() if line.strip()]
    return f"{name} failed: {lines[-1].strip() if lines else 'no message'} (the whole error: {error_file})"


def route_library_logs(log_file: Path, *, verbose: bool = False) -> None:
    """Sends every logger's records and Python warnings to `log_file`; unless
    `verbose`, takes the libraries' console handlers away, so only this
    package's warnings reach the console (stderr).

    Call after the libraries are imported: Ray, Ray Data and transformers
    attach their console handlers to their own loggers at import.
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    file_handler = logging.FileHandler(log_file)
    file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    root.addHandler(file_handler)
    logging.captureWarnings(True)  # warnings.warn -> the "py.warnings" logger -> the file
    if verbose:
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(console)
        return
    for logger in _all_loggers():
        for handler in list(logger.handlers):
            if _writes_to_console(handler):
                logger.removeHandler(handler)
        logger.propagate = True  # to the root's file handler
    own = logging.StreamHandler(sys.stderr)
    own.setLevel(logging.WARNING)
    own.addFilter(logging.Filter(OWN_LOGGER))
    own.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    root.addHandler(own)


def _all_loggers() -> list[logging.Logger]:
    return [
        logger
        for logger in logging.root.manager.loggerDict.values()
        if isinstance(logger, logging.Logger) and not logger.name.startswith(OWN_LOGGER)
    ]


def _writes_to_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)


class IterationProgress:
    """One printed line per iteration; on a terminal also a bar with the ETA to the last iteration.

    Args:
        done: Iterations already done (a resumed run).
        total: The last iteration.
    """

    def __init__(self, *, done: int, total: int) -> None:
        self._bar: Any = None
        if sys.stdout.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                initial=done,
                unit="iter",
                desc="training",
                file=sys.stdout,
                leave=False,
            )

    def line(self, text: str) -> None:
        """Prints `text` above the bar (or as a plain line without one)."""
        if self._bar is None:
            print(text, flush=True)
        else:
            self._bar.write(text, file=sys.stdout)

    def advance(self, *, total: int) -> None:
        """One iteration done; `total` may have shrunk (a time budget)."""
        if self._bar is not None:
            self._bar.total = total
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
