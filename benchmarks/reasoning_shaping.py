"""Do thoughts decay without reasoning-aware rewards? Think length and success over RL, with and without shaping.

RAGEN's finding 6: with only the task reward, the `<think>` part shrinks and
stops explaining the action. For each env this runs the env's tuned example
twice (CPU preset, SmolLM2-135M, vLLM on CPU, think mode) from the same cached
warm start, on the same training and evaluation seeds: once with the task
reward alone, once with the shaping terms of `rllib_ragen.rollout.reward_shaping`
(`--shaping`). It prints, per iteration, the mean thought length in words and
the training success of both runs, then the evaluations before and after RL
(success with 95% Wilson intervals, mean thought words), each run's paired
change and the paired difference shaped - unshaped after RL, and writes the
tables to `--output`.

    python benchmarks/reasoning_shaping.py --envs bandit,frozenlake --stop-iters 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from envs.user_errors import CLIParser, front_door
from rllib_ragen.intervals import format_rate, paired_difference_interval

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_SHAPING = "think_length_coeff=0.1,think_names_action_coeff=0.1"
# Per-iteration rollout metrics read back from MLflow: the thought's length and the task's success.
CURVES = {"think words": "env_runners/think_words_mean", "success": "env_runners/success_rate"}
SUMMARY_HEADER = (
    "| env | shaping | think words before -> after (eval) | success before RL [95%] | success after RL [95%] | "
    "change [95%] | iterations |\n|---|---|---|---|---|---|---|"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="bandit,frozenlake", help="comma-separated envs with a tuned example")
    parser.add_argument("--stop-iters", type=int, default=10, help="RL iterations per run")
    parser.add_argument("--eval-size", type=int, default=128, help="fixed evaluation seeds")
    parser.add_argument("--shaping", default=DEFAULT_SHAPING,
                        help="comma-separated KEY=VALUE reward-shaping settings of the shaped run")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a StarPOConfig attribute in every run (repeatable)")
    parser.add_argument("--output", default="benchmarks/results/reasoning_shaping.md", help="where the tables go")
    return parser.parse_args(argv)


def run_one(env: str, shaping: list[str], args: argparse.Namespace, workdir: Path) -> dict:
    """Runs the tuned example once in think mode; returns its before/after summary and per-iteration curves."""
    name = f"{env}-{'shaped' if shaping else 'task-only'}"
    summary, store = workdir / f"{name}.json", f"sqlite:///{workdir / 'mlflow.db'}"
    # The Bandit preset answers without thinking in 16 tokens; a thought needs think mode and room.
    think = ["think=True", "prefill=False", "response_length=64"]
    command = [
        sys.executable, str(ROOT / "tuned_examples" / f"{env}_starpo.py"), "--stop-iters", str(args.stop_iters),
        "--eval-size", str(args.eval_size), "--summary-json", str(summary),
        "--checkpoint-dir", str(workdir / f"{name}-checkpoints"), "--checkpoint-every", "1000",
        "--tracking-uri", store, "--experiment", name,
        *(f"--set={s}" for s in [*think, *shaping, *args.set]),
    ]
    print(f"== {name}: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, check=True, cwd=workdir)
    return {**json.loads(summary.read_text()), "env": env, "shaped": bool(shaping),
            "curves": curves(store, experiment=name)}


def curves(store: str, *, experiment: str) -> dict[str, list[float]]:
    """The run's per-iteration values of each `CURVES` metric, in iteration order."""
    from rllib_ragen.run.mlflow_store import tracking_client

    client = tracking_client(store)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return {label: [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]
            for label, key in CURVES.items()}


def curve_table(env: str, plain: dict, shaped: dict) -> str:
    """One row per iteration: thought words and training success of both runs."""
    rows = ["| iteration | think words, task only | think words, shaped | success, task only | success, shaped |",
            "|---|---|---|---|---|"]
    for i, values in enumerate(zip(plain["curves"]["think words"], shaped["curves"]["think words"],
                                   plain["curves"]["success"], shaped["curves"]["success"]), start=1):
        rows.append(f"| {i} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    return f"{env}, per RL iteration (training rollouts):\n\n" + "\n".join(rows)


def summary_row(result: dict, shaping: str) -> str:
    difference, low, high = paired_difference_interval(result["before"], result["after"])
    words = f"{result['stats_before']['think_words_mean']:.1f} -> {result['stats_after']['think_words_mean']:.1f}"
    return (f"| {result['env']} | {shaping if result['shaped'] else 'none'} | {words} | "
            f"{format_rate(result['before'])} | {format_rate(result['after'])} | "
            f"{difference:+.3f} [{low:+.3f}, {high:+.3f}] | {result['iterations']} |")


def shaped_minus_plain(env: str, plain: dict, shaped: dict) -> str:
    difference, low, high = paired_difference_interval(plain["after"], shaped["after"])
    return f"{env}: success after RL, shaped - task only, on the same seeds: {difference:+.3f} [{low:+.3f}, {high:+.3f}]"


@front_door
def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    shaping = [s.strip() for s in args.shaping.split(",") if s.strip()]
    sections, rows = [], []
    with tempfile.TemporaryDirectory(prefix="reasoning-shaping-") as tmp:
        for env in (e.strip() for e in args.envs.split(",")):
            plain, shaped = (run_one(env, terms, args, Path(tmp)) for terms in ([], shaping))
            rows += [summary_row(plain, args.shaping), summary_row(shaped, args.shaping)]
            sections += [curve_table(env, plain, shaped), shaped_minus_plain(env, plain, shaped)]
            print("\n\n".join([SUMMARY_HEADER + "\n" + "\n".join(rows[-2:]), *sections[-2:]]), flush=True)
    invocation = " ".join(sys.argv[1:] if argv is None else argv)
    report = "\n\n".join([f"`python benchmarks/reasoning_shaping.py {invocation}`",
                          SUMMARY_HEADER + "\n" + "\n".join(rows), *sections]) + "\n"
    output = ROOT / args.output
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report)
    print(f"tables written to {output}")
    return report


if __name__ == "__main__":
    main()
