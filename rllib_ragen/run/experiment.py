"""The driver behind every tuned example and `rllib-ragen train`: flags -> config -> starting
model -> train loop -> report. Each step is a module of its own: `rllib_ragen.run.flags` (the
parser and the config it builds; `--set` in `rllib_ragen.run.settings_flag`),
`rllib_ragen.run.starting_model`, `rllib_ragen.run.train_loop` and `rllib_ragen.run.report`.

`TUNED_RUNS` holds each env's defaults (description, success threshold,
iterations, job budget): `python tuned_examples/sokoban_starpo.py` and
`rllib-ragen train --env sokoban` are the same run.

Only light modules are imported at the top (`--help` must not wait for Ray or
torch); the rest is imported where it is used. Bad input (flags, settings, paths, models,
the tracking server) ends the job with one line, `error: ...`, and exit code 2, before Ray
starts (`envs.user_errors.front_door`); the checks that need no Ray or torch come first.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from envs.user_errors import UserError, front_door, input_checks
from rllib_ragen.run.console import quiet_console, quiet_progress_bars
from rllib_ragen.run.flags import build_parser, config_from_args
from rllib_ragen.run.given_paths import check_resumable, check_tracking_uri, check_writable_dir

if TYPE_CHECKING:
    from rllib_ragen.algorithm.starpo import StarPOConfig

RUN_LOG = "run.log"


@dataclasses.dataclass(frozen=True)
class TunedRun:
    """What a run of one env does without flags (each is also a flag but `description`).

    Args:
        description: The first line of `--help`.
        success_threshold: Success rate `--as-test` requires, set from measured runs; None where
            none was measured (`--as-test` then needs `--success-threshold`).
        stop_iters: Training iterations.
        job_budget_min: The whole job's time budget in minutes, or None for none.
    """

    description: str
    success_threshold: float | None = None
    stop_iters: int = 20
    job_budget_min: float | None = None


# The whole job (warm start, evaluations, training) of the grid envs within 30 minutes on any 2 cores: a CPU
# without bf16 units spends longer on the warm start and evaluations, and training gets what is left.
TUNED_RUNS: dict[str, TunedRun] = {
    "bandit": TunedRun(
        "Train an LLM agent to prefer the better arm of a two-armed bandit with StarPO.",
        # Between the interval of the warm start alone and that after 20 iterations (docs/results/bandit.md).
        success_threshold=0.55,
        stop_iters=20,
    ),
    "countdown": TunedRun("Train an LLM agent on Countdown equations with StarPO.", stop_iters=20),
    "frozenlake": TunedRun(
        "Train an LLM agent on FrozenLake (deterministic ice, the state in words) with StarPO.",
        # Between the warm start alone and a run that learned (docs/results/tuned_example_runs.md): a run
        # that did not learn fails.
        success_threshold=0.75,
        stop_iters=200,
        job_budget_min=27.0,
    ),
    "sokoban": TunedRun(
        "Train an LLM agent to solve Sokoban rooms (6x6, one box, in words) with StarPO.",
        # Between the warm start alone and a run that learned (docs/results/tuned_example_runs.md): a run
        # that did not learn fails.
        success_threshold=0.37,
        stop_iters=200,
        job_budget_min=27.0,
    ),
}


def tuned_run(env: str) -> TunedRun:
    """`TUNED_RUNS[env]`, or plain defaults for any other env (e.g. one of your own)."""
    return TUNED_RUNS.get(env, TunedRun(f"Train an LLM agent on {env} with StarPO."))


@front_door
def main(
    *,
    env: str,
    argv: list[str] | None = None,
    prog: str | None = None,
    config: Callable[[], StarPOConfig] | None = None,
    warm_start_choices: Mapping[str, Any] | None = None,
    **settings: Any,
) -> None:
    """Entry point of a tuned example: bad input ends it with one `error:` line and exit code 2 (`front_door`).

    Args:
        env: The env (the `--env` default).
        argv: The flags (default: the command line's).
        prog: The program name `--help` shows.
        config: Builds the example's config (called after the flags that need no Ray or torch are
            checked); None: the CPU preset of the env. `--preset gpu` or another `--env` use their preset.
        warm_start_choices: The example's warm-start choices (`WarmStartSettings` fields); the warm-start
            flags override them.
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
    run_config = checked_inputs(args, tuned=config)
    notice = slow_bf16_notice(args.job_budget_min)
    if notice:
        print(notice, flush=True)
    # Imported first: they attach the console handlers that route_library_logs takes away.
    from rllib_ragen.run import callbacks, warm_start  # noqa: F401
    from rllib_ragen.run.starting_model import choose_starting_model
    from rllib_ragen.run.train_loop import run, run_directory

    quiet_console(run_directory(run_config, args) / RUN_LOG, verbose=args.verbose)
    open_tracking_store(args)
    tags = choose_starting_model(run_config, args, tuned_warm_start=warm_start_choices)
    try:
        run(run_config, args, tags={**tags, "preset": args.preset}, job_started=job_started)
    except KeyboardInterrupt:
        print("stopped by Ctrl-C; --resume continues from the last checkpoint", file=sys.stderr)
        sys.exit(130)


