"""Seconds and final answer NLL of a tuned example's warm start, against a baseline commit's, in one run.

Each side builds the warm start `apply_warm_start` gives the CPU preset of
`--env` at its own commit into an empty cache of its own, with the already
built base model linked in, so only the warm start itself is timed. Up to
d386d15 both sides played the same 48 expert states twice; since then the
expert's default is 192 states once each on the last 10 layers, so the ratio
is the tuned example's warm start then and now (the same-demonstration ratio
is in docs/results/warm_start_speed.md, measured at d386d15). The baseline side imports `rllib_ragen` from a git worktree of
`--baseline-rev`, so "today" is today's code. Both resulting models are then
scored by one yardstick in this process: the mean NLL per answer token of the
demonstrations they were trained on. Prints both sides and the ratio.

    python benchmarks/warm_start_speed.py --env frozenlake
    python benchmarks/warm_start_speed.py --env sokoban --output docs/results/warm_start_speed_sokoban.md
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
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BASELINE_REV = "175dab7"  # main before the supervised warm start (an RLlib offline iteration per step)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="frozenlake", help="registered env whose tuned example's warm start is timed")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="base model (built into the cache first)")
    parser.add_argument("--baseline-rev", default=BASELINE_REV, help="git revision whose warm start is 'today'")
    parser.add_argument("--output", help="also write the report here, under the date, commit, machine and command")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # one side: its cache dir; JSON on stdout
    return parser.parse_args(argv)


def measure(env: str, model: str) -> dict:
    """Times the warm start of the imported rllib_ragen for `env`'s CPU preset (into $RLLIB_RAGEN_CACHE)."""
    from rllib_ragen.algorithm.presets import cpu_preset

    try:
        from rllib_ragen.run.warm_start import apply_warm_start
    except ImportError:  # a baseline revision kept it in the experiment driver
        from rllib_ragen.run.experiment import apply_warm_start  # type: ignore[attr-defined,no-redef]

    config = cpu_preset(env).llm(model=model)
    began = time.perf_counter()
    apply_warm_start(config)
    return {"seconds": time.perf_counter() - began, "model_dir": config.llm_model}


def run_side(args: argparse.Namespace, source: Path, cache: Path) -> dict:
    """One side in a fresh process importing rllib_ragen from `source`, building into `cache`."""
    from rllib_ragen.models import default_cache_dir, resolve_model

    base = resolve_model(args.model, progress=True)  # built once, outside the timing
    (cache / "models").mkdir(parents=True)
    (cache / "models" / base.name).symlink_to(default_cache_dir() / "models" / base.name)
    command = [sys.executable, str(Path(__file__).resolve()), "--measure", str(cache), "--env", args.env,
               "--model", args.model]
    env = dict(os.environ, PYTHONPATH=str(source), RLLIB_RAGEN_CACHE=str(cache))
    out = subprocess.run(command, env=env, cwd=source, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def answer_nll(env: str, model: str, model_dir: str) -> float:
    """Mean NLL per answer token of the warm start's demonstrations under the model in `model_dir`."""
    import torch

    from rllib_ragen.algorithm.offline import response_token_nll
    from rllib_ragen.algorithm.presets import cpu_preset
    from rllib_ragen.models import load_causal_lm, load_tokenizer, resolve_model
    from rllib_ragen.run.warm_start import demonstrations, warm_start_config

    config = cpu_preset(env).llm(model=model)
    warm = warm_start_config(config)
    episodes = demonstrations(load_tokenizer(resolve_model(model)), warm)
    policy = load_causal_lm(Path(model_dir), dtype=torch.float32).eval()
    return response_token_nll(policy, episodes, history_window=warm.protocol.history_window)


def report(sides: dict[str, dict]) -> list[str]:
    lines = [f"{'':<28}" + "".join(f"{name:>20}" for name in sides)]
    for key in ("seconds", "answer_nll"):
        lines.append(f"{key:<28}" + "".join(f"{side[key]:>20.3f}" for side in sides.values()))
    (baseline_name, baseline), (name, side) = sides.items()
    lines.append(f"warm start speed-up, {name} / {baseline_name}: x{baseline['seconds'] / side['seconds']:.2f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.env, args.model)))
        return
    from rllib_ragen.run.provenance import header

    provenance = header(ROOT, argv)
    with tempfile.TemporaryDirectory(prefix="warm-start-speed-") as tmp:
        worktree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.baseline_rev],
                       check=True, capture_output=True)
        try:
            sides = {f"baseline {args.baseline_rev}": run_side(args, worktree, Path(tmp) / "cache-baseline"),
                     "this tree": run_side(args, ROOT, Path(tmp) / "cache-this")}
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=False)
        for side in sides.values():
            side["answer_nll"] = answer_nll(args.env, args.model, side["model_dir"])
    lines = report(sides)
    print("\n".join(lines))
    if args.output:
        Path(args.output).write_text(provenance + "\n```text\n" + "\n".join(lines) + "\n```\n")


if __name__ == "__main__":
    main()
