"""RAGEN's Table 4 settings with the GPU preset, beside the paper's StarPO-S numbers.

For each setting (Bandit, BanditRev, Sokoban, FrozenLake, LargerSokoban,
SokobanNewVocab) this trains the GPU preset (`rllib_ragen.algorithm.presets.ragen_preset`:
Qwen2.5-0.5B-Instruct, 8 groups x 16, StarPO-S filter, vLLM; no warm start)
through the tuned examples' driver (`rllib_ragen.run.train_loop.run`: MLflow
tracking, checkpoints, evaluation on the fixed seeds before and after RL),
one setting after the other in this process, then prints the success rates
with 95% intervals beside the paper's (StarPO-S, Qwen2.5-0.5B-Instruct).

    python benchmarks/paper_table.py                                  # all six, 200 iterations each
    python benchmarks/paper_table.py --envs sokoban,frozenlake --stop-iters 100 --output table.md
    python benchmarks/paper_table.py --tiny                           # CPU smoke run (CI): tiny model, 1 iteration

`--tiny` swaps in the tiny random model, the in-process HF engine, 2 groups
x 2, one turn of 8-token answers and 2 evaluation seeds: it checks the
harness end to end on a CPU, its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from envs.user_errors import CLIParser, front_door
from rllib_ragen.run.given_paths import output_file
from rllib_ragen.intervals import format_rate

ROOT = Path(__file__).resolve().parents[1]

# env -> (the paper's name for the setting, StarPO-S success %, Qwen2.5-0.5B-Instruct).
PAPER_STARPO_S = {
    "bandit": ("Bandit", 100.0),
    "bandit_rev": ("BanditRev", 67.58),
    "sokoban": ("Sokoban", 21.48),
    "frozenlake": ("FrozenLake", 19.92),
    "larger_sokoban": ("LargerSokoban", 2.34),
    "sokoban_new_vocab": ("SokobanNewVocab", 18.75),
}
# The GPU preset shrunk to a smoke run on a CPU (tuned-example flags).
# fmt: off
TINY_FLAGS = [
    "--model", "tiny-random", "--engine", "hf", "--n-groups", "2", "--group-size", "2", "--max-turns", "1",
    "--eval-size", "2", "--set=critic=head", "--set=response_length=8", "--set=mini_batch_size=4",
    "--set=micro_batch_size=2", "--set=autocast_dtype=None", "--set=engine_dtype=auto", "--set=num_gpus_per_learner=0",
    "--set=num_gpus_per_engine=0", "--set=collapse_metrics_samples=4",
]
# fmt: on
HEADER = (
    "| setting | env | paper StarPO-S | success before RL [95%] | success after RL [95%] | iterations | minutes |\n"
    "|---|---|---|---|---|---|---|"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--envs",
        default=",".join(PAPER_STARPO_S),
        help=f"comma-separated settings to run, of: {', '.join(PAPER_STARPO_S)}",
    )
    parser.add_argument("--stop-iters", type=int, help="training iterations per setting (default: 200, --tiny: 1)")
    parser.add_argument("--eval-size", type=int, help="fixed evaluation seeds (default: the preset's 256)")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny random model, HF engine, 1 iteration")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a StarPOConfig attribute in every run (repeatable)",
    )
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite:///./mlflow.db)")
    parser.add_argument("--experiment", default="paper-table", help="MLflow experiment name")
    parser.add_argument(
        "--checkpoint-root",
        default="checkpoints/paper-table",
        help="checkpoints go to <root>/<env>; --resume continues the runs found there",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=20,
        help="checkpoint every N iterations and at the end (metrics reach MLflow with them)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue each setting from its latest checkpoint (no before-RL evaluation then)",
    )
    parser.add_argument("--output", type=output_file, help="also write the table (markdown) to this file")
    args = parser.parse_args(argv)
    args.envs = [env.strip() for env in args.envs.split(",") if env.strip()]
    unknown = [env for env in args.envs if env not in PAPER_STARPO_S]
    if unknown:
        parser.error(f"--envs: {unknown} are not Table 4 settings; choose from {list(PAPER_STARPO_S)}")
    if args.stop_iters is None:
        args.stop_iters = 1 if args.tiny else 200
    return args


def driver_argv(env: str, args: argparse.Namespace, summary: Path) -> list[str]:
    """The tuned-example flags of one setting's run."""
    argv = [
        "--env",
        env,
        "--preset",
        "gpu",
        "--no-warm-start",
        "--stop-iters",
        str(args.stop_iters),
        "--summary-json",
        str(summary),
        "--checkpoint-dir",
        str(Path(args.checkpoint_root) / env),
        "--checkpoint-every",
        str(args.checkpoint_every),
        "--experiment",
        args.experiment,
    ]
    if args.tiny:
        argv += TINY_FLAGS
    if args.eval_size is not None:
        argv += ["--eval-size", str(args.eval_size)]
    if args.tracking_uri:
        argv += ["--tracking-uri", args.tracking_uri]
    if args.resume:
        argv.append("--resume")
    return argv + [f"--set={setting}" for setting in args.set]


def row(env: str, result: dict, summary_json: Path, minutes: float) -> str:
    """One table row: from the before/after summary, or (a resumed run, not evaluated before RL) the last result."""
    name, paper = PAPER_STARPO_S[env]
    if summary_json.is_file():
        summary = json.loads(summary_json.read_text())
        before, after, iterations = format_rate(summary["before"]), format_rate(summary["after"]), summary["iterations"]
    else:
        evaluation = result["evaluation"]
        successes = round(evaluation["success_rate"] * evaluation["num_trajectories"])
        before, iterations = "n/a (resumed)", result["training_iteration"]
        after = format_rate([1.0] * successes + [0.0] * (int(evaluation["num_trajectories"]) - successes))
    return f"| {name} | {env} | {paper:.2f}% | {before} | {after} | {iterations} | {minutes:.1f} |"


@front_door
def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    # Imported here: torch, Ray and RLlib take seconds to import, --help and bad flags need none of them.
    from rllib_ragen.run.flags import build_parser, config_from_args
    from rllib_ragen.run.train_loop import run

    with tempfile.TemporaryDirectory(prefix="paper-table-") as scratch:
        runs = []
        for env in args.envs:  # every config is built and validated before the first run starts
            parsed = build_parser(env=env, description="", success_threshold=0.0, stop_iters=args.stop_iters)
            run_args = parsed.parse_args(driver_argv(env, args, Path(scratch) / f"{env}.json"))
            runs.append((env, config_from_args(run_args), run_args))
        rows = []
        for env, config, run_args in runs:
            print(f"== {PAPER_STARPO_S[env][0]} ({env}): {config.rollout_summary}", flush=True)
            began = time.perf_counter()
            result = run(config, run_args)
            rows.append(row(env, result, Path(run_args.summary_json), (time.perf_counter() - began) / 60))
            print(HEADER + "\n" + rows[-1], flush=True)
    table = "\n".join([HEADER, *rows])
    model = "tiny random model, --tiny" if args.tiny else "GPU preset, Qwen2.5-0.5B-Instruct"
    print(f"\nStarPO-S on RAGEN's Table 4 settings ({model}); paper: StarPO-S, Qwen2.5-0.5B-Instruct\n{table}")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        invocation = " ".join(sys.argv[1:] if argv is None else argv)
        Path(args.output).write_text(f"`python benchmarks/paper_table.py {invocation}`\n\n{table}\n")
        print(f"table written to {args.output}")
    return table


if __name__ == "__main__":
    main()
