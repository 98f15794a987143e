"""The driver behind every tuned example: flags -> config -> train loop with
progress, MLflow tracking, checkpoints, resume and the `--as-test` check."""

from __future__ import annotations

import argparse
import ast
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import ray

from rllib_ragen.algorithm import StarPO, StarPOConfig
from rllib_ragen.presets import PRESETS, preset
from rllib_ragen.tracking import MLflowTracker, config_params, flatten_metrics, trajectories_html
from rllib_ragen.warm_start import WarmStartConfig, warm_start

logger = logging.getLogger("rllib_ragen")

LATEST = "latest"
RUN_ID_FILE = "mlflow_run_id.txt"


def build_parser(*, env: str, description: str, success_threshold: float, stop_iters: int) -> argparse.ArgumentParser:
    """The flags every tuned example takes (RLlib's tuned-example style)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--env", default=env, help="registered env name")
    parser.add_argument("--preset", choices=PRESETS, default="cpu", help="cpu: SmolLM2-135M on CPU; gpu: RAGEN's defaults")
    parser.add_argument("--stop-iters", type=int, default=stop_iters, help="training iterations")
    parser.add_argument("--as-test", action="store_true", help="exit 1 unless the success threshold is reached")
    parser.add_argument("--success-threshold", type=float, default=success_threshold,
                        help="success rate --as-test requires (evaluation's if evaluated, else training's)")
    parser.add_argument("--model", help="model name, local HF dir or hub id (default: the preset's)")
    parser.add_argument("--engine", choices=("auto", "vllm", "hf"), help="rollout engine (default: the preset's)")
    parser.add_argument("--num-engines", type=int, help="vLLM engine actors")
    parser.add_argument("--n-groups", type=int, help="groups per iteration")
    parser.add_argument("--group-size", type=int, help="trajectories per group")
    parser.add_argument("--max-turns", type=int, help="turns per trajectory")
    parser.add_argument("--estimator", choices=("gae", "bi_level_gae", "grpo", "brpo", "arpo"), help="advantage estimator")
    parser.add_argument("--no-think", action="store_true", help="answer with <answer> only (no-think mode)")
    parser.add_argument("--no-warm-start", action="store_true", help="skip the supervised format warm start")
    parser.add_argument("--warm-start-examples", type=int, default=16, help="prompts in the format warm start (2 random answers each)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="set any StarPOConfig attribute, e.g. --set actor_lr=1e-5 (repeatable)")
    parser.add_argument("--seed", type=int, help="random seed")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite:///./mlflow.db)")
    parser.add_argument("--experiment", default="rllib-ragen", help="MLflow experiment name")
    parser.add_argument("--checkpoint-dir", help="where checkpoints go (default: ./checkpoints/<env>-starpo)")
    parser.add_argument("--checkpoint-every", type=int, default=1, help="save every N iterations")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    return parser


def config_from_args(args: argparse.Namespace) -> StarPOConfig:
    """The preset for the env, with the flags applied and validated."""
    config = preset(args.preset, args.env)
    config.llm(model=args.model or config.llm_model)
    config.inference(engine=args.engine or config.engine, num_engines=args.num_engines or config.num_engines)
    config.rollouts(
        n_groups=args.n_groups or config.n_groups,
        group_size=args.group_size or config.group_size,
        max_turns=args.max_turns or config.max_turns,
        think=False if args.no_think else config.think,
        prefill=True if args.no_think else config.prefill,
    )
    if args.estimator:
        config.training(advantage_estimator=args.estimator)
        if args.estimator in ("grpo", "brpo", "arpo"):
            config.llm(critic="none")
    if args.seed is not None:
        config.debugging(seed=args.seed)
    for assignment in args.set:
        apply_setting(config, assignment)
    config.validate_starpo()
    return config


def apply_setting(config: StarPOConfig, assignment: str) -> None:
    """Applies one `KEY=VALUE` (VALUE as a Python literal, else a string)."""
    key, sep, raw = assignment.partition("=")
    if not sep:
        raise ValueError(f"--set expects KEY=VALUE, got {assignment!r}")
    if not hasattr(config, key):
        raise ValueError(f"unknown config key {key!r} in --set {assignment!r}")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    setattr(config, key, value)


def apply_warm_start(config: StarPOConfig, *, num_examples: int) -> None:
    """Replaces the model by its format-warm-started copy (built once, cached)."""
    ws = WarmStartConfig(
        env=config.env,
        env_config=dict(config.env_config),
        protocol=config.protocol_config,
        budget=config.turn_budget,
        num_examples=num_examples,
        answers_per_prompt=2,
        epochs=2,
        batch_size=8,
        lr=1e-4 if config.llm_model != "tiny-random" else 3e-3,
    )
    print(f"format warm start of {config.llm_model} on {config.env} ({num_examples} examples; cached after the first run)")
    config.llm(model=str(warm_start(config.llm_model, ws, progress=True)))


def run(config: StarPOConfig, args: argparse.Namespace) -> dict[str, Any]:
    """Trains for `args.stop_iters` iterations; returns the last result."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    checkpoint_dir = Path(args.checkpoint_dir or Path("checkpoints") / f"{config.env}-starpo").resolve()
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    algo, start = _build_or_resume(config, checkpoint_dir, resume=args.resume)
    tracker = _tracker(args, checkpoint_dir, run_name=f"{config.env}-starpo")
    tracker.log_params(config_params(algo.config))
    print(f"MLflow run: {tracker.run_url}\ncheckpoints: {checkpoint_dir}\n{algo.config.rollout_summary}")
    result: dict[str, Any] = {}
    status = "FAILED"
    try:
        for iteration in range(start, args.stop_iters):
            began = time.perf_counter()
            result = algo.train()
            tracker.log_metrics(flatten_metrics(result), step=iteration + 1)
            _log_evaluation_page(algo, tracker, iteration + 1)
            print(progress_line(iteration + 1, args.stop_iters, result, time.perf_counter() - began), flush=True)
            if (iteration + 1) % args.checkpoint_every == 0 or iteration + 1 == args.stop_iters:
                save_checkpoint(algo, checkpoint_dir)
        policy_dir = algo.export_policy(checkpoint_dir / "final_policy")
        tracker.log_artifacts(policy_dir, "final_policy")
        status = "FINISHED"
    finally:
        tracker.end(status)
        algo.stop()
    print(f"done. MLflow run: {tracker.run_url}; final policy (HF format): {checkpoint_dir / 'final_policy'}")
    if args.as_test:
        check_success(result, args.success_threshold)
    return result


