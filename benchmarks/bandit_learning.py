"""Learning benchmark: StarPO with SmolLM2-135M on the two-armed Bandit, on this CPU.

Prints the success rate (picking the high-risk, higher-mean arm) per iteration
and compares the final evaluation against the evaluation before training (the
baseline of the same run, on the same fixed seeds). Not a test: it takes
minutes to tens of minutes on 2 cores.

    python benchmarks/bandit_learning.py --iters 15
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ray  # noqa: E402

from rllib_ragen.algorithm import StarPOConfig  # noqa: E402
from rllib_ragen.warm_start import WarmStartConfig, warm_start  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model name or directory")
    parser.add_argument("--env", default="bandit", help="bandit (Phoenix/Dragon) or bandit_test (held-out names)")
    parser.add_argument("--high-prob", type=float, default=0.25, help="chance the high arm pays 1.0 (RAGEN: 0.25)")
    parser.add_argument("--iters", type=int, default=15, help="training iterations")
    parser.add_argument("--n-groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-5, help="actor learning rate")
    # Not grpo by default: the high arm pays 0 most of the time, so groups without a payout
    # have a tiny reward std and GRPO's per-group std normalisation blows up their (pro low
    # arm) advantages; measured here, GRPO drove success from 0.78 to 0.09 in 3 iterations.
    parser.add_argument("--estimator", default="brpo", choices=("grpo", "brpo", "arpo"))
    parser.add_argument("--engine", default="auto", choices=("auto", "vllm", "hf"))
    parser.add_argument("--eval-size", type=int, default=64)
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace, model: str) -> StarPOConfig:
    return (
        StarPOConfig()
        .environment(args.env, env_config={"high_prob": args.high_prob})
        .llm(model=model, critic="none")
        .rollouts(
            n_groups=args.n_groups, group_size=args.group_size, max_turns=1, max_actions_per_turn=1,
            max_actions_per_traj=1, response_length=16, think=False, prefill=True,
        )
        .inference(engine=args.engine, kv_cache_gb=1.0, max_model_len=1024)
        .training(
            advantage_estimator=args.estimator, rollout_filter_ratio=1.0, mini_batch_size=args.n_groups * args.group_size,
            micro_batch_size=8, actor_lr=args.lr, entropy_coeff=0.0,
        )
        .starpo_evaluation(eval_interval=0, eval_size=args.eval_size, eval_temperature=0.5)
        .debugging(seed=0)
    )


def main(argv=None) -> None:
    args = parse_args(argv)
    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    config = build_config(args, args.model)
    started = time.perf_counter()
    model = warm_start(
        args.model,
        WarmStartConfig(
            env=args.env, env_config={"high_prob": args.high_prob}, protocol=config.protocol_config,
            budget=config.turn_budget, num_examples=32, answers_per_prompt=2, epochs=2, batch_size=8, lr=1e-4,
        ),
        progress=True,
    )
    print(f"warm start ready in {time.perf_counter() - started:.0f}s: {model}")
    algo = build_config(args, str(model)).build_algo()
    try:
        before = algo.evaluate_fixed_seeds()
        print(f"iter 0 (eval, before training): success {before['success_rate']:.3f} "
              f"return {before['episode_return_mean']:.3f} valid {before['valid_action_ratio']:.2f}")
        for iteration in range(1, args.iters + 1):
            began = time.perf_counter()
            runners = algo.train()["env_runners"]
            print(f"iter {iteration}: success {runners['success_rate']:.3f} return {runners['episode_return_mean']:.3f} "
                  f"valid {runners['valid_action_ratio']:.2f} ({time.perf_counter() - began:.0f}s)", flush=True)
        after = algo.evaluate_fixed_seeds()
    finally:
        algo.stop()
    ratio = after["success_rate"] / max(before["success_rate"], 1e-9)
    print(f"eval success before {before['success_rate']:.3f} -> after {after['success_rate']:.3f} "
          f"(x{ratio:.2f}); total {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
