"""Ray Tune sweeps of StarPO: a grid over config keys, FIFO or ASHA scheduling,
every trial an MLflow run (through `MLflowCallback`), a results table at the end.

RAGEN's knobs worth sweeping are the rollout frequency (optimiser passes per
rollout batch), the group size and the turn budget; any other `StarPOConfig`
attribute can be swept the same way (`--grid KEY=V1,V2`).

The command line: `rllib-ragen sweep --help` (or `python tuned_examples/sweep_starpo.py`).
By default it sweeps rollout frequency (1, 2), group size (4, 8) and the turn
budget (max_turns 3, 5) on the CPU preset: 8 trials, one MLflow run each
(./mlflow.db unless --tracking-uri), and prints a results table at the end.
--scheduler asha stops weak trials early.

Each trial reserves what it starts (`rllib_ragen.run.trial_resources`: the algorithm,
remote env runners, learners and every vLLM engine actor); a trial the cluster cannot
hold is refused before anything starts, and Tune runs as many side by side as fit
(at most --max-concurrent). An actor left waiting for resources past
--placement-timeout ends the sweep with an error naming it
(`rllib_ragen.run.placement_watchdog`). Ctrl-C stops the trials, prints the table
with them marked interrupted and exits with status 130.

    rllib-ragen sweep --env bandit --stop-iters 10 \\
        --grid rollout_frequency=1,2 --grid group_size=4,8 --scheduler asha
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import ray
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from envs import check_env
from envs.user_errors import CLIParser, front_door, input_checks
from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.rllib_private import config_dict_key, config_dict_value
from rllib_ragen.run.callbacks import MLflowSettings, with_mlflow
from rllib_ragen.run.console import quiet_console, trial_failed_line
from rllib_ragen.run.experiment import open_tracking_store
from rllib_ragen.run.flags import add_config_flags, add_tracking_flags, add_verbose_flag, config_from_args
from rllib_ragen.run.mlflow_store import tracking_client
from rllib_ragen.run.placement_watchdog import DEFAULT_PLACEMENT_TIMEOUT_S, PlacementWatchdog
from rllib_ragen.run.ray_session import init_ray
from rllib_ragen.run.report import progress_line
from rllib_ragen.run.settings_flag import setting_value, split_assignment
from rllib_ragen.run.starting_model import choose_starting_model
from rllib_ragen.run.tracking import TRIAL_TAG, experiment_id_of, find_run
from rllib_ragen.run.train_loop import mlflow_settings
from rllib_ragen.run.trial_resources import (
    StarPOTrial,
    TrialDoesNotFitError,
    check_trial_fits_cluster,
    describe_placement,
    trials_at_once,
)

SCHEDULERS = ("fifo", "asha")
DEFAULT_GRID: dict[str, list[Any]] = {"rollout_frequency": [1, 2], "group_size": [4, 8], "max_turns": [3, 5]}
DEFAULT_METRIC = "env_runners/success_rate"
STOPPED_EARLY_TAG = "rllib_ragen.stopped_by_scheduler"
INTERRUPTED_TAG = "rllib_ragen.interrupted"
# The exit status of a sweep stopped by Ctrl-C (SIGINT), as a shell reports a process it interrupted.
INTERRUPTED_EXIT_CODE = 130
# A trial's `status` in the results table.
FINISHED, STOPPED_EARLY, FAILED, INTERRUPTED = "finished", "stopped early", "error", "interrupted"
NOT_STARTED = "not started"
# Result columns of the table: (column, result key).
TABLE_METRICS = (
    ("success", "env_runners/success_rate"),
    ("eval_success", "evaluation/success_rate"),
    ("return", "env_runners/episode_return_mean"),
    ("in_group_std", "env_runners/in_group_reward_std"),
    ("iterations", "training_iteration"),
)


@dataclasses.dataclass(frozen=True)
class SweepSettings:
    """What a sweep tries and how trials are scheduled.

    Args:
        grid: Config attribute -> values; every combination is one trial.
        stop_iters: Training iterations of a trial that runs to the end.
        scheduler: "fifo" (all trials run to `stop_iters`) or "asha" (stops
            the worse half of trials at each rung, from `grace_period` on).
        metric: Result key the scheduler and the best-trial pick compare.
        mode: "max" or "min" of `metric`.
        max_concurrent: Most trials at once (fewer when the cluster holds fewer).
        grace_period: ASHA: iterations before a trial can be stopped.
        placement_timeout_s: Seconds an actor may wait for resources before the
            sweep ends with an error naming it.
        storage_path: Where Tune keeps trial results (default ~/ray_results).
        name: Tune experiment name (a folder in `storage_path`).
    """

    grid: Mapping[str, Sequence[Any]]
    stop_iters: int
    scheduler: str = "fifo"
    metric: str = DEFAULT_METRIC
    mode: str = "max"
    max_concurrent: int = 1
    grace_period: int = 1
    placement_timeout_s: float = DEFAULT_PLACEMENT_TIMEOUT_S
    storage_path: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if not self.grid:
            raise ValueError("the sweep grid is empty: give at least one KEY=V1,V2")
        for key, values in self.grid.items():
            if isinstance(values, (str, bytes)) or len(values) == 0:
                raise ValueError(f"grid values of {key!r} must be a non-empty list, got {values!r}")
        if self.stop_iters < 1:
            raise ValueError(f"stop_iters must be >= 1, got {self.stop_iters}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {self.scheduler!r}")
        if self.mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {self.mode!r}")
        if self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {self.max_concurrent}")
        if not 1 <= self.grace_period <= self.stop_iters:
            raise ValueError(f"grace_period must be in [1, stop_iters={self.stop_iters}], got {self.grace_period}")
        if self.placement_timeout_s <= 0:
            raise ValueError(f"placement_timeout_s must be > 0, got {self.placement_timeout_s}")

    @property
    def num_trials(self) -> int:
        return len(list(itertools.product(*self.grid.values())))


def parse_grid(config: StarPOConfig, assignments: Sequence[str]) -> dict[str, list[Any]]:
    """`["group_size=4,8", "actor_lr=1e-5,3e-5"]` -> {"group_size": [4, 8], ...}.

    Values are Python literals (else strings) of each setting's type; keys must be config attributes.
    """
    grid: dict[str, list[Any]] = {}
    for assignment in assignments:
        key, raw = split_assignment(config, assignment, flag="--grid")
        if key in grid:
            raise ValueError(f"--grid gives {key!r} twice; list all its values once: {key}=V1,V2")
        values = [setting_value(config, key, part.strip(), flag="--grid") for part in raw.split(",") if part.strip()]
        if not values:
            raise ValueError(f"--grid {assignment!r} has no values; expected {key}=V1,V2")
        grid[key] = values
    return grid


def grid_points(config: StarPOConfig, grid: Mapping[str, Sequence[Any]]) -> Iterator[tuple[dict, StarPOConfig]]:
    """(swept values, the trial's config) of every combination of the grid."""
    for combination in itertools.product(*grid.values()):
        point = dict(zip(grid, combination))
        yield point, config.copy(copy_frozen=False).update_from_dict(point)


def check_grid(config: StarPOConfig, grid: Mapping[str, Sequence[Any]]) -> None:
    """Validates every combination up front, so a bad value fails here, not in a trial
    (nor an env that the trials, in other processes, could not build)."""
    for combination in itertools.product(*grid.values()):
        point = dict(zip(grid, combination))
        try:
            trial_config = config.copy(copy_frozen=False).update_from_dict(point)  # a group checks its values here
            trial_config.validate_starpo()
            check_env(trial_config.env, in_other_processes=True)
        except ValueError as error:
            raise ValueError(f"grid point {point} is invalid: {error}") from error


def check_trials_fit(config: StarPOConfig, grid: Mapping[str, Sequence[Any]], *, max_concurrent: int) -> list[str]:
    """Refuses (`TrialDoesNotFitError`, one line) a grid point whose trial the running Ray
    cluster cannot hold; returns what each trial reserves and how many run at once, in words."""
    reservations: dict[str, int] = {}
    for point, trial_config in grid_points(config, grid):
        try:
            placement = check_trial_fits_cluster(trial_config)
        except TrialDoesNotFitError as error:
            raise TrialDoesNotFitError(f"grid point {point}: {error}") from None
        at_once = min(max_concurrent, trials_at_once(placement, ray.cluster_resources()))
        reservations[describe_placement(placement)] = at_once
    return [
        f"each trial reserves {reserved}; {at_once} run at a time (max_concurrent={max_concurrent})"
        for reserved, at_once in reservations.items()
    ]


def param_space(config: StarPOConfig, grid: Mapping[str, Sequence[Any]], settings: MLflowSettings) -> dict[str, Any]:
    """The config's dict (as Tune would take it from the config) with MLflow tracking and one
    `tune.grid_search` per swept key.

    The grid goes into the dict, not onto the config: a StarPO setting lives in its typed group, and
    `to_dict` writes each group's values under their names, so an attribute set on the config would be
    overwritten by the group's own value and every trial would run the same config.
    """
    space = with_mlflow(config.copy(copy_frozen=False), settings).to_dict()
    for key, values in grid.items():
        space[config_dict_key(space, key)] = tune.grid_search(list(values))
    return space


def make_scheduler(sweep: SweepSettings) -> TrialScheduler:
    if sweep.scheduler == "asha":
        return ASHAScheduler(
            time_attr="training_iteration", max_t=sweep.stop_iters, grace_period=sweep.grace_period, reduction_factor=2
        )
    return FIFOScheduler()


class EndMLflowRuns(tune.Callback):
    """Closes the MLflow run of a trial that ended before its last iteration
    (stopped by the scheduler: KILLED and tagged; errored: FAILED; still running or
    pending when the sweep ended, e.g. on Ctrl-C: KILLED and tagged interrupted).

    Runs that reached `stop_iters` were already closed FINISHED by `MLflowCallback`.
    """

    def __init__(self, settings: MLflowSettings, ledger: TrialLedger) -> None:
        self.settings = settings
        self.ledger = ledger

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._end(trial, "KILLED", tags={STOPPED_EARLY_TAG: "true"})

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._end(trial, "FAILED", tags={})

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        for trial in trials:
            if self.ledger.status(trial) == INTERRUPTED:
                self._end(trial, "KILLED", tags={INTERRUPTED_TAG: "true"})

    def _end(self, trial: Trial, status: str, *, tags: Mapping[str, str]) -> None:
        client = tracking_client(self.settings.tracking_uri)
        run_id = find_run(client, self.settings.experiment, tag=TRIAL_TAG, value=Path(trial.path).name)
        if run_id is None or client.get_run(run_id).info.status != "RUNNING":
            return
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
        client.set_terminated(run_id, status=status)


class TrialLedger(tune.Callback):
    """How each trial ended, and its config, which Tune's results lack for a trial that never
    reported. Tune calls `on_trial_complete` (or `on_trial_error`) for every trial that ends on
    its own or by the scheduler, never for one it stops because the sweep itself ends (Ctrl-C):
    such a trial is interrupted, whatever status Tune leaves it in."""

    def __init__(self, stop_iters: int) -> None:
        self.stop_iters = stop_iters
        self.trials: dict[str, Trial] = {}
        self._ended: dict[str, str] = {}

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        reached = (trial.last_result or {}).get("training_iteration", 0) >= self.stop_iters
        self._ended[trial.trial_id] = FINISHED if reached else STOPPED_EARLY

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._ended[trial.trial_id] = FAILED

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self.trials = {trial.path: trial for trial in trials}

    def status(self, trial: Trial) -> str:
        """`finished`, `stopped early` (by the scheduler), `error` or `interrupted`."""
        return self._ended.get(trial.trial_id, INTERRUPTED)


class TrialProgress(tune.Callback):
    """Prints one progress line per trial iteration (Tune's own output is off)."""

    def __init__(self, stop_iters: int) -> None:
        self.stop_iters = stop_iters

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info: Any) -> None:
        line = progress_line(result["training_iteration"], self.stop_iters, result, result.get("time_this_iter_s", 0.0))
        print(f"{trial.trial_id} {line}", flush=True)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        print(trial_failed_line(trial.trial_id, trial.error_file), file=sys.stderr, flush=True)


