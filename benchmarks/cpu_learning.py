"""Does StarPO learn on CPU? Success before and after RL, per env and starting policy, with 95% intervals.

For each env and each warm start (`random`: the answer format only, with
random valid moves; `expert`: the env's solver, RAGEN's SFT path), this runs
the env's tuned example (`tuned_examples/<env>_starpo.py`: CPU preset,
SmolLM2-135M-Instruct, vLLM on CPU) with a training time budget, in a fresh
process, exactly as a user would. The example evaluates the warm-started
policy on the fixed evaluation seeds before RL and the trained one on the same
seeds after (`rllib_ragen.rollout.evaluation`, the code `python -m rllib_ragen.run.evaluate`
runs too); this prints each evaluation's table row, collects both into a table
with Wilson intervals and the paired interval of the change, and writes it to
`--output`.

    python benchmarks/cpu_learning.py --envs frozenlake,sokoban --minutes 30
    python benchmarks/cpu_learning.py --envs sokoban --starts expert --minutes 60 --eval-size 128
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rllib_ragen.rollout.evaluation import TABLE_HEADER, table_row  # noqa: E402
from rllib_ragen.intervals import format_rate, paired_difference_interval  # noqa: E402

HEADER = (
    "| env | start | valid answers | distinct thoughts | success before RL [95%] | success after RL [95%] | "
    "change [95%] | RL minutes | iterations |\n|---|---|---|---|---|---|---|---|---|"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="frozenlake,sokoban", help="comma-separated envs with a tuned example")
    parser.add_argument("--starts", default="expert,random", help="comma-separated warm starts: expert, random")
    parser.add_argument("--minutes", type=float, default=30.0, help="RL time budget per run")
    parser.add_argument("--eval-size", type=int, default=128, help="fixed evaluation seeds")
    parser.add_argument("--warm-start-examples", type=int,
                        help="states each warm start plays (default: the tuned example's, per player)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a StarPOConfig attribute in every run (repeatable)")
    parser.add_argument("--output", default="benchmarks/results/cpu_learning.md", help="where the table is written")
    return parser.parse_args(argv)


def run_one(env: str, start: str, args: argparse.Namespace, workdir: Path) -> dict:
    """Runs the tuned example once; returns its before/after summary plus the wall time."""
    summary = workdir / f"{env}-{start}.json"
    command = [
        sys.executable, str(ROOT / "tuned_examples" / f"{env}_starpo.py"),
        "--warm-start", start,
        *(["--warm-start-examples", str(args.warm_start_examples)] if args.warm_start_examples else []),
        "--time-budget-min", str(args.minutes), "--stop-iters", "1000", "--eval-size", str(args.eval_size),
        "--summary-json", str(summary), "--checkpoint-dir", str(workdir / f"{env}-{start}-checkpoints"),
        "--checkpoint-every", "1000",  # the final checkpoint only: each is about 2 GB
        "--tracking-uri", f"sqlite:///{workdir / 'mlflow.db'}", *(f"--set={s}" for s in args.set),
    ]
    began = time.perf_counter()
    print(f"== {env}, {start} warm start: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, check=True, cwd=workdir)
    return {**json.loads(summary.read_text()), "env": env, "start": start,
            "minutes_total": (time.perf_counter() - began) / 60}


def row(result: dict) -> str:
    difference, low, high = paired_difference_interval(result["before"], result["after"])
    start = result["stats_before"]  # the warm-started policy: does it leave room to learn?
    return (f"| {result['env']} | {result['start']} | {start['well_formed_ratio']:.2f} | "
            f"{start['distinct_thought_ratio']:.2f} | {format_rate(result['before'])} | {format_rate(result['after'])} | "
            f"{difference:+.3f} [{low:+.3f}, {high:+.3f}] | {result['minutes']:.1f} | {result['iterations']} |")


def main(argv: list[str] | None = None) -> list[str]:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    rows = []
    with tempfile.TemporaryDirectory(prefix="cpu-learning-") as tmp:
        for env in args.envs.split(","):
            for start in args.starts.split(","):
                result = run_one(env.strip(), start.strip(), args, Path(tmp))
                print("\n".join([
                    TABLE_HEADER,
                    table_row(f"{env} ({start}) before RL", result["stats_before"], result["before"]),
                    table_row(f"{env} ({start}) after RL", result["stats_after"], result["after"]),
                ]), flush=True)
                rows.append(row(result))
                print(HEADER + "\n" + rows[-1], flush=True)
    table = "\n".join([HEADER, *rows])
    print("\n" + table)
    output = ROOT / args.output
    output.parent.mkdir(parents=True, exist_ok=True)
    invocation = " ".join(sys.argv[1:] if argv is None else argv)
    output.write_text(f"`python benchmarks/cpu_learning.py {invocation}`\n\n{table}\n")
    print(f"table written to {output}")
    return rows


if __name__ == "__main__":
    main()
