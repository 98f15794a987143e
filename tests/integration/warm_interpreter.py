"""Runs commands in processes forked from one interpreter that imported the heavy modules once.

`python warm_interpreter.py` imports Ray, RLlib, torch, transformers, MLflow and the project's
drivers, then reads one JSON request a line on stdin: `argv` (a script path, or `-m MODULE`, and
its flags), `cwd`, `env`, and the files for the command's stdout, stderr and the heavy modules it
had imported at its end. For each it forks a child that becomes the command (working directory,
environment, stdout and stderr), runs it as `python ...` would (`runpy`, as `__main__`), and
exits with its exit status, which the parent answers with as one JSON line.

This is Python's forkserver idea: a command whose input check needs the config (that is, Ray
and torch) answers in a fraction of a second instead of paying the imports again. Whatever the
imports write is on this interpreter's own stderr, which the caller checks to be empty.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback

import rllib_ragen.algorithm.starpo  # noqa: F401
import rllib_ragen.models  # noqa: F401
import rllib_ragen.rollout.evaluation  # noqa: F401
import rllib_ragen.run.callbacks  # noqa: F401
import rllib_ragen.run.evaluate  # noqa: F401
import rllib_ragen.run.sweep  # noqa: F401
import rllib_ragen.run.tracking  # noqa: F401
import rllib_ragen.run.train_loop  # noqa: F401
import rllib_ragen.run.warm_start  # noqa: F401

HEAVY = ("torch", "ray", "vllm")


def become_the_command(request: dict) -> None:
    """In the forked child: the command's directory, environment and output files, then the command; never returns."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    code = 1
    try:
        code = run(request["argv"])
    except SystemExit as exit_:
        code = exit_code(exit_)
    except BaseException:
        traceback.print_exc()
    finally:
        with open(request["modules"], "w") as file:
            json.dump([name for name in HEAVY if name in sys.modules], file)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run(argv: list[str]) -> int:
    """`python ARGV...` in this process: a script, or `-m MODULE`, as `__main__`."""
    if argv[0] == "-m":
        sys.argv = argv[1:]  # run_module replaces argv[0] by the module's file
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as `python script.py` does
        runpy.run_path(argv[0], run_name="__main__")
    return 0


def exit_code(exit_: SystemExit) -> int:
    """The status `python` exits with for this SystemExit (a message is printed to stderr, status 1)."""
    if exit_.code is None or isinstance(exit_.code, int):
        return exit_.code or 0
    print(exit_.code, file=sys.stderr)
    return 1


def serve() -> None:
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            become_the_command(request)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    serve()