def run_sweep(
    config: StarPOConfig, sweep: SweepSettings, settings: MLflowSettings
) -> tuple[tune.ResultGrid, pd.DataFrame]:
    """Runs the sweep; returns Tune's results and the results table (best first).

    `settings` says where the trials log; each trial gets its own run (named
    after the trial, tagged with its trial id), ending at `sweep.stop_iters`.
    """
    check_grid(config, sweep.grid)
    for line in check_trials_fit(config, sweep.grid, max_concurrent=sweep.max_concurrent):
        print(line, flush=True)
    settings = dataclasses.replace(
        settings, stop_iters=sweep.stop_iters, run_id=None, run_name=None, checkpoint_dir=None
    )
    # Created here, once: trials starting together would race to create it.
    experiment_id_of(tracking_client(settings.tracking_uri), settings.experiment)
    ledger = TrialLedger(sweep.stop_iters)
    tuner = tune.Tuner(
        StarPOTrial,
        param_space=param_space(config, sweep.grid, settings),
        tune_config=tune.TuneConfig(
            metric=sweep.metric,
            mode=sweep.mode,
            scheduler=make_scheduler(sweep),
            max_concurrent_trials=sweep.max_concurrent,
        ),
        run_config=tune.RunConfig(
            name=sweep.name,
            storage_path=sweep.storage_path,
            stop={"training_iteration": sweep.stop_iters},
            callbacks=[
                ledger,
                EndMLflowRuns(settings, ledger),
                TrialProgress(sweep.stop_iters),
                PlacementWatchdog(timeout_s=sweep.placement_timeout_s),
            ],
            verbose=0,
        ),
    )
    results = tuner.fit()
    return results, results_table(results, ledger, sweep, settings)