def slow_bf16_notice(job_budget_min: float | None) -> str | None:
    """One line for a job budget on a CPU without fast bfloat16, or None.

    The tuned budgets were measured on CPUs with AVX-512 BF16 or AMX. Elsewhere the engines and the update
    compute in float32, several times slower (FrozenLake's warm start: about 2 minutes there, 12 on an
    AVX2-only EPYC): without a word, the job would just end having learned little.
    """
    import torch

    from rllib_ragen import hardware

    if job_budget_min is None or torch.cuda.is_available() or hardware.fast_bf16():
        return None
    return (
        f"note: this CPU, {hardware.cpu_model()}, has no AMX or AVX-512 BF16, so training computes in float32; the "
        f"{job_budget_min:g}-minute job budget was tuned on CPUs that have them, and here the warm start alone may "
        "take half of it (docs/results/tuned_example_runs.md). --job-budget-min gives the job longer."
    )


def checked_inputs(args: argparse.Namespace, *, tuned: Callable[[], StarPOConfig] | None = None) -> StarPOConfig:
    """The run's config, after every check of the flags that needs no work: those that need no Ray
    or torch first (contradicting flags, paths, the tracking server, the env), then the settings,
    the model directories and the checkpoint `--resume` would continue.

    Raises:
        UserError: naming the flag, setting or path at fault.
    """
    from rllib_ragen.run.starting_model import check_starting_model
    from rllib_ragen.run.train_loop import checkpoint_to_resume, run_directory

    if args.as_test and args.success_threshold is None:
        raise UserError(f"--as-test needs --success-threshold: no run of {args.env} has been measured to set one")
    if args.checkpoint_dir:
        check_writable_dir(args.checkpoint_dir, flag="--checkpoint-dir")
    if args.tracking_uri:  # the default, ./mlflow.db, is where the run writes anyway
        check_tracking_uri(args.tracking_uri)
    with input_checks():
        check_starting_model(args)
        config = config_from_args(args, tuned=tuned)
        config.check_inputs()
        from rllib_ragen.algorithm.validation import check_seeds_apart  # loads Ray, as the config did

        check_seeds_apart(config, iterations=args.stop_iters)
        resume_from = checkpoint_to_resume(run_directory(config, args), resume=args.resume)
    if resume_from is not None:
        check_resumable(resume_from)
    return config


def open_tracking_store(args: argparse.Namespace) -> None:
    """Creates (or upgrades, or sets aside and rebuilds) the local MLflow store before Ray starts.

    Raises:
        UserError: the store's directory cannot be written, or its server does not answer.
        TrackingStoreError: a store holding runs does not open (a UserError: one `error:` line).
    """
    from rllib_ragen.run.mlflow_store import ensure_store
    from rllib_ragen.run.tracking import default_tracking_uri

    uri = args.tracking_uri or default_tracking_uri()
    check_tracking_uri(uri)
    ensure_store(uri)
