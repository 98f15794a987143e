"""Keeps one TextArena game's randomness and downloads to itself.

TextArena games draw from Python's global `random` (their state object
calls `random.seed(seed)` on reset; a few games draw from numpy's global
generator too), while an env group runs several games in one process. Every
call into a game therefore runs inside `GameSandbox.call`: the global
generators are set to this game's own state, the call runs, the game's new
state is saved and the outside state put back. So a game's draws depend on its
seed and its own moves only, whatever other games do in between, and code
outside the games sees the global generators untouched.

Word games call `nltk.download(...)` when imported or reset, which needs the
network (and hangs or fails offline). During a call, `nltk.download` is
replaced by a check of the local NLTK data: present data is used as is, and
missing data raises `GameNeedsDownload` at once, naming the game and the data.

One lock serialises the calls: the generators and `nltk.download` are
process-wide, and env calls may run in worker threads (`step_timeout_s`). A
game call that hangs keeps the lock, so the process's later game calls wait
too; with `step_timeout_s` each of them ends its trajectory as a fault.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

_LOCK = threading.Lock()
# Where NLTK keeps each kind of data package (nltk.downloader's directory names).
_NLTK_KINDS = ("corpora", "taggers", "tokenizers", "chunkers", "grammars", "misc", "models", "sentiment", "stemmers")
T = TypeVar("T")


class GameNeedsDownload(RuntimeError):
    """A TextArena game asked to download data at run time, which this adapter refuses (it may hang offline)."""


class GameSandbox:
    """One game's random generators, swapped in around each call into the game.

    Args:
        game: The TextArena game id, for error messages.
    """

    def __init__(self, *, game: str) -> None:
        self.game = game
        self._python_state: Any = random.Random(0).getstate()
        self._numpy_state: Any = np.random.RandomState(0).get_state()

    def seed(self, *, seed: int) -> None:
        """Restarts both generators from `seed` (the game's next call draws from there)."""
        self._python_state = random.Random(seed).getstate()
        self._numpy_state = np.random.RandomState(seed).get_state()

    def call(self, fn: Callable[[], T]) -> T:
        """`fn()` with this game's generators as the global ones and NLTK downloads refused."""
        with _LOCK, self._own_generators(), _downloads_refused(self.game):
            return fn()

    @contextlib.contextmanager
    def _own_generators(self) -> Iterator[None]:
        outside = random.getstate(), np.random.get_state()
        random.setstate(self._python_state)
        np.random.set_state(self._numpy_state)
        try:
            yield
        finally:
            self._python_state, self._numpy_state = random.getstate(), np.random.get_state()
            random.setstate(outside[0])
            np.random.set_state(outside[1])


@contextlib.contextmanager
def _downloads_refused(game: str) -> Iterator[None]:
    try:
        import nltk
    except ImportError:  # no NLTK, no NLTK downloads
        yield
        return
    original = nltk.download

    def local_only(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
        packages = [info_or_id] if isinstance(info_or_id, str) else list(info_or_id or [])
        missing = [p for p in packages if not _nltk_has(nltk, p)]
        if missing or not packages:
            raise GameNeedsDownload(
                f"TextArena game {game!r} downloads the NLTK data {missing or '(unnamed)'} when it starts, and "
                "this adapter never downloads at run time (it would hang or fail offline). Install the data "
                f"beforehand: python -m nltk.downloader {' '.join(missing) or 'PACKAGE'} (where a network is "
                "available), or pick a game that needs no download (docs/textarena.md)"
            )
        return True

    nltk.download = local_only
    try:
        yield
    finally:
        nltk.download = original


def _nltk_has(nltk: Any, package: str) -> bool:
    """The NLTK data package `package` is installed locally (as a directory or a zip)."""
    for kind in _NLTK_KINDS:
        for suffix in ("", ".zip"):
            try:
                nltk.data.find(f"{kind}/{package}{suffix}")
                return True
            except LookupError:
                continue
    return False
