"""The driver behind every tuned example: flags -> config -> train loop with
progress, MLflow tracking, checkpoints, resume and the `--as-test` check."""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ray.rllib.algorithms.algorithm import Algorithm

from rllib_ragen.algorithm import StarPOConfig
from rllib_ragen.callbacks import FINAL_POLICY, MLflowCallback, MLflowSettings, mlflow_callback_of, with_mlflow
from rllib_ragen.checkpoints import latest_checkpoint
from rllib_ragen.models import resolve_model
from rllib_ragen.presets import PRESETS, preset
from rllib_ragen.ray_session import init_ray
from rllib_ragen.tracking import DEFAULT_EXPERIMENT
from rllib_ragen.data.experts import has_expert
from rllib_ragen.intervals import format_rate, paired_difference_interval
from rllib_ragen.warm_start import WARM_START_PLAYERS, WarmStartConfig, warm_start

logger = logging.getLogger("rllib_ragen")


def build_parser(
    *, env: str, description: str, success_threshold: float, stop_iters: int, time_budget_min: float | None = None
) -> argparse.ArgumentParser:
    """The flags every tuned example takes (RLlib's tuned-example style)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_config_flags(parser, env=env, stop_iters=stop_iters)
    add_tracking_flags(parser)
    parser.add_argument("--time-budget-min", type=float, default=time_budget_min,
                        help="training time budget: the iteration expected to cross it is the last (it evaluates "
                             "and checkpoints); --stop-iters still applies")
    parser.add_argument("--summary-json", metavar="PATH",
                        help="write the before/after evaluation (per-seed outcomes and intervals) as JSON")
    parser.add_argument("--as-test", action="store_true", help="exit 1 unless the success threshold is reached")
    parser.add_argument("--success-threshold", type=float, default=success_threshold,
                        help="success rate --as-test requires (evaluation's if evaluated, else training's)")
    parser.add_argument("--checkpoint-dir", help="where checkpoints go (default: ./checkpoints/<env>-starpo)")
    parser.add_argument("--checkpoint-every", type=int, default=1,
                        help="save a local checkpoint every N iterations (and at the end, or on Ctrl-C); "
                             "metrics reach MLflow with the checkpoint")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest complete checkpoint in --checkpoint-dir, in its MLflow run")
    return parser


def add_config_flags(parser: argparse.ArgumentParser, *, env: str, stop_iters: int) -> None:
    """Flags that build the `StarPOConfig` (read by `config_from_args`)."""
    parser.add_argument("--env", default=env, help="registered env name")
    parser.add_argument("--preset", choices=PRESETS, default="cpu", help="cpu: SmolLM2-135M on CPU; gpu: RAGEN's defaults")
    parser.add_argument("--stop-iters", type=int, default=stop_iters, help="training iterations")
    parser.add_argument("--model", help="model name, local HF dir or hub id (default: the preset's)")
    parser.add_argument("--engine", choices=("auto", "vllm", "hf"), help="rollout engine (default: the preset's)")
    parser.add_argument("--num-engines", type=int, help="vLLM engine actors")
    parser.add_argument("--n-groups", type=int, help="groups per iteration")
    parser.add_argument("--group-size", type=int, help="trajectories per group")
    parser.add_argument("--max-turns", type=int, help="turns per trajectory")
    parser.add_argument("--estimator", choices=("gae", "bi_level_gae", "grpo", "brpo", "arpo"), help="advantage estimator")
    parser.add_argument("--no-think", action="store_true", help="answer with <answer> only (no-think mode)")
    parser.add_argument("--no-warm-start", action="store_true", help="skip the supervised format warm start")
    parser.add_argument("--warm-start-model", metavar="DIR",
                        help="use this warm-started model directory (a Hugging Face directory, e.g. an earlier "
                             "run's final_policy/ or a warm start's cache entry) instead of building the warm start")
    parser.add_argument("--warm-start", choices=WARM_START_PLAYERS, dest="warm_start_player",
                        help="who plays the warm start's demonstrations: random (the answer format only) or "
                             "expert (the env's solver: RAGEN's SFT start); default: expert where the env has one")
    parser.add_argument("--warm-start-examples", type=int, default=16,
                        help="initial states played in the warm start (random play: 2 trajectories each)")
    parser.add_argument("--eval-size", type=int, help="fixed evaluation seeds (default: the preset's)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="set any StarPOConfig attribute, e.g. --set actor_lr=1e-5 (repeatable)")
    parser.add_argument("--seed", type=int, help="random seed")


def add_tracking_flags(parser: argparse.ArgumentParser) -> None:
    """Flags of the MLflow tracking (read by `mlflow_settings`)."""
    parser.add_argument("--tracking-uri", help="MLflow tracking URI, e.g. http://127.0.0.1:5000 (default: sqlite:///./mlflow.db)")
    parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment name")
    parser.add_argument("--log-checkpoint-every", type=int, default=0,
                        help="also log a checkpoint to MLflow every N iterations (0: only the last one)")


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
    if args.eval_size is not None:
        config.starpo_evaluation(eval_size=args.eval_size)
    for assignment in args.set:
        apply_setting(config, assignment)
    config.validate_starpo()
    return config


def apply_setting(config: StarPOConfig, assignment: str) -> None:
    """Applies one `KEY=VALUE` (VALUE as a Python literal, else a string)."""
    key, raw = split_assignment(config, assignment, flag="--set")
    setattr(config, key, parse_literal(raw))


def split_assignment(config: StarPOConfig, assignment: str, *, flag: str) -> tuple[str, str]:
    """`KEY=VALUE` -> (KEY, VALUE), KEY checked to be a config attribute."""
    key, sep, raw = assignment.partition("=")
    if not sep:
        raise ValueError(f"{flag} expects KEY=VALUE, got {assignment!r}")
    if not hasattr(config, key):
        raise ValueError(f"unknown config key {key!r} in {flag} {assignment!r}")
    return key, raw


def parse_literal(raw: str) -> Any:
    """A Python literal (`3`, `1e-5`, `None`, `(1, 2)`), else the text itself."""
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def apply_warm_start(config: StarPOConfig, *, num_examples: int, player: str | None = None) -> None:
    """Replaces the model by its warm-started copy (built once, cached).

    `player` None: the expert where the env has one (a policy that already
    solves part of the task: RL gains most there, see the README's CPU
    learning table), else random play (the answer format only).
    """
    player = player or ("expert" if has_expert(config.env) else "random")
    tiny = config.llm_model == "tiny-random"
    ws = WarmStartConfig(
        env=config.env,
        env_config=dict(config.env_config),
        protocol=config.protocol_config,
        budget=config.turn_budget,
        num_examples=num_examples,
        answers_per_prompt=2,
        epochs=2,
        batch_size=8,
        lr=3e-3 if tiny else (3e-4 if player == "expert" else 1e-4),
        player=player,
        autocast_dtype=config.autocast_dtype,
    )
    print(f"{player}-play warm start of {config.llm_model} on {config.env} ({num_examples} states; "
          "cached after the first run)")
    config.llm(model=str(warm_start(config.llm_model, ws, progress=True)))


def run(config: StarPOConfig, args: argparse.Namespace) -> dict[str, Any]:
    """Trains until iteration `args.stop_iters`, logging to MLflow; returns the last result.

    Raises:
        ValueError: `--checkpoint-dir` holds a checkpoint and `--resume` is not given.
        KeyboardInterrupt: stopped by Ctrl-C (after checkpointing, see `_train`).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    checkpoint_dir = Path(args.checkpoint_dir or Path("checkpoints") / f"{config.env}-starpo").resolve()
    resume_from = latest_checkpoint(checkpoint_dir)
    if resume_from is not None and not args.resume:
        # A fresh run would delete it at its first save; and a crash before its own
        # iteration exceeded the old one's would make --resume pick the old run.
        raise ValueError(
            f"--checkpoint-dir {checkpoint_dir} holds a checkpoint of an earlier run ({resume_from.name}): "
            "pass --resume to continue that run, or another --checkpoint-dir to start a new one"
        )
    if args.resume and resume_from is None:
        print(f"--resume: no complete checkpoint in {checkpoint_dir}; starting fresh")
    init_ray()
    settings = mlflow_settings(
        args, run_name=f"{config.env}-starpo", checkpoint_dir=checkpoint_dir, checkpoint_every=args.checkpoint_every
    )
    algo = with_mlflow(config, settings).build_algo()
    try:
        callback = mlflow_callback_of(algo)
        if resume_from is not None:
            callback.restore(algo, resume_from)
            print(f"resumed from {resume_from} at iteration {algo.iteration}")
        tracker = callback.start(algo)
        print(f"MLflow run: {tracker.run_url}\ncheckpoints: {checkpoint_dir}\n{algo.config.rollout_summary}")
        before = evaluate_before_training(algo, callback) if algo.iteration == 0 and algo.config.eval_interval else None
        began = time.perf_counter()
        result = _train(algo, callback, stop_iters=args.stop_iters, budget_s=_minutes(args.time_budget_min))
        if before is not None and "success_rate" in result.get("evaluation", {}):
            summary = summarize(before[1], algo.last_evaluation_successes, iterations=algo.iteration,
                                minutes=(time.perf_counter() - began) / 60)
            if args.summary_json:
                summary.update(stats_before=before[0], stats_after=result["evaluation"])
                Path(args.summary_json).write_text(json.dumps(summary, default=float))
    finally:
        algo.stop()
    print(f"done. MLflow run: {tracker.run_url}; final policy (HF format): {checkpoint_dir / FINAL_POLICY}")
    if args.as_test:
        check_success(result, args.success_threshold)
    return result


