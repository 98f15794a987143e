"""Wall time of N StarPO iterations, synchronous against asynchronous rollouts (max_staleness 1 and 2).

Every mode trains on the same total trajectories (`--iters` x n_groups x group_size,
the StarPO-S filter off) sampled by `--runners` remote env runners, each with its
own HF engine, while the learner runs in the driver. Per mode it builds the
algorithm, runs `--warmup` untimed iterations, then times `--iters` iterations
and reports seconds per iteration with the phase timers (rollout wait, update,
wait for the shards still sampling, weight sync). Prints each mode and the ratio
sync / async. On a machine whose cores the runners and the learner share, the
overlap buys little: both phases then compete for the same cores.

    python benchmarks/async_rollouts.py                                  # tiny random model, 4 iterations
    python benchmarks/async_rollouts.py --model smollm2-135m-instruct --iters 3
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from envs.user_errors import CLIParser, front_door
from rllib_ragen.run.given_paths import output_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# (label, async_rollouts, max_staleness)
MODES = (("sync", False, 0), ("async k=1", True, 1), ("async k=2", True, 2))
PHASES = ("rollout", "update", "rollout_drain", "weight_sync")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-random", help="built-in model name or local model directory")
    parser.add_argument("--env", default="sokoban", help="registered env")
    parser.add_argument("--iters", type=int, default=4, help="timed iterations per mode")
    parser.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    parser.add_argument("--runners", type=int, default=1, help="remote env runners")
    parser.add_argument("--n-groups", type=int, default=4, help="groups per iteration")
    parser.add_argument("--group-size", type=int, default=4, help="trajectories per group")
    parser.add_argument("--response-length", type=int, default=32, help="most tokens per answer")
    parser.add_argument("--json", type=output_file, help="also write the results here")
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace, *, is_async: bool, max_staleness: int):
    from rllib_ragen.algorithm.starpo import StarPOConfig

    return (
        StarPOConfig()
        .environment(args.env)
        .llm(model=args.model, critic="none")
        .rollouts(
            n_groups=args.n_groups,
            group_size=args.group_size,
            max_turns=3,
            response_length=args.response_length,
            async_rollouts=is_async,
            max_staleness=max_staleness,
        )
        .inference(engine="hf")
        .training(
            advantage_estimator="grpo",
            rollout_filter_ratio=1.0,
            mini_batch_size=args.n_groups * args.group_size,
            micro_batch_size=4,
            actor_lr=1e-5,
            off_policy_correction="tis" if is_async else "none",
        )
        .env_runners(num_env_runners=args.runners)
        .starpo_evaluation(eval_interval=0)
        .debugging(seed=0)
    )


def measure(args: argparse.Namespace, *, is_async: bool, max_staleness: int) -> dict:
    """Seconds per iteration, trajectories trained and the mean phase times of one mode."""
    algo = build_config(args, is_async=is_async, max_staleness=max_staleness).build_algo()
    try:
        for _ in range(args.warmup):
            algo.train()
        phases = dict.fromkeys(PHASES, 0.0)
        trained, began = 0.0, time.perf_counter()
        for iteration in range(args.iters):
            result = algo.train()
            trained += result["learners"]["default_policy"]["num_trained_trajectories"]
            for phase in PHASES:
                phases[phase] += float(result["timers"].get(phase, 0.0))
            print(f"  iteration {iteration + 1}/{args.iters}: {time.perf_counter() - began:.1f} s", flush=True)
        seconds = time.perf_counter() - began
    finally:
        algo.stop()
    return {
        "seconds_per_iter": seconds / args.iters,
        "trajectories_trained": trained,
        **{f"{phase}_s": total / args.iters for phase, total in phases.items()},
    }


@front_door
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from rllib_ragen.run.ray_session import init_ray

    init_ray()
    results = {}
    for label, is_async, max_staleness in MODES:
        print(f"{label}: {args.warmup} warm-up + {args.iters} timed iterations", flush=True)
        results[label] = measure(args, is_async=is_async, max_staleness=max_staleness)
    header = f"{'mode':<10} {'s/iter':>7} {'trained':>8} " + " ".join(f"{p + ' s':>15}" for p in PHASES)
    print(header)
    for label, row in results.items():
        phases = " ".join(f"{row[f'{p}_s']:>15.2f}" for p in PHASES)
        print(f"{label:<10} {row['seconds_per_iter']:>7.2f} {row['trajectories_trained']:>8.0f} {phases}")
    for label in ("async k=1", "async k=2"):
        ratio = results["sync"]["seconds_per_iter"] / results[label]["seconds_per_iter"]
        print(f"sync / {label} wall time: x{ratio:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
