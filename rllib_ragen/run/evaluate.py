"""Evaluate a policy on fixed seeds, per env, with 95% intervals.

    python -m rllib_ragen.run.evaluate checkpoints/sokoban-starpo --env sokoban frozenlake --episodes 64
    python -m rllib_ragen.run.evaluate checkpoints/sokoban-starpo --generalisation
    python -m rllib_ragen.run.evaluate ~/.cache/rllib_ragen/models/warm-start-37c94fbeb5ad --env sokoban

POLICY is a StarPO checkpoint (`checkpoints/<env>-starpo/iter_NNNNNN`, or the
directory holding them: its newest complete one), evaluated with its run's
rollout settings; or a Hugging Face model directory (a run's `final_policy/`, a
warm start in ~/.cache/rllib_ragen/models) or a model name
(`python -m rllib_ragen.models list`), evaluated with --preset's settings.

Each env is played once per seed --seed-start .. --seed-start + --episodes - 1
at --temperature (defaults: the run's or preset's evaluation settings). Prints
one table row per env (success with its 95% Wilson interval, mean return,
share of turns with a valid action, mean turns, mean response tokens per
turn), writes a trajectory page per env and summary.json to --output-dir, and
with --mlflow logs them as one MLflow run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

# RAGEN's generalisation set: trained on Sokoban, evaluated on these.
GENERALISATION_ENVS = ("sokoban", "sokoban_new_vocab", "larger_sokoban", "frozenlake")
DEFAULT_EXPERIMENT = "rllib-ragen-evaluation"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rllib_ragen.run.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "policy", help="checkpoint, Hugging Face model directory or model name"
    )
    envs = parser.add_mutually_exclusive_group()
    envs.add_argument(
        "--env",
        nargs="+",
        metavar="ENV",
        help="envs to evaluate on (default: the checkpoint's env)",
    )
    envs.add_argument(
        "--generalisation",
        action="store_true",
        help=f"RAGEN's cross-env set: {', '.join(GENERALISATION_ENVS)}",
    )
    parser.add_argument(
        "--episodes",
        type=int,
        help="episodes (seeds) per env (default: the eval_size setting)",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        help="sampling temperature, 0 = greedy (default: eval_temperature)",
    )
    parser.add_argument(
        "--seed-start", type=int, help="first seed (default: the eval_seed setting)"
    )
    parser.add_argument(
        "--preset",
        choices=("cpu", "gpu"),
        default="cpu",
        help="rollout settings of a model directory or name (a checkpoint brings its own)",
    )
    parser.add_argument(
        "--engine",
        choices=("auto", "vllm", "hf"),
        help="rollout engine (default: the settings')",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set any StarPOConfig attribute, e.g. --set max_turns=5 (repeatable)",
    )
    add_output_flags(parser)
    return parser


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    """Where the results go: pages, summary and MLflow."""
    parser.add_argument(
        "--output-dir",
        type=Path,
        help="pages and summary.json (default: ./evaluations/<policy name>)",
    )
    parser.add_argument(
        "--mlflow",
        action="store_true",
        help="also log to MLflow (default store: ./mlflow.db)",
    )
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (implies --mlflow)")
    parser.add_argument(
        "--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment"
    )


def overrides(args: argparse.Namespace) -> dict:
    """The evaluation settings the flags set (config attribute -> value)."""
    if args.episodes is not None and args.episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {args.episodes}")
    if args.temperature is not None and args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    flags = {
        "eval_size": args.episodes,
        "eval_temperature": args.temperature,
        "eval_seed": args.seed_start,
        "engine": args.engine,
    }
    return {key: value for key, value in flags.items() if value is not None}


def chosen_envs(args: argparse.Namespace, run_env: str | None) -> list[str]:
    """The envs to evaluate on; of the generalisation set, those registered here."""
    from envs import list_envs

    if args.generalisation:
        missing = [env for env in GENERALISATION_ENVS if env not in list_envs()]
        if missing:
            print(
                f"note: {', '.join(missing)} not registered in this checkout; left out of the set",
                flush=True,
            )
        return [env for env in GENERALISATION_ENVS if env in list_envs()]
    if args.env:
        return list(args.env)
    if run_env is None:
        raise ValueError(
            "--env or --generalisation is needed for a model (only a checkpoint knows its env)"
        )
    return [run_env]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Imported after parsing, so that --help answers without loading Ray and torch.
    from rllib_ragen.rollout.evaluation import evaluation_table
    from rllib_ragen.run.policy_evaluation import (
        evaluate_policy,
        load_policy,
        log_to_mlflow,
    )

    try:
        settings = overrides(args)
        output_dir = (
            args.output_dir or Path("evaluations") / Path(args.policy).expanduser().name
        )
        with tempfile.TemporaryDirectory(prefix="evaluate-") as scratch:
            policy = load_policy(args.policy, scratch=Path(scratch))
            envs = chosen_envs(
                args, policy.run_config.env if policy.run_config else None
            )
            evaluations = evaluate_policy(
                policy,
                envs,
                preset_name=args.preset,
                settings=settings,
                assignments=args.set,
                output_dir=output_dir,
            )
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(
        f"\n{args.policy}\n{evaluation_table(evaluations)}\npages and summary.json: {output_dir}"
    )
    if args.mlflow or args.tracking_uri:
        url = log_to_mlflow(
            policy,
            evaluations,
            output_dir=output_dir,
            tracking_uri=args.tracking_uri,
            experiment=args.experiment,
            settings={**settings, "set": args.set},
        )
        print(f"MLflow run: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
