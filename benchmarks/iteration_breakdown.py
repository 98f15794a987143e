"""Trajectories per minute of the CPU preset, against the preset and code of a baseline commit, in one run.

Each side builds `cpu_preset(env)` (SmolLM2-135M, vLLM on CPU) with evaluation
off, runs `--warmup` untimed iterations, then times `--iters` training
iterations (`algo.train()`): sampled trajectories per minute, the
rollout time (and the engine's share of it), the rest of the iteration (learner
connector and update, weight sync, metrics), and the learner's loss and
train/inference log-prob gap (what a precision change costs). The baseline
side runs in a subprocess whose `rllib_ragen` is imported from a git worktree
of `--baseline-rev` (default: the commit before this benchmark's levers), so
"today" is today's code, not a reconstruction of it. Prints both and the ratio.

Levers: each `--lever "NAME KEY=VALUE ..."` is this tree's preset with those
settings, timed the same way in a fresh process, against the preset itself
(no baseline worktree): how many trajectories each lever *trains* on per
minute (the groups the filter keeps x group size), beside those it samples.

    python benchmarks/iteration_breakdown.py                  # sokoban, 3 timed iterations each
    python benchmarks/iteration_breakdown.py --env frozenlake --iters 5
    python benchmarks/iteration_breakdown.py --env frozenlake --lever "full-history history_window=None"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from envs.user_errors import CLIParser, front_door
from rllib_ragen.run.given_paths import output_file

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BASELINE_REV = "175dab7"  # main before the shared-prefix learner and mini-batches that never repeat rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="sokoban", help="registered env")
    parser.add_argument("--iters", type=int, default=3, help="timed iterations per side")
    parser.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    parser.add_argument("--baseline-rev", default=BASELINE_REV, help="git revision whose preset and code are 'today'")
    parser.add_argument("--lever", action="append", default=[], metavar='"NAME KEY=VALUE ..."',
                        help="time this tree's preset with these settings against the preset itself (repeatable)")
    parser.add_argument("--output", type=output_file, help="also write the report here, under the date, commit, machine and command")
    parser.add_argument("--set", action="append", default=[], help=argparse.SUPPRESS)  # one side's settings
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one side, JSON on stdout
    return parser.parse_args(argv)


def measure(env: str, iters: int, warmup: int, settings: list[str]) -> dict:
    """Times `iters` training iterations of the CPU preset of the imported rllib_ragen (with `settings`)."""
    from process_memory import TreeMemory

    from rllib_ragen.algorithm.presets import cpu_preset
    from rllib_ragen.run.ray_session import init_ray

    init_ray()
    config = cpu_preset(env).starpo_evaluation(eval_interval=0)
    if settings:  # levers run on this tree only (a baseline revision may predate apply_setting)
        from rllib_ragen.run.settings_flag import apply_setting

        for assignment in settings:
            apply_setting(config, assignment)
    memory = TreeMemory(os.getpid())
    with memory.watching():
        algo = config.build_algo()
        try:
            for _ in range(warmup):
                algo.train()
            began = time.perf_counter()
            results, timings = [], []
            for _ in range(iters):
                results.append(algo.train())
                timings.append(dict(algo.env_runner.last_rollout_timing))
            seconds = time.perf_counter() - began
            params = next(iter(algo.learner_group.foreach_learner(policy_parameters))).get()
        finally:
            algo.stop()
    return {**_figures(config, results, timings, seconds, iters, params), **_memory_figures(memory)}


class PolicyParameters(NamedTuple):
    """The policy's parameter counts that its phases' FLOPs come from."""

    all: int
    trained: int  # backward computes weight gradients for these only
    body: int  # the weights every position multiplies: all but the token embedding and the LM head
    head: int  # the LM head (the tied embedding, or its own matrix): multiplied where a token is sampled


def policy_parameters(learner) -> PolicyParameters:
    """The policy's `PolicyParameters`."""
    policy = learner.module["default_policy"].policy
    parameters = list(policy.parameters())
    head = policy.get_output_embeddings().weight
    vocabulary = {id(p): p.numel() for p in (policy.get_input_embeddings().weight, head)}  # one entry when tied
    total = sum(p.numel() for p in parameters)
    return PolicyParameters(total, sum(p.numel() for p in parameters if p.requires_grad),
                            total - sum(vocabulary.values()), head.numel())


