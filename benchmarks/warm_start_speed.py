"""Seconds and final answer NLL of a tuned example's warm start, against a baseline commit's, in one run.

Each side builds a warm start at its own commit into an empty cache of its
own, with the already built base model linked in, so only the warm start
itself is timed: the baseline's and this tree's tuned-example warm start (what
`apply_warm_start` gives the CPU preset of `--env`; since f302e90 the expert's
default here is 192 states once on the last 10 layers, the baseline's 48 states
twice on every weight). With `--same-demonstrations` a third side builds this
tree's warm start on the baseline's demonstrations: its states (seeds 0..), its
count and passes, learning rate and batch (checked field by field against what
the baseline built). The baseline side imports `rllib_ragen` from a git
worktree of `--baseline-rev`, so "today" is today's code. All resulting models
are then scored by one yardstick in this process: the mean NLL per answer token
of the demonstrations the baseline's settings play in this tree (with
`--same-demonstrations`, those all but the tuned side trained on), else of this
tree's tuned example. Prints every side and the ratios.

    python benchmarks/warm_start_speed.py --env frozenlake
    python benchmarks/warm_start_speed.py --env sokoban --same-demonstrations --output docs/results/ws_sokoban.md
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

from envs.user_errors import CLIParser, front_door
from rllib_ragen.run.given_paths import output_file

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BASELINE_REV = "175dab7"  # main before the supervised warm start (an RLlib offline iteration per step)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="frozenlake", help="registered env whose tuned example's warm start is timed")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="base model (built into the cache first)")
    parser.add_argument("--baseline-rev", default=BASELINE_REV, help="git revision whose warm start is 'today'")
    parser.add_argument("--output", type=output_file, help="also write the report here, under the date, commit, machine and command")
    parser.add_argument(
        "--same-demonstrations",
        action="store_true",
        help="also time this tree's warm start on the baseline's demonstrations",
    )
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # one side: its cache dir; JSON on stdout
    parser.add_argument("--same-as", help=argparse.SUPPRESS)  # that side: the baseline's settings, JSON
    return parser.parse_args(argv)


def measure(env: str, model: str, same_as: dict | None) -> dict:
    """Times the warm start of the imported rllib_ragen for `env`'s CPU preset (into $RLLIB_RAGEN_CACHE):
    its tuned example's, or with `same_as` (a baseline's settings) this tree's on those demonstrations."""
    import dataclasses

    from rllib_ragen.algorithm.presets import cpu_preset
    from rllib_ragen.run import warm_start as module

    built = {}
    build = module.warm_start

    def recording(base_model: str, settings, **kwargs):  # what the side builds, whatever its commit calls it
        built.update(dataclasses.asdict(settings))
        return build(base_model, settings, **kwargs)

    module.warm_start = recording
    config = cpu_preset(env).llm(model=model)
    began = time.perf_counter()
    if same_as is None:
        if hasattr(module, "apply_warm_start"):
            module.apply_warm_start(config)
        else:  # a baseline revision kept it in the experiment driver
            from rllib_ragen.run.experiment import apply_warm_start

            apply_warm_start(config)
        model_dir = config.llm_module.model
    else:
        model_dir = str(recording(model, baseline_demonstrations(config, same_as), progress=True))
    return {"seconds": time.perf_counter() - began, "model_dir": model_dir, "settings": built}


def baseline_demonstrations(config, baseline: dict):
    """This tree's warm start of `config` on the demonstrations of a baseline's recorded `baseline` settings:
    its seeds (0.., as before they moved), states, passes, batch and learning rate. Raises if another
    field that decides the demonstrations differs."""
    import dataclasses

    from rllib_ragen.run.warm_start import warm_start_config

    same = ("num_examples", "epochs", "batch_size", "lr", "answers_per_prompt", "seed")
    settings = dataclasses.replace(warm_start_config(config), first_seed=0, **{key: baseline[key] for key in same})
    ours = json.loads(json.dumps(dataclasses.asdict(settings), default=str))  # compared as the baseline's JSON
    for key in ("env", "env_config", "player", "autocast_dtype", "protocol", "budget"):
        if ours[key] != baseline[key]:
            raise ValueError(
                f"not the same demonstrations: {key} is {ours[key]!r} here, {baseline[key]!r} in the baseline"
            )
    return settings