def evaluate_before_training(algo: Algorithm, callback: MLflowCallback) -> tuple[dict[str, float], list[float]]:
    """Evaluates the starting (e.g. warm-started) policy on the fixed evaluation seeds, logged as step 0.

    Returns the evaluation's statistics and the 0/1 success of each evaluation seed.
    """
    stats = algo.evaluate_fixed_seeds()
    successes = list(algo.last_evaluation_successes)
    callback.log_initial_evaluation(algo, stats)
    print(f"[0] before RL, on the {algo.config.eval_size} evaluation seeds: success {format_rate(successes)} | "
          f"return {stats['episode_return_mean']:.3f} | valid {stats['valid_action_ratio']:.2f}", flush=True)
    return stats, successes


def summarize(before: list[float], after: list[float], *, iterations: int, minutes: float) -> dict[str, Any]:
    """Prints success before and after RL on the same seeds with 95% intervals; returns them."""
    difference, low, high = paired_difference_interval(before, after)
    verdict = "learned" if low > 0 else ("got worse" if high < 0 else "no change beyond chance")
    print(f"success on {len(before)} evaluation seeds (95% intervals): before RL {format_rate(before)} -> "
          f"after {iterations} iterations ({minutes:.1f} min) {format_rate(after)}; "
          f"change {difference:+.3f} [{low:+.3f}, {high:+.3f}]: {verdict}", flush=True)
    return {"before": before, "after": after, "iterations": iterations, "minutes": minutes,
            "difference": difference, "difference_interval": [low, high]}


