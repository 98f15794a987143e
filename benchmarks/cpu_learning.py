"""Does StarPO learn on CPU? Success before and after RL, per env and starting policy, with 95% intervals.

For each env and each warm start (`random`: the answer format only, with
random valid moves; `expert`: the env's solver, RAGEN's SFT path), this runs
the env's tuned example (`tuned_examples/<env>_starpo.py`: CPU preset,
SmolLM2-135M-Instruct, vLLM on CPU; for an env without one, e.g.
`textarena:GuessTheNumber-v0`, `python -m rllib_ragen train --env <env>`, the
same driver) with a training time budget, in a fresh process, exactly as a user would. The example evaluates the warm-started
policy on the fixed evaluation seeds before RL and the trained one on the same
seeds after (`rllib_ragen.rollout.evaluation`, the code `python -m rllib_ragen.run.evaluate`
runs too); this prints each evaluation's table row, collects both into a table
with Wilson intervals and the paired interval of the change, and writes it to
`--output`.

Screening: each `--variant "NAME KEY=VALUE ..."` is one configuration (the
preset plus those settings); the variants run one after another, each with the
same short budget, and the table ranks them by success after RL, so that many
settings are tried before an hour goes to one.

    python benchmarks/cpu_learning.py --envs frozenlake,sokoban --minutes 30
    python benchmarks/cpu_learning.py --envs frozenlake --starts random --minutes 10 \
        --variant "preset" --variant "gae advantage_estimator=gae critic=head"
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from envs.user_errors import CLIParser, UserError, front_door
from rllib_ragen.intervals import format_rate, paired_difference_interval
from rllib_ragen.rollout.evaluation import TABLE_HEADER, table_row
from rllib_ragen.run.provenance import header

ROOT = Path(__file__).resolve().parents[1]

COLUMNS = ("rank", "variant", "env", "start", "well-formed answers", "distinct thoughts", "success before RL [95%]",
           "success after RL [95%]", "change [95%]", "RL minutes", "iterations")
# With --holdout-seed-start: the same before/after on seeds no tuning used.
HOLDOUT_COLUMNS = ("held-out before [95%]", "held-out after [95%]", "held-out change [95%]")


def table_header(holdout: bool) -> str:
    columns = COLUMNS + (HOLDOUT_COLUMNS if holdout else ())
    return "| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="frozenlake,sokoban",
                        help="comma-separated envs (a tuned example's, or any name `rllib-ragen train --env` takes)")
    parser.add_argument("--starts", default="expert,random", help="comma-separated warm starts: expert, random")
    parser.add_argument("--minutes", type=float, default=30.0, help="RL time budget per run")
    parser.add_argument("--eval-size", type=int, default=128, help="fixed evaluation seeds")
    parser.add_argument("--warm-start-examples", type=int,
                        help="states each warm start plays (default: the tuned example's, per player)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a StarPOConfig attribute in every run (repeatable)")
    parser.add_argument("--variant", action="append", default=[], metavar='"NAME KEY=VALUE ..."',
                        help="screening: one configuration, the preset plus these settings (repeatable; "
                             "quote values with spaces); default: the preset alone")
    parser.add_argument("--holdout-seed-start", type=int,
                        help="also evaluate each run's starting and trained policy on --eval-size seeds from here "
                             "(a set no tuning used; the training and evaluation seeds stay apart from it)")
    parser.add_argument("--output", default="docs/results/cpu_learning.md", help="where the table is written")
    parser.add_argument("--workdir", help="keep the runs here (MLflow database for benchmarks/learning_curve.py, "
                                          "checkpoints); default: a temporary directory, removed at the end")
    return parser.parse_args(argv)


def parse_variant(text: str) -> tuple[str, list[str]]:
    """'gae advantage_estimator=gae critic=head' -> ("gae", ["advantage_estimator=gae", "critic=head"])."""
    words = shlex.split(text)
    if not words or "=" in words[0]:
        raise UserError(f"--variant {text!r}: start with a name, then KEY=VALUE settings")
    if any("=" not in word for word in words[1:]):
        raise UserError(f"--variant {text!r}: every setting after the name is KEY=VALUE")
    return words[0], words[1:]


def training_command(env: str) -> list[str]:
    """The tuned example of `env`, or for any other env the driver behind them, `python -m rllib_ragen train`."""
    script = ROOT / "tuned_examples" / f"{env}_starpo.py"
    if script.is_file():
        return [sys.executable, str(script)]
    return [sys.executable, "-m", "rllib_ragen", "train", "--env", env]


def run_one(env: str, start: str, variant: tuple[str, list[str]], args: argparse.Namespace, workdir: Path) -> dict:
    """Runs the tuned example once; returns its before/after summary plus the wall time."""
    name, settings = variant
    run = f"{env.replace(':', '.')}-{start}-{name}"  # a scheme name's colon kept out of paths
    summary = workdir / f"{run}.json"
    command = [
        *training_command(env),
        "--warm-start", start,
        *(["--warm-start-examples", str(args.warm_start_examples)] if args.warm_start_examples else []),
        "--time-budget-min", str(args.minutes), "--stop-iters", "1000", "--eval-size", str(args.eval_size),
        "--summary-json", str(summary), "--checkpoint-dir", str(workdir / f"{run}-checkpoints"),
        "--checkpoint-every", "1000",  # the final checkpoint only: each is about 2 GB
        "--tracking-uri", f"sqlite:///{workdir / 'mlflow.db'}", "--experiment", f"cpu-learning-{env}-{start}-{name}",
        *(f"--set={s}" for s in [*args.set, *settings]),
    ]
    began = time.perf_counter()
    print(f"== {env}, {start} warm start, variant {name}: {shlex.join(command[1:])}", flush=True)
    subprocess.run(command, check=True, cwd=workdir)
    result = {**json.loads(summary.read_text()), "env": env, "start": start, "variant": name,
              "settings": " ".join(settings), "minutes_total": (time.perf_counter() - began) / 60}
    if args.holdout_seed_start is not None:
        checkpoints = workdir / f"{run}-checkpoints"
        result["holdout_before"] = evaluate_holdout(checkpoints, args, workdir / f"{name}-holdout-before",
                                                    model=result["starting_model"])
        result["holdout_after"] = evaluate_holdout(checkpoints, args, workdir / f"{name}-holdout-after")
    return result


def evaluate_holdout(checkpoints: Path, args: argparse.Namespace, output_dir: Path, model: str | None = None) -> list:
    """Per-seed successes of the run's final checkpoint (or, with `model`, of that model under the run's
    settings) on the held-out seeds, through the evaluate CLI as a user would run it."""
    command = [sys.executable, "-m", "rllib_ragen.run.evaluate", str(checkpoints), "--seed-start",
               str(args.holdout_seed_start), "--episodes", str(args.eval_size), "--output-dir", str(output_dir),
               *(["--set", f"llm_model={model}"] if model else [])]
    print(f"== held-out seeds: {shlex.join(command[1:])}", flush=True)
    subprocess.run(command, check=True)
    (env_summary,) = json.loads((output_dir / "summary.json").read_text())["envs"].values()
    return env_summary["successes"]


def row(result: dict, rank: int) -> str:
    difference, low, high = paired_difference_interval(result["before"], result["after"])
    start = result["stats_before"]  # the warm-started policy: does it leave room to learn?
    variant = f"{result['variant']}" + (f" (`{result['settings']}`)" if result["settings"] else "")
    holdout = ""
    if "holdout_after" in result:
        held_difference, held_low, held_high = paired_difference_interval(result["holdout_before"],
                                                                          result["holdout_after"])
        holdout = (f" {format_rate(result['holdout_before'])} | {format_rate(result['holdout_after'])} | "
                   f"{held_difference:+.3f} [{held_low:+.3f}, {held_high:+.3f}] |")
    return (f"| {rank} | {variant} | {result['env']} | {result['start']} | {start['well_formed_ratio']:.2f} | "
            f"{start['distinct_thought_ratio']:.2f} | {format_rate(result['before'])} | {format_rate(result['after'])} | "
            f"{difference:+.3f} [{low:+.3f}, {high:+.3f}] | {result['minutes']:.1f} | {result['iterations']} |{holdout}")


def ranked(results: list[dict]) -> list[dict]:
    """Best first: by success after RL, then by the change (paired against the same start)."""
    def key(result: dict) -> tuple[float, float]:
        after = sum(result["after"]) / len(result["after"])
        return after, paired_difference_interval(result["before"], result["after"])[0]
    return sorted(results, key=key, reverse=True)


@front_door
def main(argv: list[str] | None = None) -> list[str]:
    args = parse_args(argv)
    variants = [parse_variant(v) for v in args.variant] or [("preset", [])]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    provenance = header(ROOT, argv)  # before the runs: the commit they ran
    results = []
    with contextlib.ExitStack() as stack:
        tmp = args.workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="cpu-learning-"))
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for env in args.envs.split(","):
            for start in args.starts.split(","):
                for variant in variants:
                    result = run_one(env.strip(), start.strip(), variant, args, Path(tmp))
                    print("\n".join([
                        TABLE_HEADER,
                        table_row(f"{env} ({start}, {variant[0]}) before RL", result["stats_before"], result["before"]),
                        table_row(f"{env} ({start}, {variant[0]}) after RL", result["stats_after"], result["after"]),
                    ]), flush=True)
                    results.append(result)
    rows = [row(result, rank) for rank, result in enumerate(ranked(results), start=1)]
    table = "\n".join([table_header(args.holdout_seed_start is not None), *rows])
    print("\n" + table)
    output = ROOT / args.output
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(f"{provenance}\n{table}\n")
    print(f"table written to {output}")
    return rows


if __name__ == "__main__":
    main()