def results_table(
    results: tune.ResultGrid, ledger: TrialLedger, sweep: SweepSettings, settings: MLflowSettings
) -> pd.DataFrame:
    """One row per grid point: swept values, status, final metrics, MLflow run id; best `sweep.metric`
    first. A grid point Tune never started a trial for (the sweep was interrupted first) is `not started`."""
    client = tracking_client(settings.tracking_uri)
    rows = []
    for result in results:
        trial = ledger.trials[result.path]
        metrics = result.metrics or {}
        row: dict[str, Any] = {"trial": trial.trial_id}
        row.update({key: config_dict_value(trial.config, key) for key in sweep.grid})
        row["status"] = ledger.status(trial)
        row.update({column: _nested(metrics, key) for column, key in TABLE_METRICS})
        row["error"] = type(result.error).__name__ if result.error else ""
        row["mlflow_run_id"] = find_run(client, settings.experiment, tag=TRIAL_TAG, value=Path(result.path).name)
        row["_sort"] = _nested(metrics, sweep.metric)
        rows.append(row)
    started = [tuple(row[key] for key in sweep.grid) for row in rows]
    for values in itertools.product(*sweep.grid.values()):
        if values not in started:
            rows.append({"trial": "", **dict(zip(sweep.grid, values)), "status": NOT_STARTED, "_sort": None})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table = table.sort_values("_sort", ascending=(sweep.mode == "min"), na_position="last", kind="stable")
    return table.drop(columns="_sort").reset_index(drop=True)