def _figures(config, results: list[dict], timings: list[dict], seconds: float, iters: int,
             params: PolicyParameters) -> dict:
    """Per-iteration means of the timed iterations, and each phase's achieved GFLOP/s."""
    learner = [r["learners"]["default_policy"] for r in results]
    rollout = sum(t["total_s"] for t in timings)
    generation = sum(t["engine_s"] for t in timings)
    generated = sum(r["env_runners"]["rollout_tokens_per_s"] * t["total_s"] for r, t in zip(results, timings))
    # A baseline revision may predate the prefill count: its generation in positions computed is then not known.
    prefilled = sum(r["env_runners"].get("rollout_prefill_tokens_per_s", float("nan")) * t["total_s"]
                    for r, t in zip(results, timings))
    sync = sum(r["timers"].get("weight_sync", float("nan")) for r in results)
    # Wall time outside the rollout and the weight sync: the learner connector and update (and metrics), so
    # the update's GFLOP/s below are a lower bound. (RLlib's timers are moving averages over all iterations.)
    update = seconds - rollout - sync
    # A baseline revision may predate the token counts: its learner GFLOP/s are then not known.
    row_tokens = sum(r.get("num_row_tokens", float("nan")) for r in learner)
    computed_tokens = sum(r.get("num_computed_tokens", float("nan")) for r in learner)
    # The settings by name, as every revision's `to_dict()` has them (a baseline may predate the settings groups).
    named = config.to_dict()
    n_groups, group_size, ratio = named["n_groups"], named["group_size"], named["rollout_filter_ratio"]
    # The groups StarPO-S keeps x group size (a baseline revision may predate the filter's own count).
    filter_group = getattr(config, "group_filter", getattr(config, "filter_settings", None))
    kept = filter_group.max_kept_groups(n_groups) if filter_group is not None else max(1, round(ratio * n_groups))
    trained_per_iter = min(kept, n_groups) * group_size
    return {
        "settings": f"{n_groups}x{group_size} groups, filter {ratio}, "
                    f"learner autocast {named.get('autocast_dtype')}, engine {named['engine_dtype']}",
        "seconds_per_iter": seconds / iters,
        "trajectories_per_min": 60 * sum(r["env_runners"]["num_trajectories"] for r in results) / seconds,
        "trained_trajectories_per_min": 60 * trained_per_iter * iters / seconds,
        "rollout_s": rollout / iters,
        "generation_s": generation / iters,
        "update_s": update / iters,
        "weight_sync_s": sync / iters,
        # The learner connector and update, the weight sync and the metrics: all but the rollout.
        "update_sync_rest_s": (seconds - rollout) / iters,
        **phase_gflops(params, row_tokens=row_tokens, computed_tokens=computed_tokens, update_s=update,
                       generated_tokens=generated, prefilled_tokens=prefilled, generation_s=generation),
        "policy_loss": sum(r["policy_loss"] for r in learner) / iters,
        "logp_gap_mean": sum(r.get("train_inference_logp_gap_mean", float("nan")) for r in learner) / iters,
    }


def phase_gflops(params: PolicyParameters, *, row_tokens: float, computed_tokens: float, update_s: float,
                 generated_tokens: float, prefilled_tokens: float, generation_s: float) -> dict[str, float]:
    """The update's and the generation's achieved GFLOP/s."""
    return {
        # 6 x parameters x tokens (forward 2, backward 4), over the update's time, for every row token (what a
        # per-row pass of every weight computes: the measure). The hardware's: the positions really run
        # (the shared prefix once), forward through every weight and backward (4) through the trained ones only
        # (frozen bottom layers run forward only).
        "update_gflops": 6 * params.all * row_tokens / update_s / 1e9,
        "update_hardware_gflops": (2 * params.all + 4 * params.trained) * computed_tokens / update_s / 1e9,
        # Over the engine's time, 2 x the weights each computed position multiplies: a sampled token, the body
        # and the LM head; a prompt position the engine computed (its prefix cache's hits are not computed),
        # the body alone (no logits are computed there). Attention's own FLOPs are left out.
        "generation_gflops": 2 * (params.body + params.head) * generated_tokens / generation_s / 1e9,
        "generation_computed_gflops": 2 * ((params.body + params.head) * generated_tokens
                                           + params.body * prefilled_tokens) / generation_s / 1e9,
    }


def _memory_figures(memory) -> dict:
    largest = memory.largest(1)
    return {
        "peak_rss_sum_gb": memory.peak_sum_mb / 1024,
        "peak_rss_largest_gb": largest[0][1] / 1024 if largest else float("nan"),
        "peaks": {name: round(mb) for name, mb in memory.largest(6)},
    }


