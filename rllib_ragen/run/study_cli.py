"""`rllib-ragen study NAME`: runs a study through Ray Tune (or resumes it), then writes its figure and
table and prints its verdicts. NAME is a declared finding (`--list`) or a user's `module:ATTRIBUTE`.

    rllib-ragen study finding2-4-filter              # ./studies/finding2-4-filter/, ./mlflow.db
    rllib-ragen study my_studies:LR --budget-min 2   # a user's study, a short smoke run
    rllib-ragen study finding1-critic --report-only  # the figure and verdicts of the runs so far

Run it again after a kill: Tune restores the study from `--storage-path`, keeps its finished trials
and runs the rest.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from envs.user_errors import front_door, input_checks
from rllib_ragen.run.flags import (
    CLIParser,
    add_tracking_flags,
    add_verbose_flag,
    add_warm_start_flags,
    positive_float,
    positive_int,
)
from rllib_ragen.run.study import Study, trial_configs, trial_points

if TYPE_CHECKING:
    from rllib_ragen.algorithm.starpo import StarPOConfig
    from rllib_ragen.run.study_report import StudyReport

DEFAULT_STORAGE = "studies"


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = CLIParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", nargs="?", help="a declared study (see --list) or module:ATTRIBUTE")
    parser.add_argument("--list", action="store_true", help="list the declared studies and exit")
    parser.add_argument("--budget-min", type=positive_float, help="training minutes a trial (default: the study's)")
    parser.add_argument(
        "--envs",
        nargs="+",
        metavar="ENV",
        help="run only these of the study's envs (default: all it declares); like --budget-min, this makes a "
        "different experiment: give it its own --storage-path",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of every trial, as `train --set` (not one the arms vary)",
    )
    add_warm_start_flags(parser)
    parser.add_argument("--storage-path", default=DEFAULT_STORAGE, help="Tune's folder: <path>/<study name>")
    parser.add_argument(
        "--max-concurrent",
        type=positive_int,
        help="trials at once (default: one per Ray node, at most as many as fit)",
    )
    parser.add_argument("--report-only", action="store_true", help="no training: report the runs in MLflow")
    add_verbose_flag(
        parser,
        logs="the trials' output (RLlib, vLLM, Ray Tune) and the libraries' logs",
        to="Ray's session logs and <storage-path>/<study>.log",
    )
    add_tracking_flags(parser)
    return parser


@front_door
def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Entry point of `rllib-ragen study`; returns the exit status."""
    from rllib_ragen.run.findings import FINDINGS, find_study

    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.list:
        for name, declared in FINDINGS.items():
            print(f"{name:<24} {declared.num_trials:>2} trials  {declared.question}")
        return 0
    if not args.study:
        parser.error("name a study (or --list)")
    with input_checks():
        study = find_study(args.study)
        if args.budget_min:
            study = study.with_changes(budget_min=args.budget_min)
        if args.envs:
            study = study.with_changes(envs=tuple(only_envs(study, args.envs)))
        configs = trial_configs(study, overrides=args.set)
    print(f"study {study.name}: {study.question}\n{study.num_trials} trials of {study.budget_min:g} min", flush=True)
    failed = 0 if args.report_only else run(study, configs, args)
    with input_checks():  # no runs of the study in this store yet, or a duplicate
        report = _report(study, args)
    print(f"figure: {report.figure}\ntable: {report.table}\n" + "\n".join(report.verdicts))
    return 1 if failed else 0


def only_envs(study: Study, envs: Sequence[str]) -> list[str]:
    """`envs`, each one the study declares (in the order given, once each).

    Raises:
        ValueError: an env the study does not run.
    """
    unknown = [env for env in envs if env not in study.envs]
    if unknown:
        raise ValueError(f"--envs {' '.join(unknown)}: study {study.name!r} runs only {list(study.envs)}")
    return list(dict.fromkeys(envs))


def run(study: Study, configs: list[StarPOConfig], args: argparse.Namespace) -> int:
    """Warm starts (cached, one per env and arm), then the trials through Tune; returns how many failed."""
    from rllib_ragen.run.console import quiet_console
    from rllib_ragen.run.experiment import open_tracking_store
    from rllib_ragen.run.ray_session import init_ray
    from rllib_ragen.run.study_runner import StudyRunSettings, run_study
    from rllib_ragen.run.train_loop import mlflow_settings

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    open_tracking_store(args)  # once, here: trials starting together would race to create it
    quiet_console(Path(args.storage_path) / f"{study.name}.log", verbose=args.verbose)
    init_ray(log_to_driver=args.verbose)
    start_from_warm_starts(study, configs, args)
    # No iteration count: a trial ends when its budget is spent (`study_runner.trial_finished`).
    settings = mlflow_settings(argparse.Namespace(**vars(args), stop_iters=None), tags={"preset": study.preset})
    where = StudyRunSettings(str(Path(args.storage_path).resolve()), args.max_concurrent)
    results = run_study(study, configs, settings, where)
    if results.errors:
        print(f"{len(results.errors)} trial(s) failed; run the same command again to retry them", flush=True)
    return len(results.errors)


def start_from_warm_starts(study: Study, configs: list[StarPOConfig], args: argparse.Namespace) -> None:
    """Each trial starts from its env's and arm's warm start (the seeds of an arm share it)."""
    from rllib_ragen.run.starting_model import choose_starting_model

    models: dict[tuple[str, str], str] = {}
    for point, config in zip(trial_points(study), configs):
        key = (point.env, point.arm)
        if key not in models:
            arm_flags = study.arm_warm_starts.get(point.arm, {})
            choose_starting_model(config, argparse.Namespace(**{**vars(args), "warm_start_model": None, **arm_flags}))
            models[key] = str(config.llm_module.model)
        config.llm(model=models[key])


def _report(study: Study, args: argparse.Namespace) -> StudyReport:
    from rllib_ragen.run.mlflow_store import tracking_client
    from rllib_ragen.run.study_report import report_study
    from rllib_ragen.run.tracking import DEFAULT_EXPERIMENT, default_tracking_uri

    client = tracking_client(args.tracking_uri or default_tracking_uri())
    directory = Path(args.storage_path) / study.name
    return report_study(client, args.experiment or DEFAULT_EXPERIMENT, study, directory)
