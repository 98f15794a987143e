"""Offline Sokoban: solver demonstrations -> Parquet -> behaviour cloning (or offline StarPO) -> evaluation.

1. The breadth-first solver solves `--num-demos` rooms (seeds from `--demo-seed`);
   each plan is played through the rollout prompt protocol as well-formed answers.
2. The demonstrations are written to `<data-dir>/demos.parquet` (the trajectory
   schema of `rllib_ragen.data.schema`).
3. The policy trains from that file through RLlib's offline API: `--objective bc`
   clones the demonstrations (NLL of their answer tokens), `--objective starpo`
   runs the StarPO update on them as if they were rollouts.
4. Before and after training: the demonstrations' NLL per answer token, and the
   success rate on the evaluation rooms (`--eval-size` seeds, disjoint from the
   demonstration seeds) played by the policy itself.

`--as-test` exits 1 unless the NLL fell and the final success rate reaches
`--success-threshold`. `python tuned_examples/sokoban_offline.py --help` lists the flags.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from envs.user_errors import CLIParser, front_door, input_checks
from rllib_ragen.algorithm.presets import PRESETS
from rllib_ragen.run.flags import non_negative_int, positive_float, positive_int
from rllib_ragen.run.given_paths import check_writable_dir


def build_parser() -> argparse.ArgumentParser:
    parser = CLIParser(
        description="Sokoban from solver demonstrations: Parquet -> offline BC or StarPO -> evaluation.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--preset", choices=PRESETS, default="cpu", help="cpu: SmolLM2-135M; gpu: RAGEN's defaults")
    parser.add_argument("--model", help="model name, local HF dir or hub id (default: the preset's)")
    parser.add_argument("--engine", choices=("auto", "vllm", "hf"), help="evaluation engine (default: the preset's)")
    parser.add_argument("--objective", choices=("bc", "starpo"), default="bc", help="offline training objective")
    parser.add_argument("--num-demos", type=positive_int, default=64, help="rooms tried (those not solvable in budget skipped)")
    parser.add_argument("--demo-seed", type=non_negative_int, default=100_000, help="first demonstration seed")
    parser.add_argument("--data-dir", default="data/sokoban-demos", help="where demos.parquet is written")
    parser.add_argument("--stop-iters", type=non_negative_int, default=30, help="offline training iterations")
    parser.add_argument("--groups-per-iter", type=positive_int, default=8, help="demonstrations per iteration")
    parser.add_argument("--lr", type=positive_float, default=1e-4, help="actor learning rate")
    parser.add_argument("--eval-size", type=positive_int, default=16, help="evaluation rooms")
    parser.add_argument("--eval-temperature", type=float, default=0.0, help="evaluation temperature (0 = greedy)")
    parser.add_argument("--no-think", action="store_true", help="no-think mode: <answer> only, prefilled")
    parser.add_argument("--export-dir", help="also save the trained policy here as a Hugging Face model")
    parser.add_argument("--as-test", action="store_true", help="exit 1 unless the NLL fell and success >= threshold")
    parser.add_argument("--success-threshold", type=float, default=0.0, help="final success rate --as-test requires")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    return parser


def make_config(args: argparse.Namespace):
    """The preset for Sokoban with the flags applied (online parts: evaluation only)."""
    from rllib_ragen.algorithm.presets import preset

    config = preset(args.preset, "sokoban")
    config.llm(model=args.model or config.llm_module.model)
    config.inference(engine=args.engine or config.rollout_engine.kind)
    config.rollouts(n_groups=args.groups_per_iter, think=not args.no_think, prefill=args.no_think or config.protocol.prefill)
    # A demonstration group is one trajectory: no in-group spread for the StarPO-S filter to rank.
    config.training(actor_lr=args.lr, mini_batch_size=args.groups_per_iter, rollout_filter_ratio=1.0)
    config.starpo_evaluation(eval_interval=0, eval_size=args.eval_size, eval_temperature=args.eval_temperature)
    config.debugging(seed=args.seed)
    demo_seeds = range(args.demo_seed, args.demo_seed + args.num_demos)
    eval_seeds = config.starpo_eval.seeds
    if set(demo_seeds) & set(eval_seeds):
        raise ValueError(f"demonstration seeds {demo_seeds} overlap evaluation seeds {eval_seeds}; move --demo-seed")
    return config, demo_seeds


@front_door
def main(argv: list[str] | None = None) -> dict[str, float]:
    args = build_parser().parse_args(argv)
    check_writable_dir(args.data_dir, flag="--data-dir")
    if args.export_dir:
        check_writable_dir(args.export_dir, flag="--export-dir")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from rllib_ragen.algorithm.offline_training import OfflineSettings, learner_nll, offline_config
    from rllib_ragen.data.demonstrations import (
        DemonstrationSettings,
        expert_demonstrations,
    )
    from rllib_ragen.data.parquet import write_trajectories
    from rllib_ragen.models import load_tokenizer, resolve_model
    from rllib_ragen.run.ray_session import init_ray

    with input_checks():
        config, demo_seeds = make_config(args)
        config.validate_starpo()
        config.check_inputs()
    demo_config = DemonstrationSettings(
        seeds=tuple(demo_seeds), env_config=dict(config.env_config),
        protocol=config.protocol, budget=config.turn_budget,
    )
    demos = expert_demonstrations(load_tokenizer(resolve_model(config.llm_module.model, progress=True)), demo_config)
    if not demos:
        raise SystemExit(f"the solver found no plan within the turn budget for seeds {demo_seeds}")
    path = Path(args.data_dir) / "demos.parquet"
    write_trajectories(demos, path, env=config.env, env_config=config.env_config)
    print(f"{len(demos)} demonstrations ({len(demo_seeds)} rooms tried) -> {path}")

    offline_config(config, OfflineSettings(str(path), objective=args.objective))
    init_ray()  # Ray Data's workers map the Parquet rows: they import rllib_ragen from this checkout
    algo = config.build_algo()
    try:
        before = {"nll": learner_nll(algo, demos), "success": algo.evaluate_fixed_seeds()["success_rate"]}
        print(f"before: demo NLL/token {before['nll']:.3f} | eval success {before['success']:.3f}")
        for iteration in range(args.stop_iters):
            began = time.perf_counter()
            result = algo.train()
            learner = result["learners"]["default_policy"]
            loss = learner.get("bc_nll", learner.get("policy_loss", float("nan")))
            seconds = time.perf_counter() - began
            print(f"[{iteration + 1}/{args.stop_iters}] loss {loss:.3f} | {seconds:.1f}s", flush=True)
        after = {"nll": learner_nll(algo, demos), "success": algo.evaluate_fixed_seeds()["success_rate"]}
        print(f"after:  demo NLL/token {after['nll']:.3f} | eval success {after['success']:.3f}")
        if args.export_dir:
            print(f"policy saved to {algo.export_policy(args.export_dir)}")
    finally:
        algo.stop()
    if args.as_test and (after["nll"] >= before["nll"] or after["success"] < args.success_threshold):
        print(f"--as-test FAILED: NLL {before['nll']:.3f} -> {after['nll']:.3f}, success {after['success']:.3f} "
              f"(threshold {args.success_threshold})", file=sys.stderr)
        sys.exit(1)
    return after


if __name__ == "__main__":
    main()