def run_side(args: argparse.Namespace, source: Path, settings: list[str] = ()) -> dict:
    """One side in a fresh process that imports rllib_ragen from `source` (first on its PYTHONPATH),
    with `settings` applied."""
    command = [sys.executable, str(Path(__file__).resolve()), "--measure", "--env", args.env,
               "--iters", str(args.iters), "--warmup", str(args.warmup), *(f"--set={s}" for s in settings)]
    env = dict(os.environ, PYTHONPATH=str(source))
    # In `source` too: Ray puts the driver's working directory on its workers' path, ahead of PYTHONPATH.
    out = subprocess.run(command, env=env, cwd=source, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def report(sides: dict[str, dict]) -> list[str]:
    """The sides' figures as a fixed-width table, their settings, and each side's ratios to the first."""
    keys = ["seconds_per_iter", "trajectories_per_min", "trained_trajectories_per_min", "rollout_s", "generation_s",
            "update_s", "weight_sync_s", "update_sync_rest_s", "update_gflops", "update_hardware_gflops",
            "generation_gflops", "generation_computed_gflops",
            "peak_rss_sum_gb", "peak_rss_largest_gb", "policy_loss", "logp_gap_mean"]
    lines = [f"{'':<24}" + "".join(f"{name:>16}" for name in sides)]
    for key in keys:
        lines.append(f"{key:<24}" + "".join(f"{side[key]:>16.3f}" for side in sides.values()))
    lines += [f"{name}: {side['settings']}" for name, side in sides.items()]
    lines += [f"{name}: peak RSS MiB by process {side['peaks']}" for name, side in sides.items()]
    (baseline_name, baseline), *others = sides.items()
    for name, side in others:
        for key in ("trajectories_per_min", "trained_trajectories_per_min"):
            lines.append(f"{key.replace('_', ' ')}, {name} / {baseline_name}: x{side[key] / baseline[key]:.2f}")
    return lines


def publish(lines: list[str], *, output: Path | None, provenance: str) -> None:
    """Prints the report and, with `output`, writes it there as a code block under its provenance."""
    print("\n".join(lines))
    if output:
        Path(output).write_text(provenance + "\n```text\n" + "\n".join(lines) + "\n```\n")


@front_door
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.env, args.iters, args.warmup, args.set)))
        return
    # Imported here, not at the top: a baseline side runs this file against an older rllib_ragen.
    from rllib_ragen.run.provenance import header

    provenance = header(ROOT, argv)  # before the runs: the commit they ran
    if args.lever:
        sides = {"preset": run_side(args, ROOT)}
        for lever in args.lever:
            name, *settings = shlex.split(lever)
            sides[name] = run_side(args, ROOT, settings)
        publish(report(sides) + ceiling_lines(sides), output=args.output, provenance=provenance)
        return
    with tempfile.TemporaryDirectory(prefix="baseline-") as tmp:
        worktree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.baseline_rev],
                       check=True, capture_output=True)
        try:
            sides = {f"baseline {args.baseline_rev}": run_side(args, worktree), "this tree": run_side(args, ROOT)}
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=False)
    publish(report(sides) + ceiling_lines(sides), output=args.output, provenance=provenance)


def ceiling_lines(sides: dict[str, dict]) -> list[str]:
    """This machine's matmul ceilings, measured now, and each side's phases as a share of the bf16 one."""
    import torch
    from rollout_throughput import matmul_gflops

    bf16, fp32 = matmul_gflops(torch.bfloat16), matmul_gflops(torch.float32)
    lines = [f"matmul ceiling (this run): bf16 {bf16:.0f} GFLOP/s, fp32 {fp32:.0f} GFLOP/s"]
    for name, side in sides.items():
        lines.append(f"{name}: update {side['update_gflops']:.0f} GFLOP/s of row tokens = "
                     f"{side['update_gflops'] / bf16:.0%} of bf16 ({side['update_hardware_gflops'] / bf16:.0%} in "
                     f"positions run); generation {side['generation_gflops']:.0f} GFLOP/s of sampled tokens = "
                     f"{side['generation_gflops'] / bf16:.0%} ({side['generation_computed_gflops'] / bf16:.0%} "
                     "in positions computed: prompt positions prefilled and sampled tokens)")
    return lines


if __name__ == "__main__":
    main()
