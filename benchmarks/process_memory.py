"""Peak resident memory of a process and all its descendants (Ray's raylet, workers and engine actors included).

`ru_maxrss` only sees one process (or the children it waited for); a Ray job's
memory sits in actors that the raylet, a child of the driver, spawned. A
background thread samples the RSS of every process in the tree every
`interval_s` and keeps each one's peak (by command name and pid) and the peak
of their sum.

As a command it runs another one and reports the peaks of its whole process tree:

    python benchmarks/process_memory.py -- python tuned_examples/frozenlake_starpo.py
"""

from __future__ import annotations

import argparse
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psutil


class TreeMemory:
    """Peak RSS per process and of the sum, over the process tree rooted at `pid`."""

    def __init__(self, pid: int, *, interval_s: float = 0.5) -> None:
        self.root = psutil.Process(pid)
        self.interval_s = interval_s
        self.peaks: dict[int, float] = {}  # pid -> peak MiB
        self.names: dict[int, str] = {}  # pid -> its first name (Ray renames a worker per task)
        self.peak_sum_mb = 0.0
        self._stop = threading.Event()

    def sample(self) -> None:
        total = 0.0
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:  # the root has ended (and was reaped): its peaks stand
            return
        for process in tree:
            try:
                rss = process.memory_info().rss / 2**20
                self.names.setdefault(process.pid, process.name())
            except psutil.Error:  # it ended between the listing and the read
                continue
            total += rss
            self.peaks[process.pid] = max(self.peaks.get(process.pid, 0.0), rss)
        self.peak_sum_mb = max(self.peak_sum_mb, total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    @contextmanager
    def watching(self) -> Iterator[TreeMemory]:
        thread = threading.Thread(target=self._run, name="tree-memory", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()
            self.sample()

    def largest(self, n: int = 5) -> list[tuple[str, float]]:
        """The `n` processes with the highest peaks, largest first."""
        ranked = sorted(self.peaks.items(), key=lambda item: -item[1])[:n]
        return [(f"{self.names[pid]} ({pid})", mb) for pid, mb in ranked]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run (after --)")
    parser.add_argument("--top", type=int, default=8, help="processes to list, largest peak first")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    process = subprocess.Popen(command)
    with TreeMemory(process.pid).watching() as memory:
        code = process.wait()
    print(f"peak RSS of the process tree (sum): {memory.peak_sum_mb / 1024:.2f} GiB")
    for name, mb in memory.largest(args.top):
        print(f"  {mb / 1024:6.2f} GiB  {name}")
    raise SystemExit(code)


if __name__ == "__main__":
    main()
