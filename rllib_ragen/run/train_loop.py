"""The train loop of a tuned example: build, resume or start, train within the budgets, checkpoint.

`run` trains until `--stop-iters` (or the iteration expected to cross a time budget),
logging to MLflow and checkpointing through the MLflow callback; Ctrl-C stops after the
running iteration, which is checkpointed. What it prints at the end is `rllib_ragen.run.report`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rllib_ragen.run.console import IterationProgress
from rllib_ragen.run.report import (
    BudgetSpent,
    check_success,
    evaluate_before_training,
    progress_line,
    report_learning,
)

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm import Algorithm

    from rllib_ragen.algorithm.starpo import StarPOConfig
    from rllib_ragen.run.callbacks import MLflowCallback, MLflowSettings


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
        resume=args.resume,
        tags=tags,
    )
    algo = with_mlflow(config, settings).build_algo()
    try:
        callback = mlflow_callback_of(algo)
        with run_ended_on_exit(callback):
            if resume_from is not None:
                callback.restore(algo, resume_from)
                print(f"resumed from {resume_from} at iteration {algo.iteration}")
            tracker = callback.start(algo)
            print(
                f"MLflow run: {tracker.run_url}\ncheckpoints: {checkpoint_dir} (newest {args.keep_checkpoints} kept)\n"
                f"{algo.config.rollout_summary}",
                flush=True,
            )
            result = _train_and_report(algo, callback, args, job_started=job_started)
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


def _train_and_report(
    algo: Algorithm, callback: MLflowCallback, args: argparse.Namespace, *, job_started: float
) -> dict[str, Any]:
    """Evaluates the starting policy (a fresh run), trains, and reports what was learnt; returns the last result."""
    evaluation_began = time.perf_counter()
    before = (
        evaluate_before_training(algo, callback)
        if algo.iteration == 0 and algo.config.starpo_eval.eval_interval
        else None
    )
    evaluation_s = time.perf_counter() - evaluation_began if before is not None else None
    began, budget = time.perf_counter(), BudgetSpent()
    budget_s = training_budget_s(args, job_started)
    result = _train(
        algo, callback, stop_iters=args.stop_iters, budget_s=budget_s, budget=budget, evaluation_s=evaluation_s
    )
    if before is not None and "success_rate" in result.get("evaluation", {}):
        report_learning(
            algo,
            before,
            result,
            minutes=(time.perf_counter() - began) / 60,
            budget=budget,
            job_minutes=(time.perf_counter() - job_started) / 60,
            path=args.summary_json,
        )
    return result


@contextlib.contextmanager
def run_ended_on_exit(callback: MLflowCallback) -> Iterator[None]:
    """Within: SIGTERM raises SystemExit(143); an exception leaving the block ends the callback's
    open MLflow run KILLED (Ctrl-C, SIGTERM) or FAILED (any other), as MLflow's own `start_run`
    does, so no run stays RUNNING once its process is gone (SIGKILL aside: the next start in the
    checkpoint directory settles that run, see `MLflowSettings.resume`)."""

    def on_sigterm(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if on_main_thread else None
    try:
        yield
    except BaseException as error:
        if callback.is_open():
            callback.end("KILLED" if isinstance(error, (KeyboardInterrupt, SystemExit)) else "FAILED")
        raise
    finally:
        if on_main_thread:  # None: a handler not set from Python, i.e. the default one
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def is_last_in_budget(elapsed_s: float, longest_s: float, evaluation_s: float | None, *, budget_s: float) -> bool:
    """Whether the next iteration must be the last: one more iteration, then a final one, would end past
    `budget_s`.

    The final iteration costs the longest iteration so far plus an evaluation: as long as the one before
    RL took (`evaluation_s`), or, without it, another longest iteration. Self-play evaluates hundreds of
    games, as long as several iterations, so an estimate without it would end the job minutes late.
    """
    final_s = longest_s + (longest_s if evaluation_s is None else evaluation_s)
    return elapsed_s + longest_s + final_s > budget_s


def training_budget_s(args: argparse.Namespace, job_started: float) -> float | None:
    """Seconds training may take from now: the tighter of `--time-budget-min` and what is left of
    `--job-budget-min` (None: no budget). Not above zero still trains one iteration, which evaluates."""
    budgets = [60.0 * args.time_budget_min] if args.time_budget_min is not None else []
    if args.job_budget_min is not None:
        budgets.append(60.0 * args.job_budget_min - (time.perf_counter() - job_started))
    return min(budgets, default=None)


def _train(
    algo: Algorithm,
    callback: MLflowCallback,
    *,
    stop_iters: int,
    budget_s: float | None,
    budget: BudgetSpent,
    evaluation_s: float | None = None,
) -> dict[str, Any]:
    """Iterates up to `stop_iters`, or until `budget_s` seconds would be passed (`is_last_in_budget`,
    with `evaluation_s` the evaluation before RL took, if it ran); the callback checkpoints and
    closes the run at the last iteration, which evaluates. Each iteration is added to `budget`.

    Ctrl-C stops after the running iteration: it is checkpointed, the run is
    closed KILLED and KeyboardInterrupt raised. A second Ctrl-C, or an error,
    inside an iteration raises without a checkpoint (`run_ended_on_exit` closes
    the run): the algorithm is then mid-iteration (training seeds drawn, maybe
    some updates applied), so the last checkpoint is the consistent state to resume.
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
                elapsed = time.perf_counter() - started
                if budget_s is not None and is_last_in_budget(elapsed, longest, evaluation_s, budget_s=budget_s):
                    stop_iters = algo.iteration + 1
                    algo.final_iteration = stop_iters
                    callback.settings = dataclasses.replace(callback.settings, stop_iters=stop_iters)
                began = time.perf_counter()
                result = algo.train()
                longest = max(longest, time.perf_counter() - began)
                progress.line(progress_line(algo.iteration, stop_iters, result, time.perf_counter() - began))
                budget.add(iteration=algo.iteration, minutes=(time.perf_counter() - started) / 60, result=result)
                progress.advance(total=stop_iters)
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
    resume: bool = False,
    tags: dict[str, str] | None = None,
) -> MLflowSettings:
    """The MLflow callback settings the tracking flags ask for (`tags`: the run's, beside the callback's own;
    `resume`: continue the unfinished run recorded in `checkpoint_dir`)."""
    from rllib_ragen.run.callbacks import MLflowSettings

    given = {"tracking_uri": args.tracking_uri, "experiment": args.experiment}
    return MLflowSettings(
        **{key: value for key, value in given.items() if value},
        run_name=run_name,
        stop_iters=args.stop_iters,
        checkpoint_dir=str(checkpoint_dir) if checkpoint_dir is not None else None,
        checkpoint_every=checkpoint_every,
        keep_checkpoints=keep_checkpoints,
        resume=resume,
        log_checkpoint_every=args.log_checkpoint_every,
        tags=dict(tags or {}),
    )