def _nested(metrics: Mapping[str, Any], key: str) -> Any:
    """`metrics["a"]["b"]` for key "a/b" (Tune results are nested dicts), or None."""
    value: Any = metrics
    for part in key.split("/"):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The flags of a sweep: the tuned examples' config and tracking flags, the grid and the scheduling."""
    parser = CLIParser(
        prog=prog, description="A Ray Tune sweep of StarPO.", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add_config_flags(parser, env="sokoban", stop_iters=20)
    add_tracking_flags(parser)
    default_grid = " ".join(f"{k}={','.join(map(str, v))}" for k, v in DEFAULT_GRID.items())
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help=f"sweep a config key over values (repeatable; default: {default_grid})",
    )
    parser.add_argument("--scheduler", choices=SCHEDULERS, default="fifo", help="asha stops weak trials early")
    parser.add_argument("--metric", default=DEFAULT_METRIC, help="result key to compare trials by")
    parser.add_argument("--mode", choices=("max", "min"), default="max", help="maximise or minimise --metric")
    parser.add_argument("--grace-period", type=int, default=1, help="ASHA: iterations before a trial may be stopped")
    parser.add_argument(
        "--max-concurrent", type=int, default=1, help="most trials at once (fewer if the cluster holds fewer)"
    )
    parser.add_argument(
        "--placement-timeout",
        type=float,
        default=SweepSettings.placement_timeout_s,
        help="seconds an actor may wait for resources before the sweep fails, naming it",
    )
    parser.add_argument("--storage-path", help="where Tune keeps trial results (default: ~/ray_results)")
    parser.add_argument("--name", help="Tune experiment name")
    add_verbose_flag(
        parser,
        logs="the trials' output (RLlib, vLLM, Ray Tune) and the libraries' logs",
        to="Ray's session logs and sweep.log in --storage-path (or here)",
    )
    return parser


