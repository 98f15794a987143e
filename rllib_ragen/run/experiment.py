"""The driver behind every tuned example and `rllib-ragen train`: flags -> config ->
train loop with progress, MLflow tracking, checkpoints, resume and the `--as-test` check.

`TUNED_RUNS` holds each env's defaults (description, success threshold,
iterations, job budget): `python tuned_examples/sokoban_starpo.py` and
`rllib-ragen train --env sokoban` are the same run.

Only light modules are imported at the top (`--help` must not wait for Ray or
torch); the rest is imported where it is used. Flag and config errors end the
job with one line, `error: ...`, and exit code 2, before Ray starts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs import check_env
from envs.base import parse_literal
from rllib_ragen.algorithm.presets import PRESETS, preset
from rllib_ragen.data.experts import WARM_START_PLAYERS, WARM_START_STATES
from rllib_ragen.intervals import format_rate, paired_difference_interval
from rllib_ragen.run.console import (
    IterationProgress,
    quiet_progress_bars,
    route_library_logs,
)
from rllib_ragen.training.advantages import ADVANTAGE_ESTIMATORS, needs_critic

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm import Algorithm

    from rllib_ragen.algorithm.starpo import StarPOConfig
    from rllib_ragen.run.callbacks import MLflowCallback, MLflowSettings

RUN_LOG = "run.log"
# What a user's flags or settings can get wrong; reported as one line (exit code 2).
USER_ERRORS = (ValueError, TypeError, FileNotFoundError)


@dataclasses.dataclass(frozen=True)
class TunedRun:
    """What a run of one env does without flags (each is also a flag but `description`).

    Args:
        description: The first line of `--help`.
        success_threshold: Success rate `--as-test` requires.
        stop_iters: Training iterations.
        job_budget_min: The whole job's time budget in minutes, or None for none.
    """

    description: str
    success_threshold: float = 0.0
    stop_iters: int = 20
    job_budget_min: float | None = None


# The whole job (warm start, evaluations, training) of the grid envs within 30 minutes on any 2 cores: a CPU
# without bf16 units spends longer on the warm start and evaluations, and training gets what is left.
TUNED_RUNS: dict[str, TunedRun] = {
    "bandit": TunedRun(
        "Train an LLM agent to prefer the better arm of a two-armed bandit with StarPO.",
        # Measured (docs/results/bandit.md, 128 seeds): 0.648 [0.562, 0.726] after 20 iterations, the
        # random-play warm start alone 0.445 [0.362, 0.532]: the threshold sits between the intervals.
        success_threshold=0.55,
        stop_iters=20,
    ),
    "countdown": TunedRun("Train an LLM agent on Countdown equations with StarPO.", stop_iters=20),
    "frozenlake": TunedRun(
        "Train an LLM agent on FrozenLake (deterministic ice, the state in words) with StarPO.",
        # Measured after RL: 0.672-0.688 on the evaluation seeds (docs/results/learnable_frozenlake.md);
        # the expert warm start alone reaches 0.484, so a run that did not learn fails.
        success_threshold=0.6,
        stop_iters=200,
        job_budget_min=27.0,
    ),
    "sokoban": TunedRun(
        "Train an LLM agent to solve Sokoban rooms (6x6, one box, in words) with StarPO.",
        # Measured: 0.234-0.250 before and after RL (docs/results/learnable_sokoban.md), the random
        # player 0.113: below 0.2 the policy has lost the warm start's play.
        success_threshold=0.2,
        stop_iters=200,
        job_budget_min=27.0,
    ),
}


def tuned_run(env: str) -> TunedRun:
    """`TUNED_RUNS[env]`, or plain defaults for any other env (e.g. one of your own)."""
    return TUNED_RUNS.get(env, TunedRun(f"Train an LLM agent on {env} with StarPO."))


class CLIParser(argparse.ArgumentParser):
    """argparse with its errors on one line: `error: ...`, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = int(text) if text.lstrip("-").isdigit() else None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    value = int(text) if text.lstrip("-").isdigit() else None
    if value is None or value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def build_parser(
    *,
    env: str,
    description: str,
    success_threshold: float,
    stop_iters: int,
    job_budget_min: float | None = None,
    prog: str | None = None,
) -> argparse.ArgumentParser:
    """The flags every tuned example takes (RLlib's tuned-example style)."""
    parser = CLIParser(prog=prog, description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_config_flags(parser, env=env, stop_iters=stop_iters)
    add_tracking_flags(parser)
    parser.add_argument(
        "--time-budget-min",
        type=positive_float,
        help="training time budget: the iteration expected to cross it is the last (it evaluates "
        "and checkpoints); --stop-iters still applies",
    )
    parser.add_argument(
        "--job-budget-min",
        type=positive_float,
        help="the whole job's time budget, from its start (warm start, evaluations, training): "
        "training gets what the warm start and the first evaluation leave of it (default: "
        f"{job_budget_min} unless --time-budget-min is given)",
    )
    parser.add_argument(
        "--summary-json",
        metavar="PATH",
        help="write the before/after evaluation (per-seed outcomes and intervals) as JSON",
    )
    parser.add_argument("--as-test", action="store_true", help="exit 1 unless the success threshold is reached")
    parser.add_argument(
        "--success-threshold",
        type=float,
        default=success_threshold,
        help="success rate --as-test requires (evaluation's if evaluated, else training's)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        help="where checkpoints, the final policy and the run's log file go (default: ./checkpoints/<env>-starpo)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=positive_int,
        default=1,
        help="save a local checkpoint every N iterations (and at the end, or on Ctrl-C); "
        "metrics reach MLflow with the checkpoint",
    )
    parser.add_argument(
        "--keep-checkpoints",
        type=positive_int,
        default=2,
        help="local checkpoints kept: the newest N complete ones (older ones are removed)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest complete checkpoint in --checkpoint-dir, in its MLflow run",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show the libraries' logs and warnings (Ray, RLlib, vLLM, transformers) on the "
        "console too; by default they go to the run's log file only",
    )
    return parser


def add_config_flags(parser: argparse.ArgumentParser, *, env: str, stop_iters: int) -> None:
    """Flags that build the `StarPOConfig` (read by `config_from_args`)."""
    parser.add_argument(
        "--env",
        default=env,
        help="registered env name, or an env class as an import path module:Class (module "
        "importable from the working directory or PYTHONPATH, e.g. my_envs:GuessEnv)",
    )
    parser.add_argument(
        "--preset", choices=PRESETS, default="cpu", help="cpu: SmolLM2-135M on CPU; gpu: RAGEN's defaults"
    )
    parser.add_argument("--stop-iters", type=positive_int, default=stop_iters, help="training iterations")
    parser.add_argument("--model", help="model name, local HF dir or hub id (default: the preset's)")
    parser.add_argument("--engine", choices=("auto", "vllm", "hf"), help="rollout engine (default: the preset's)")
    parser.add_argument("--num-engines", type=positive_int, help="vLLM engine actors")
    parser.add_argument("--n-groups", type=positive_int, help="groups per iteration")
    parser.add_argument("--group-size", type=positive_int, help="trajectories per group")
    parser.add_argument("--max-turns", type=positive_int, help="turns per trajectory")
    parser.add_argument("--estimator", choices=sorted(ADVANTAGE_ESTIMATORS), help="advantage estimator")
    parser.add_argument("--no-think", action="store_true", help="answer with <answer> only (no-think mode)")
    parser.add_argument("--no-warm-start", action="store_true", help="skip the supervised format warm start")
    parser.add_argument(
        "--warm-start-model",
        metavar="DIR",
        help="use this warm-started model directory (a Hugging Face directory, e.g. an earlier "
        "run's final_policy/ or a warm start's cache entry) instead of building the warm start",
    )
    parser.add_argument(
        "--warm-start",
        choices=WARM_START_PLAYERS,
        dest="warm_start_player",
        help="who plays the warm start's demonstrations: random (the answer format only) or "
        "expert (the env's solver: RAGEN's SFT start); default: expert where the env has one",
    )
    parser.add_argument(
        "--warm-start-examples",
        type=positive_int,
        help="initial states played in the warm start (random play: 2 trajectories each; "
        f"default: {WARM_START_STATES['random']} for random play, "
        f"{WARM_START_STATES['expert']} for the expert)",
    )
    parser.add_argument("--eval-size", type=positive_int, help="fixed evaluation seeds (default: the preset's)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set any StarPOConfig attribute, e.g. --set actor_lr=1e-5 (repeatable; the value "
        "must have the setting's type)",
    )
    parser.add_argument("--seed", type=int, help="random seed")


def add_tracking_flags(parser: argparse.ArgumentParser) -> None:
    """Flags of the MLflow tracking (read by `mlflow_settings`)."""
    parser.add_argument(
        "--tracking-uri", help="MLflow tracking URI, e.g. http://127.0.0.1:5000 (default: sqlite:///./mlflow.db)"
    )
    parser.add_argument("--experiment", help="MLflow experiment name (default: rllib-ragen)")
    parser.add_argument(
        "--log-checkpoint-every",
        type=non_negative_int,
        default=0,
        help="also log a checkpoint to MLflow every N iterations and at the last one "
        "(0: never; the final policy is logged either way)",
    )


def config_from_args(args: argparse.Namespace) -> StarPOConfig:
    """The preset for the env, with the flags applied and validated.

    Raises:
        ValueError, TypeError: a flag or `--set` the config refuses (the message names it).
    """
    if ":" in args.env and os.getcwd() not in sys.path:
        # `python tuned_examples/x.py` puts the script's folder on sys.path, not the working
        # directory, which is where Ray's workers look (and where a user's my_envs.py is).
        sys.path.insert(0, os.getcwd())
    check_env(args.env)  # before the preset imports Ray and torch: a typo fails at once
    config = preset(args.preset, args.env)
    config.llm(model=_given(args.model, config.llm_model))
    config.inference(
        engine=_given(args.engine, config.engine), num_engines=_given(args.num_engines, config.num_engines)
    )
    config.rollouts(
        n_groups=_given(args.n_groups, config.n_groups),
        group_size=_given(args.group_size, config.group_size),
        max_turns=_given(args.max_turns, config.max_turns),
        think=False if args.no_think else config.think,
        prefill=True if args.no_think else config.prefill,
    )
    if args.estimator:
        config.training(advantage_estimator=args.estimator)
        if not needs_critic(args.estimator):
            config.llm(critic="none")
    if args.seed is not None:
        config.debugging(seed=args.seed)
    if args.eval_size is not None:
        config.starpo_evaluation(eval_size=args.eval_size)
    for assignment in args.set:
        apply_setting(config, assignment)
    config.validate_starpo()
    return config


def _given(flag: Any, default: Any) -> Any:
    return default if flag is None else flag


def apply_setting(config: StarPOConfig, assignment: str) -> None:
    """Applies one `KEY=VALUE`, VALUE checked against the setting's type (see `setting_value`)."""
    key, raw = split_assignment(config, assignment, flag="--set")
    setattr(config, key, setting_value(config, key, raw, flag="--set"))


def split_assignment(config: StarPOConfig, assignment: str, *, flag: str) -> tuple[str, str]:
    """`KEY=VALUE` -> (KEY, VALUE), KEY checked to be a config attribute."""
    key, sep, raw = assignment.partition("=")
    if not sep:
        raise ValueError(f"{flag} expects KEY=VALUE, got {assignment!r}")
    if not hasattr(config, key):
        raise ValueError(f"unknown config key {key!r} in {flag} {assignment!r}")
    return key, raw


def setting_value(config: StarPOConfig, key: str, raw: str, *, flag: str) -> Any:
    """The value `raw` gives setting `key`, of the type of the setting's current value.

    A number setting takes a number (an int setting an integer), a flag
    True/False, a text setting any text, a list or tuple setting a list or
    tuple; a setting that is None now (optional) takes any literal. `None`
    is accepted everywhere (`validate_starpo` refuses it where it is wrong).

    Raises:
        ValueError: naming the flag, the setting, the type it takes and the value given.
    """
    current, value = getattr(config, key), parse_literal(raw)
    if current is None or value is None:
        return value
    if isinstance(current, str):
        return raw
    for kind, accepts, example in _SETTING_KINDS:
        if isinstance(current, kind):
            if not accepts(value):
                raise ValueError(f"{flag} {key}={raw}: {key} takes {example}, got {raw!r}")
            return float(value) if kind is float else value
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# (type of the current value, accepted given values, what to tell the user); bool before int (a subclass).
_SETTING_KINDS = (
    (bool, lambda v: isinstance(v, bool), "True or False"),
    (int, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    (float, _is_number, "a number (e.g. 1e-5)"),
    ((list, tuple), lambda v: isinstance(v, (list, tuple)), "a list or tuple (e.g. [1, 2])"),
    (dict, lambda v: isinstance(v, dict), "a dict (e.g. {'key': 1})"),
)


def run(
    config: StarPOConfig,
    args: argparse.Namespace,
    *,
    tags: dict[str, str] | None = None,
    job_started: float | None = None,
) -> dict[str, Any]:
    """Trains until iteration `args.stop_iters`, logging to MLflow (`tags` on a new run); returns the last result.

    `job_started` (a `time.perf_counter()` value, default: now) is when `args.job_budget_min` began.

    Raises:
        ValueError: `--checkpoint-dir` holds a checkpoint and `--resume` is not given.
        KeyboardInterrupt: stopped by Ctrl-C (after checkpointing, see `_train`).
    """
    from rllib_ragen.run.atomic_files import write_text_atomic
    from rllib_ragen.run.callbacks import FINAL_POLICY, mlflow_callback_of, with_mlflow
    from rllib_ragen.run.ray_session import init_ray

    job_started = time.perf_counter() if job_started is None else job_started
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    checkpoint_dir = run_directory(config, args)
    resume_from = checkpoint_to_resume(checkpoint_dir, resume=args.resume)
    if args.resume and resume_from is None:
        print(f"--resume: no complete checkpoint in {checkpoint_dir}; starting fresh")
    print("starting the algorithm: Ray, the inference engines and the learner...", flush=True)
    init_ray()
    settings = mlflow_settings(
        args,
        run_name=f"{config.env}-starpo",
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        tags=tags,
    )
    algo = with_mlflow(config, settings).build_algo()
    try:
        callback = mlflow_callback_of(algo)
        if resume_from is not None:
            callback.restore(algo, resume_from)
            print(f"resumed from {resume_from} at iteration {algo.iteration}")
        tracker = callback.start(algo)
        print(
            f"MLflow run: {tracker.run_url}\ncheckpoints: {checkpoint_dir} (newest {args.keep_checkpoints} kept)\n"
            f"{algo.config.rollout_summary}",
            flush=True,
        )
        before = evaluate_before_training(algo, callback) if algo.iteration == 0 and algo.config.eval_interval else None
        began = time.perf_counter()
        result = _train(algo, callback, stop_iters=args.stop_iters, budget_s=training_budget_s(args, job_started))
        if before is not None and "success_rate" in result.get("evaluation", {}):
            summary = summarize(
                before[1],
                algo.last_evaluation_successes,
                iterations=algo.iteration,
                minutes=(time.perf_counter() - began) / 60,
            )
            if args.summary_json:
                summary.update(
                    stats_before=before[0], stats_after=result["evaluation"], starting_model=algo.config.llm_model
                )
                write_text_atomic(args.summary_json, json.dumps(summary, default=float))
    finally:
        algo.stop()
    print(f"done. MLflow run: {tracker.run_url}; final policy (HF format): {checkpoint_dir / FINAL_POLICY}")
    if args.as_test:
        check_success(result, args.success_threshold)
    return result


def run_directory(config: StarPOConfig, args: argparse.Namespace) -> Path:
    """`--checkpoint-dir`, or ./checkpoints/<env>-starpo with each run of characters other than letters,
    digits, `.`, `_` and `-` in the env name as one `.` (module:Class as module.Class, openenv:http://h:80
    as openenv.http.h.80)."""
    name = re.sub(r"[^\w.-]+", ".", config.env)
    return Path(args.checkpoint_dir or Path("checkpoints") / f"{name}-starpo").resolve()


def checkpoint_to_resume(checkpoint_dir: Path, *, resume: bool) -> Path | None:
    """The checkpoint `--resume` continues from (None: start fresh).

    Raises:
        ValueError: `checkpoint_dir` holds a checkpoint and `resume` is False.
    """
    from rllib_ragen.run.checkpoints import latest_checkpoint

    resume_from = latest_checkpoint(checkpoint_dir)
    if resume_from is not None and not resume:
        # A fresh run would delete it at its first save; and a crash before its own
        # iteration exceeded the old one's would make --resume pick the old run.
        raise ValueError(
            f"--checkpoint-dir {checkpoint_dir} holds a checkpoint of an earlier run ({resume_from.name}): "
            "pass --resume to continue that run, or another --checkpoint-dir to start a new one"
        )
    return resume_from


def evaluate_before_training(algo: Algorithm, callback: MLflowCallback) -> tuple[dict[str, float], list[float]]:
    """Evaluates the starting (e.g. warm-started) policy on the fixed evaluation seeds, logged as step 0.

    Returns the evaluation's statistics and the 0/1 success of each evaluation seed.
    """
    from ray.rllib.utils.metrics import EVALUATION_RESULTS

    # One batched rollout with no progress of its own: minutes on a CPU without bf16 units.
    print(f"[0] evaluating the starting policy on the {algo.config.eval_size} evaluation seeds...", flush=True)
    stats = algo.evaluate_fixed_seeds()
    # Logged as step 0 here, so not also into iteration 1's result (as if iteration 1 had evaluated).
    algo.metrics.delete(EVALUATION_RESULTS, key_error=False)
    successes = list(algo.last_evaluation_successes)
    callback.log_initial_evaluation(algo, stats)
    print(
        f"[0] before RL, on the {algo.config.eval_size} evaluation seeds: success {format_rate(successes)} | "
        f"return {stats['episode_return_mean']:.3f} | valid {stats['valid_action_ratio']:.2f}",
        flush=True,
    )
    return stats, successes


def summarize(before: list[float], after: list[float], *, iterations: int, minutes: float) -> dict[str, Any]:
    """Prints success before and after RL on the same seeds with 95% intervals; returns them."""
    difference, low, high = paired_difference_interval(before, after)
    verdict = "learned" if low > 0 else ("got worse" if high < 0 else "no change beyond chance")
    print(
        f"success on {len(before)} evaluation seeds (95% intervals): before RL {format_rate(before)} -> "
        f"after {iterations} iterations ({minutes:.1f} min) {format_rate(after)}; "
        f"change {difference:+.3f} [{low:+.3f}, {high:+.3f}]: {verdict}",
        flush=True,
    )
    return {
        "before": before,
        "after": after,
        "iterations": iterations,
        "minutes": minutes,
        "difference": difference,
        "difference_interval": [low, high],
    }


def training_budget_s(args: argparse.Namespace, job_started: float) -> float | None:
    """Seconds training may take from now: the tighter of `--time-budget-min` and what is left of
    `--job-budget-min` (None: no budget). Not above zero still trains one iteration, which evaluates."""
    budgets = [60.0 * args.time_budget_min] if args.time_budget_min is not None else []
    if args.job_budget_min is not None:
        budgets.append(60.0 * args.job_budget_min - (time.perf_counter() - job_started))
    return min(budgets, default=None)


def _train(
    algo: Algorithm, callback: MLflowCallback, *, stop_iters: int, budget_s: float | None = None
) -> dict[str, Any]:
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
    progress = IterationProgress(done=algo.iteration, total=stop_iters)
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
                progress.line(progress_line(algo.iteration, stop_iters, result, time.perf_counter() - began))
                progress.advance(total=stop_iters)
        except KeyboardInterrupt:
            callback.end("KILLED")
            raise
        except Exception:
            callback.end("FAILED")
            raise
        finally:
            progress.close()
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
    keep_checkpoints: int = 2,
    tags: dict[str, str] | None = None,
) -> MLflowSettings:
    """The MLflow callback settings the tracking flags ask for (`tags`: the run's, beside the callback's own)."""
    from rllib_ragen.run.callbacks import MLflowSettings

    given = {"tracking_uri": args.tracking_uri, "experiment": args.experiment}
    return MLflowSettings(
        **{key: value for key, value in given.items() if value},
        run_name=run_name,
        stop_iters=args.stop_iters,
        checkpoint_dir=str(checkpoint_dir) if checkpoint_dir is not None else None,
        checkpoint_every=checkpoint_every,
        keep_checkpoints=keep_checkpoints,
        log_checkpoint_every=args.log_checkpoint_every,
        tags=dict(tags or {}),
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
    eval_success = evaluation.get("success_rate", math.nan)
    if not math.isnan(eval_success):  # NaN in an iteration that did not evaluate
        parts.append(f"eval success {eval_success:.3f}")
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


def main(*, env: str, argv: list[str] | None = None, prog: str | None = None, **settings: Any) -> None:
    """Entry point of a tuned example: a flag or config error ends it with one line and exit code 2.

    Args:
        env: The env (the `--env` default).
        argv: The flags (default: the command line's).
        prog: The program name `--help` shows.
        **settings: `TunedRun` fields replacing `tuned_run(env)`'s.
    """
    job_started = time.perf_counter()
    tuned = dataclasses.replace(tuned_run(env), **settings)
    parser = build_parser(env=env, prog=prog, **dataclasses.asdict(tuned))
    args = parser.parse_args(argv)
    if args.job_budget_min is None and args.time_budget_min is None:
        args.job_budget_min = tuned.job_budget_min
    if not args.verbose:
        quiet_progress_bars()  # before the libraries are imported: they read it then
    try:
        config = config_from_args(args)
        check_starting_model(args)
        checkpoint_to_resume(run_directory(config, args), resume=args.resume)
    except USER_ERRORS as error:
        parser.exit(2, f"error: {error}\n")
    # Imported first: they attach the console handlers that route_library_logs takes away.
    from rllib_ragen.run import callbacks, warm_start  # noqa: F401

    log_file = run_directory(config, args) / RUN_LOG
    route_library_logs(log_file, verbose=args.verbose)
    print(f"library logs: {log_file}" + ("" if args.verbose else " (--verbose: on the console too)"), flush=True)
    try:
        open_tracking_store(args)
    except USER_ERRORS as error:
        parser.exit(2, f"error: {error}\n")
    tags = choose_starting_model(config, args)
    try:
        run(config, args, tags={**tags, "preset": args.preset}, job_started=job_started)
    except KeyboardInterrupt:
        print("stopped by Ctrl-C; --resume continues from the last checkpoint", file=sys.stderr)
        sys.exit(130)


def open_tracking_store(args: argparse.Namespace) -> None:
    """Creates (or upgrades, or sets aside and rebuilds) the local MLflow store before Ray starts.

    Raises:
        TrackingStoreError: a store holding runs does not open (a ValueError: one `error:` line).
    """
    from rllib_ragen.run.mlflow_store import ensure_store
    from rllib_ragen.run.tracking import default_tracking_uri

    ensure_store(args.tracking_uri or default_tracking_uri())


def check_starting_model(args: argparse.Namespace) -> None:
    """Refuses contradicting warm-start flags and a `--warm-start-model` that is not a model directory."""
    from rllib_ragen.models import resolve_model

    if args.warm_start_model and args.no_warm_start:
        raise ValueError("--warm-start-model and --no-warm-start contradict each other; pass one")
    if args.warm_start_model:
        resolve_model(args.warm_start_model)


def choose_starting_model(config: StarPOConfig, args: argparse.Namespace) -> dict[str, str]:
    """The model RL starts from: a given warm-started one, none, or the (cached) format warm start.

    Returns:
        The run's model tags: `base_model` and `warm_start_model` ("none" without a warm start).
    """
    from rllib_ragen.models import resolve_model
    from rllib_ragen.run.warm_start import apply_warm_start

    check_starting_model(args)
    base = str(config.llm_model)
    if args.warm_start_model:
        config.llm(model=str(resolve_model(args.warm_start_model)))
    elif not args.no_warm_start:  # cached: a resumed run gets the same warm-started model back
        apply_warm_start(config, num_examples=args.warm_start_examples, player=args.warm_start_player)
    return {"base_model": base, "warm_start_model": "none" if args.no_warm_start else str(config.llm_model)}