def run_side(args: argparse.Namespace, source: Path, cache: Path, same_as: dict | None = None) -> dict:
    """One side in a fresh process importing rllib_ragen from `source`, building into `cache`."""
    from rllib_ragen.models import default_cache_dir, resolve_model

    base = resolve_model(args.model, progress=True)  # built once, outside the timing
    (cache / "models").mkdir(parents=True)
    (cache / "models" / base.name).symlink_to(default_cache_dir() / "models" / base.name)
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--measure",
        str(cache),
        "--env",
        args.env,
        "--model",
        args.model,
    ] + (["--same-as", json.dumps(same_as, default=str)] if same_as else [])
    env = dict(os.environ, PYTHONPATH=str(source), RLLIB_RAGEN_CACHE=str(cache))
    out = subprocess.run(command, env=env, cwd=source, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def answer_nll(env: str, model: str, model_dir: str, baseline: dict | None) -> float:
    """Mean NLL per answer token, under the model in `model_dir`, of the demonstrations of this tree's tuned
    example or (given) of the baseline's settings."""
    import torch

    from rllib_ragen.algorithm.offline_training import response_token_nll
    from rllib_ragen.algorithm.presets import cpu_preset
    from rllib_ragen.models import load_causal_lm, load_tokenizer, resolve_model
    from rllib_ragen.run.warm_start import demonstrations, warm_start_config

    config = cpu_preset(env).llm(model=model)
    warm = baseline_demonstrations(config, baseline) if baseline else warm_start_config(config)
    episodes = demonstrations(load_tokenizer(resolve_model(model)), warm)
    policy = load_causal_lm(Path(model_dir), dtype=torch.float32).eval()
    return response_token_nll(policy, episodes, history_window=warm.protocol.history_window)


def report(sides: dict[str, dict]) -> list[str]:
    lines = [f"{'':<20}" + "".join(f"{name:>32}" for name in sides)]
    for key in ("seconds", "answer_nll"):
        lines.append(f"{key:<20}" + "".join(f"{side[key]:>32.3f}" for side in sides.values()))
    (baseline_name, baseline), *others = sides.items()
    for name, side in others:
        lines.append(f"warm start speed-up, {name} / {baseline_name}: x{baseline['seconds'] / side['seconds']:.2f}")
    return lines


@front_door
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.measure:
        print(
            json.dumps(measure(args.env, args.model, json.loads(args.same_as) if args.same_as else None), default=str)
        )
        return
    from rllib_ragen.run.provenance import header

    provenance = header(ROOT, argv)
    with tempfile.TemporaryDirectory(prefix="warm-start-speed-") as tmp:
        worktree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.baseline_rev],
            check=True,
            capture_output=True,
        )
        try:
            baseline = run_side(args, worktree, Path(tmp) / "cache-baseline")
            sides = {
                f"baseline {args.baseline_rev}": baseline,
                "this tree": run_side(args, ROOT, Path(tmp) / "cache-this"),
            }
            if args.same_demonstrations:
                sides["this tree, same demonstrations"] = run_side(
                    args, ROOT, Path(tmp) / "cache-same", same_as=baseline["settings"]
                )
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=False)
        for side in sides.values():
            side["answer_nll"] = answer_nll(
                args.env, args.model, side["model_dir"], baseline["settings"] if args.same_demonstrations else None
            )
    lines = report(sides)
    print("\n".join(lines))
    if args.output:
        Path(args.output).write_text(provenance + "\n```text\n" + "\n".join(lines) + "\n```\n")


if __name__ == "__main__":
    main()