@front_door
def main(argv: list[str] | None = None, *, prog: str | None = None) -> pd.DataFrame:
    """Entry point of `rllib-ragen sweep` (and `tuned_examples/sweep_starpo.py`); returns the results table.

    Exits with status 2 when a trial cannot fit the cluster (before the warm start or any
    trial), and with 130 after printing the table when Ctrl-C interrupted the sweep.
    """
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    with input_checks():
        config = config_from_args(args)
        sweep = sweep_settings(args, parse_grid(config, args.grid) if args.grid else dict(DEFAULT_GRID))
        check_grid(config, sweep.grid)  # before Ray starts (run_sweep checks it again)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    open_tracking_store(args)  # once, here: trials starting together would race to create it
    quiet_console(Path(args.storage_path or ".").expanduser() / "sweep.log", verbose=args.verbose)
    init_ray(log_to_driver=args.verbose)
    check_trials_fit(config, sweep.grid, max_concurrent=sweep.max_concurrent)  # a TrialDoesNotFitError: one line
    try:
        tags = choose_starting_model(config, args)  # once, in the driver: every trial loads the same cached model
        settings = mlflow_settings(args, tags={**tags, "preset": args.preset})
        print(
            f"sweeping {sweep.num_trials} trials of {config.env} over {sweep.grid}; MLflow: {settings.tracking_uri} "
            f"experiment {settings.experiment}"
        )
        _, table = run_sweep(config, sweep, settings)
    except KeyboardInterrupt:
        print("\nsweep interrupted before its trials ran", file=sys.stderr, flush=True)
        raise SystemExit(INTERRUPTED_EXIT_CODE) from None
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print("\nresults (best first):\n" + table.to_string(index=False), flush=True)
    unfinished = int(table["status"].isin([INTERRUPTED, NOT_STARTED]).sum()) if not table.empty else 0
    if unfinished:
        print(f"sweep interrupted: {unfinished} of {len(table)} trials did not finish", file=sys.stderr, flush=True)
        raise SystemExit(INTERRUPTED_EXIT_CODE)
    return table


def sweep_settings(args: argparse.Namespace, grid: dict[str, list[Any]]) -> SweepSettings:
    """The `SweepSettings` of the parsed flags."""
    return SweepSettings(
        grid=grid,
        stop_iters=args.stop_iters,
        scheduler=args.scheduler,
        metric=args.metric,
        mode=args.mode,
        max_concurrent=args.max_concurrent,
        grace_period=args.grace_period,
        placement_timeout_s=args.placement_timeout,
        storage_path=str(Path(args.storage_path).resolve()) if args.storage_path else None,
        name=args.name,
    )
