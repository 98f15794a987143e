"""Where one StarPO iteration's time goes: generation, env, prompts, filter, update, weight sync, logging.

Builds a StarPO algorithm on Sokoban, runs --warmup iterations, then times the
phases of one more iteration, called in the order `StarPO.training_step` calls
them: rollout (`LLMEnvRunner.sample`, split by its `last_rollout_timing` into
engine generation, env stepping, prompt building and the rest), the StarPO-S
filter, the learner update (learner connector: token rows, old log-probs,
advantages; then forward/backward/step), the weight sync into the engine, and
the metrics reduction that ends an iteration (logging).

"Framework overhead" is everything that is neither engine generation nor the
learner update (target: < 15% of the iteration).

    python benchmarks/iteration_breakdown.py --n-groups 4 --group-size 4
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rllib_ragen.algorithm import StarPOConfig  # noqa: E402

ROLLOUT_PARTS = ("engine_s", "env_step_s", "prompt_build_s")
COMPUTE_PHASES = ("generation (engine)", "update (learner)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or model dir")
    parser.add_argument("--engine", default="auto", choices=["auto", "vllm", "hf"])
    parser.add_argument("--n-groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--response-length", type=int, default=48)
    parser.add_argument("--filter-ratio", type=float, default=1.0, help="StarPO-S keep ratio")
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--autocast-dtype", default="bfloat16", choices=["none", "bfloat16"])
    parser.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    return parser.parse_args(argv)


def build(args: argparse.Namespace):
    config = (
        StarPOConfig()
        .environment("sokoban")
        .llm(model=args.model, critic="none")
        .rollouts(n_groups=args.n_groups, group_size=args.group_size, max_turns=args.max_turns,
                  response_length=args.response_length, think=False, prefill=True)
        .inference(engine=args.engine, kv_cache_gb=1.0, engine_dtype="bfloat16", max_model_len=2048)
        .training(advantage_estimator="grpo", rollout_filter_ratio=args.filter_ratio,
                  mini_batch_size=args.n_groups * args.group_size, micro_batch_size=4,
                  micro_batch_tokens=args.micro_batch_tokens,
                  autocast_dtype=None if args.autocast_dtype == "none" else args.autocast_dtype)
        .starpo_evaluation(eval_interval=0)
    )
    return config.build_algo()


def timed_iteration(algo) -> dict[str, float]:
    """Seconds per phase of one iteration, called like `StarPO.training_step` does."""
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    episodes = algo._collect_episodes()
    rollout_s = time.perf_counter() - start
    timing = algo.env_runner.last_rollout_timing
    seconds["generation (engine)"] = timing["engine_s"]
    if all(k in timing for k in ROLLOUT_PARTS):
        seconds["env stepping"] = timing["env_step_s"]
        seconds["prompt building"] = timing["prompt_build_s"]
    seconds["rollout, other"] = rollout_s - sum(timing.get(k, 0.0) for k in ROLLOUT_PARTS)
    start = time.perf_counter()
    kept = algo._filter_groups(episodes)
    seconds["filtering"] = time.perf_counter() - start
    start = time.perf_counter()
    results = algo.update_learners(kept)
    seconds["update (learner)"] = time.perf_counter() - start
    start = time.perf_counter()
    algo.env_runner_group.sync_weights(from_worker_or_learner_group=algo.learner_group, inference_only=True)
    seconds["weight sync"] = time.perf_counter() - start
    start = time.perf_counter()
    algo.metrics.aggregate(results, key="learners")
    algo.metrics.reduce()
    seconds["logging (metrics)"] = time.perf_counter() - start
    return seconds


def report(seconds: dict[str, float]) -> None:
    total = sum(seconds.values())
    print(f"{'phase':<22} {'seconds':>8} {'%':>6}")
    for name, value in seconds.items():
        print(f"{name:<22} {value:>8.2f} {100 * value / total:>6.1f}")
    print(f"{'total':<22} {total:>8.2f} {100.0:>6.1f}")
    overhead = total - sum(seconds[k] for k in COMPUTE_PHASES)
    print(f"framework overhead (neither generation nor learner update): {overhead:.2f} s = "
          f"{100 * overhead / total:.1f}% of the iteration")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    algo = build(args)
    try:
        for _ in range(args.warmup):
            algo.train()
        report(timed_iteration(algo))
    finally:
        algo.stop()


if __name__ == "__main__":
    main()