def _minutes(minutes: float | None) -> float | None:
    return None if minutes is None else 60.0 * minutes


def _train(algo: Algorithm, callback: MLflowCallback, *, stop_iters: int, budget_s: float | None = None) -> dict[str, Any]:
    """Iterates up to `stop_iters`, or until `budget_s` seconds would be passed; the
    callback checkpoints and closes the run at the last iteration, which evaluates.

    Ctrl-C stops after the running iteration: it is checkpointed, the run is
    closed KILLED and KeyboardInterrupt raised. A second Ctrl-C, or an error,
    inside an iteration closes the run KILLED or FAILED without a checkpoint:
    the algorithm is then mid-iteration (training seeds drawn, maybe some
    updates applied), so the last checkpoint is the consistent state to resume.
    """
    result: dict[str, Any] = {}
    if algo.iteration >= stop_iters:
        print(f"already at iteration {algo.iteration} >= --stop-iters {stop_iters}; nothing to train")
        callback.finish(algo)  # a kill may have come between the last checkpoint and the run's end
        return result
    algo.final_iteration = stop_iters
    started, longest = time.perf_counter(), 0.0
    with stop_requests() as stop:
        try:
            while algo.iteration < stop_iters and not stop.is_set():
                if budget_s is not None and time.perf_counter() - started + 2 * longest > budget_s:
                    # The next iteration (twice the longest so far: it evaluates) is the last in the budget.
                    stop_iters = algo.iteration + 1
                    algo.final_iteration = stop_iters
                    callback.settings = dataclasses.replace(callback.settings, stop_iters=stop_iters)
                began = time.perf_counter()
                result = algo.train()
                longest = max(longest, time.perf_counter() - began)
                print(progress_line(algo.iteration, stop_iters, result, time.perf_counter() - began), flush=True)
        except KeyboardInterrupt:
            callback.end("KILLED")
            raise
        except Exception:
            callback.end("FAILED")
            raise
    if algo.iteration < stop_iters:
        callback.checkpoint(algo)
        callback.end("KILLED")
        raise KeyboardInterrupt
    return result


