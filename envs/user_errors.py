"""Bad input a user can fix, and the one place every command reports it: `error: ...`, exit code 2.

`UserError` is the base of the project's user-facing exceptions (a wrong flag, setting, path,
model or server: `ModelNotFoundError`, `TrackingStoreError`, ...). `front_door` wraps each
command's entry point (the tuned examples, `rllib-ragen` and its subcommands, the OpenEnv
server, the benchmarks): a `UserError` ends the command with one line on stderr and exit code 2;
any other exception keeps its traceback, since it is a bug. `CLIParser` raises argparse's errors
as `UserError`, and `input_checks` marks the code that checks what the user gave: there the
ValueError, TypeError and KeyError the config, settings and env checks raise are about the input,
so they become a `UserError` too, as does an OSError on a path the user named.

It lives in `envs`, the bottom layer, because the OpenEnv server (`envs.openenv_server`) is a
command too and `envs` imports nothing of `rllib_ragen`. Only the standard library is imported:
a command answers bad input before it loads Ray or torch where it can.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")
EXIT_CODE = 2  # argparse's for a usage error


class UserError(Exception):
    """Input the user can fix: reported by `front_door` as one `error:` line and exit code 2."""


class CLIParser(argparse.ArgumentParser):
    """argparse whose errors (unknown flag, bad value) are a `UserError`: one `error:` line, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{message} (see {self.prog} --help)")


@contextlib.contextmanager
def input_checks() -> Iterator[None]:
    """Within: checks of what the user gave, whose ValueError, TypeError, KeyError or OSError (a path
    the user named that is missing or unreadable) becomes a `UserError`.

    Outside such a block those exceptions are bugs and keep their traceback.
    """
    try:
        yield
    except UserError:
        raise
    except (ValueError, TypeError, KeyError, OSError) as error:
        raise UserError(message_of(error)) from error


def message_of(error: BaseException) -> str:
    """The error's message on one line (a KeyError's without the quotes `str` adds)."""
    text = error.args[0] if isinstance(error, KeyError) and len(error.args) == 1 else str(error)
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return "; ".join(lines) or type(error).__name__


def front_door(entry: Callable[P, R]) -> Callable[P, R]:
    """A command's entry point whose `UserError` ends the process with `error: <message>` on stderr and exit code 2."""

    @functools.wraps(entry)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return entry(*args, **kwargs)
        except UserError as error:
            sys.stdout.flush()
            print(f"error: {message_of(error)}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_CODE) from None

    return checked