def _build_or_resume(config: StarPOConfig, checkpoint_dir: Path, *, resume: bool) -> tuple[StarPO, int]:
    latest = checkpoint_dir / LATEST
    if resume and latest.exists():
        algo = StarPO.from_checkpoint(str(latest))
        print(f"resumed from {latest} at iteration {algo.iteration}")
        return algo, algo.iteration
    if resume:
        print(f"--resume: no checkpoint in {checkpoint_dir}; starting fresh")
    return config.build_algo(), 0


def _tracker(args: argparse.Namespace, checkpoint_dir: Path, *, run_name: str) -> MLflowTracker:
    run_id_file = checkpoint_dir / RUN_ID_FILE
    run_id = run_id_file.read_text().strip() if args.resume and run_id_file.exists() else None
    tracker = MLflowTracker(tracking_uri=args.tracking_uri, experiment=args.experiment, run_name=run_name, run_id=run_id)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    run_id_file.write_text(tracker.run_id)
    return tracker


def save_checkpoint(algo: StarPO, checkpoint_dir: Path) -> Path:
    """Saves to `<dir>/latest` atomically: a crash mid-save never loses the previous one."""
    partial = checkpoint_dir / f"{LATEST}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    algo.save_to_path(str(partial))
    latest = checkpoint_dir / LATEST
    previous = checkpoint_dir / f"{LATEST}.previous"
    shutil.rmtree(previous, ignore_errors=True)
    if latest.exists():
        latest.rename(previous)
    partial.rename(latest)
    shutil.rmtree(previous, ignore_errors=True)
    return latest


def _log_evaluation_page(algo: StarPO, tracker: MLflowTracker, step: int) -> None:
    episodes = algo.pop_evaluation_episodes()
    if episodes:
        page = trajectories_html(episodes, title=f"{algo.config.env} evaluation at iteration {step}")
        tracker.log_text(page, f"trajectories/eval_iter_{step:04d}.html")


def progress_line(iteration: int, total: int, result: dict[str, Any], seconds: float) -> str:
    runners = result.get("env_runners", {})
    learner = result.get("learners", {}).get("default_policy", {})
    evaluation = result.get("evaluation", {})
    parts = [
        f"[{iteration}/{total}]",
        f"success {runners.get('success_rate', float('nan')):.3f}",
        f"return {runners.get('episode_return_mean', float('nan')):.3f}",
        f"in-group std {runners.get('in_group_reward_std', float('nan')):.3f}",
        f"entropy {learner.get('entropy', float('nan')):.3f}",
        f"valid {runners.get('valid_action_ratio', float('nan')):.2f}",
    ]
    if "success_rate" in evaluation:
        parts.append(f"eval success {evaluation['success_rate']:.3f}")
    parts.append(f"{seconds:.1f}s")
    return " | ".join(parts)


def check_success(result: dict[str, Any], threshold: float) -> None:
    """`--as-test`: exits 1 unless the success rate reached the threshold."""
    evaluation = result.get("evaluation", {})
    source = evaluation if "success_rate" in evaluation else result.get("env_runners", {})
    success = float(source.get("success_rate", 0.0))
    if success < threshold:
        print(f"--as-test FAILED: success {success:.3f} < {threshold}", file=sys.stderr)
        sys.exit(1)
    print(f"--as-test passed: success {success:.3f} >= {threshold}")


def main(*, env: str, description: str, success_threshold: float, stop_iters: int, argv: list[str] | None = None) -> None:
    """Entry point of a tuned example."""
    args = build_parser(
        env=env, description=description, success_threshold=success_threshold, stop_iters=stop_iters
    ).parse_args(argv)
    config = config_from_args(args)
    if not args.no_warm_start and not args.resume:
        apply_warm_start(config, num_examples=args.warm_start_examples)
    run(config, args)