@contextlib.contextmanager
def stop_requests() -> Iterator[threading.Event]:
    """Within: the first Ctrl-C (SIGINT) sets the yielded event instead of
    interrupting; a second one raises KeyboardInterrupt as usual. Off the main
    thread (where Python can't take signals) the event is never set."""
    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return

    def on_sigint(signum: int, frame: Any) -> None:
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()
        # os.write: print() may be mid-write in the interrupted frame.
        os.write(2, b"\nCtrl-C: stopping after this iteration, which is checkpointed (Ctrl-C again: stop now)\n")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield requested
    finally:
        signal.signal(signal.SIGINT, previous)


def mlflow_settings(
    args: argparse.Namespace,
    *,
    run_name: str | None = None,
    checkpoint_dir: Path | None = None,
    checkpoint_every: int = 1,
) -> MLflowSettings:
    """The MLflow callback settings the tracking flags ask for."""
    uri = {"tracking_uri": args.tracking_uri} if args.tracking_uri else {}
    return MLflowSettings(
        **uri, experiment=args.experiment, run_name=run_name, stop_iters=args.stop_iters,
        checkpoint_dir=str(checkpoint_dir) if checkpoint_dir is not None else None,
        checkpoint_every=checkpoint_every, log_checkpoint_every=args.log_checkpoint_every,
    )


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


def main(
    *, env: str, description: str, success_threshold: float, stop_iters: int, time_budget_min: float | None = None,
    argv: list[str] | None = None,
) -> None:
    """Entry point of a tuned example."""
    args = build_parser(
        env=env, description=description, success_threshold=success_threshold, stop_iters=stop_iters,
        time_budget_min=time_budget_min,
    ).parse_args(argv)
    config = config_from_args(args)
    choose_starting_model(config, args)
    try:
        run(config, args)
    except KeyboardInterrupt:
        print("stopped by Ctrl-C; --resume continues from the last checkpoint", file=sys.stderr)
        sys.exit(130)


def choose_starting_model(config: StarPOConfig, args: argparse.Namespace) -> None:
    """The model RL starts from: a given warm-started one, none, or the (cached) format warm start."""
    if args.warm_start_model and args.no_warm_start:
        raise ValueError("--warm-start-model and --no-warm-start contradict each other; pass one")
    if args.warm_start_model:
        config.llm(model=str(resolve_model(args.warm_start_model)))
    elif not args.no_warm_start:  # cached: a resumed run gets the same warm-started model back
        init_ray()
        apply_warm_start(config, num_examples=args.warm_start_examples, player=args.warm_start_player)

