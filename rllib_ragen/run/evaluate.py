"""Evaluate a policy on fixed seeds, per env, with 95% intervals.

    rllib-ragen evaluate checkpoints/sokoban-starpo --env sokoban frozenlake --episodes 64
    rllib-ragen evaluate checkpoints/sokoban-starpo --generalisation
    rllib-ragen evaluate ~/.cache/rllib_ragen/models/warm-start-37c94fbeb5ad --env sokoban

POLICY is a StarPO checkpoint (`checkpoints/<env>-starpo/iter_NNNNNN`, or the
directory holding them: its newest complete one), evaluated with its run's
rollout settings; or a Hugging Face model directory (a run's `final_policy/`, a
warm start in ~/.cache/rllib_ragen/models) or a model name
(`rllib-ragen models list`), evaluated with --preset's settings.

Each env is played once per seed --seed-start .. --seed-start + --episodes - 1
at --temperature (defaults: the run's or preset's evaluation settings). Prints
one table row per env (success with its 95% Wilson interval, mean return,
share of turns with a valid action, mean turns, mean response tokens per
turn) and, per env, the failed trajectories by kind (fell into a hole, a box
stuck, a repeated no-op move, an invalid answer, out of turns, ...), writes a
trajectory page per env and summary.json to --output-dir, and with --mlflow logs
them as one MLflow run (the counts as `evaluation/<env>/failures/<kind>`).

Also `python -m rllib_ragen.run.evaluate POLICY ...`. The one place a saved policy is evaluated:
the flags, loading the policy (a checkpoint's with its run's settings), one
`LLMEnvRunner` per env through `rllib_ragen.rollout.evaluation` (the code
training evaluates with), the pages, summary.json and MLflow. Only light
modules are imported at the top (`--help` must not wait for Ray or torch); the
rest is imported where it is used.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.user_errors import CLIParser, front_door, input_checks
from rllib_ragen.run.given_paths import RLLIB_CHECKPOINT_FILE, check_tracking_uri, check_writable_dir

if TYPE_CHECKING:
    from rllib_ragen.algorithm.starpo import StarPOConfig
    from rllib_ragen.rollout.evaluation import Evaluation

# RAGEN's generalisation set: trained on Sokoban, evaluated on these.
GENERALISATION_ENVS = ("sokoban", "sokoban_new_vocab", "larger_sokoban", "frozenlake")
DEFAULT_EXPERIMENT = "rllib-ragen-evaluation"


def build_parser(prog: str = "python -m rllib_ragen.run.evaluate") -> argparse.ArgumentParser:
    """The flags of the evaluation command."""
    parser = CLIParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("policy", help="checkpoint, Hugging Face model directory or model name")
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
    parser.add_argument("--seed-start", type=int, help="first seed (default: the eval_seed setting)")
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
    parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment")


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
        raise ValueError("--env or --generalisation is needed for a model (only a checkpoint knows its env)")
    return [run_env]


@dataclasses.dataclass(frozen=True)
class Policy:
    """A policy ready to evaluate.

    Args:
        source: What the user named (checkpoint, directory or model name).
        model: Local Hugging Face directory of the policy (a checkpoint's: exported to a temporary directory).
        run_config: The StarPO config of the checkpoint's run; None for a model.
        label: What the pages call the policy: `source` and the model inside it, never the temporary copy.
    """

    source: str
    model: Path
    run_config: StarPOConfig | None
    label: str


def load_policy(source: str, *, scratch: Path) -> Policy:
    """The policy `source` names; a checkpoint's policy is exported into `scratch`.

    Raises:
        ValueError: `source` is a directory that is neither a model nor a checkpoint.
        rllib_ragen.models.ModelNotFoundError: an unknown model name or missing path.
    """
    from rllib_ragen.models import resolve_model
    from rllib_ragen.run.checkpoints import latest_checkpoint

    path = Path(source).expanduser().resolve()  # RLlib reads checkpoints by URI: relative paths have no scheme
    if path.is_dir() and not (path / "config.json").is_file():
        checkpoint = path if (path / RLLIB_CHECKPOINT_FILE).is_file() else latest_checkpoint(path)
        if checkpoint is None:
            raise ValueError(
                f"{path} is neither a Hugging Face model directory (config.json), an RLlib checkpoint "
                f"({RLLIB_CHECKPOINT_FILE}) nor a directory of complete StarPO checkpoints (iter_NNNNNN)"
            )
        config = checkpoint_config(checkpoint)
        print(f"exporting the policy of checkpoint {checkpoint}", flush=True)
        model = export_checkpoint_policy(checkpoint, config, scratch / "policy")
        inside = f"the policy of {checkpoint.name}" if checkpoint != path else "its policy"
        return Policy(source, model, config, f"{source}: {inside}, trained from {config.llm_module.model}")
    model = resolve_model(source, progress=True)
    return Policy(source, model, None, model_label(source, model))


def model_label(source: str, model: Path) -> str:
    """`source`, with the directory it resolved to (a model name) and the architecture its config.json names."""
    label = source if Path(source).expanduser().resolve() == model.resolve() else f"{source} ({model})"
    try:
        architectures = json.loads((model / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError):
        architectures = []
    return f"{label}: {', '.join(architectures)}" if architectures else label


def checkpoint_config(checkpoint: Path) -> StarPOConfig:
    """The `StarPOConfig` a StarPO checkpoint was saved with."""
    from ray.rllib.utils.checkpoints import Checkpointable

    from rllib_ragen.algorithm.starpo import StarPOConfig

    with open(checkpoint / Checkpointable.CLASS_AND_CTOR_ARGS_FILE_NAME, "rb") as file:
        (config,), _ = pickle.load(file)["ctor_args_and_kwargs"]
    return config if isinstance(config, StarPOConfig) else StarPOConfig.from_dict(config)


def export_checkpoint_policy(checkpoint: Path, config: StarPOConfig, directory: Path) -> Path:
    """Writes the policy of a StarPO checkpoint as a Hugging Face model directory."""
    from ray.rllib.core import (
        COMPONENT_LEARNER,
        COMPONENT_LEARNER_GROUP,
        COMPONENT_RL_MODULE,
        DEFAULT_MODULE_ID,
    )
    from ray.rllib.core.rl_module.rl_module import RLModule

    from rllib_ragen.algorithm.export import save_policy

    module_dir = checkpoint / COMPONENT_LEARNER_GROUP / COMPONENT_LEARNER / COMPONENT_RL_MODULE / DEFAULT_MODULE_ID
    module = RLModule.from_checkpoint(module_dir)
    return save_policy(
        module.get_state(inference_only=True),
        base_model=config.llm_module.model,
        dtype=config.llm_module.dtype,
        directory=directory,
        lora=config.lora,
    )


def env_config(
    policy: Policy,
    env: str,
    *,
    preset_name: str,
    settings: Mapping[str, Any],
    assignments: Sequence[str] = (),
) -> StarPOConfig:
    """The rollout settings of `policy` on `env`: its run's (a checkpoint) or the preset's,
    with `settings` (config attribute -> value) and `assignments` (`--set KEY=VALUE`)
    applied, on one local runner."""
    from rllib_ragen.algorithm.presets import preset
    from rllib_ragen.run.settings_flag import apply_settings

    if policy.run_config is None:
        config = preset(preset_name, env)
    else:
        config = policy.run_config.copy(copy_frozen=False).environment(env)
    config.llm(model=str(policy.model))
    config.env_runners(num_env_runners=0)
    config.update_from_dict(settings)
    apply_settings(config, assignments)
    config.validate_starpo()
    return config


def evaluate_env(config: StarPOConfig, *, seeds: Sequence[int]) -> Evaluation:
    """One trajectory per seed on `config.env` at its evaluation temperature, on a runner of its own."""
    from rllib_ragen.inference.engine_settings import resolve_kind
    from rllib_ragen.rollout.env_runner import LLMEnvRunner
    from rllib_ragen.rollout.evaluation import evaluate_on_seeds
    from rllib_ragen.run.ray_session import init_ray

    if resolve_kind(config.rollout_engine.kind) == "vllm":
        init_ray()  # vLLM engines are Ray actors
    runner = LLMEnvRunner(config=config)
    try:
        return evaluate_on_seeds(runner.sample, seeds=seeds, temperature=config.starpo_eval.eval_temperature)
    finally:
        runner.stop()


def evaluate_policy(
    policy: Policy,
    envs: Sequence[str],
    *,
    preset_name: str,
    settings: Mapping[str, Any],
    assignments: Sequence[str] = (),
    output_dir: Path,
) -> dict[str, Evaluation]:
    """Evaluates `policy` on each env; writes `<output_dir>/<env>.html` and `summary.json`."""
    from rllib_ragen.rollout.evaluation import failures_table
    from rllib_ragen.run.atomic_files import write_text_atomic
    from rllib_ragen.run.trajectory_page import evaluation_page

    output_dir.mkdir(parents=True, exist_ok=True)
    evaluations: dict[str, Evaluation] = {}
    summary: dict[str, Any] = {
        "policy": policy.source,
        "model": policy.label,
        "settings": {**settings, "set": list(assignments)},
        "envs": {},
    }
    for env in envs:
        config = env_config(
            policy,
            env,
            preset_name=preset_name,
            settings=settings,
            assignments=assignments,
        )
        seeds = config.starpo_eval.seeds
        print(
            f"{env}: {len(seeds)} episodes (seeds {seeds[0]}..{seeds[-1]}, "
            f"temperature {config.starpo_eval.eval_temperature}) ...",
            flush=True,
        )
        began = time.perf_counter()
        evaluations[env] = evaluation = evaluate_env(config, seeds=seeds)
        page = evaluation_page(
            config,
            evaluation.episodes,
            title=f"{policy.source} on {env}",
            limit=len(seeds),
            model=policy.label,
            seeds=f"{seeds[0]}..{seeds[-1]}",
        )
        write_text_atomic(output_dir / f"{env}.html", page)
        summary["envs"][env] = {
            "seeds": [seeds[0], seeds[-1]],
            "stats": evaluation.stats,
            "successes": evaluation.successes,
            "failures": evaluation.failures,
        }
        # After each env, so that the envs done so far survive a failure in the next one.
        write_text_atomic(output_dir / "summary.json", json.dumps(summary, indent=1, default=float))
        print(
            f"{env}: done in {time.perf_counter() - began:.0f} s; page {output_dir / f'{env}.html'}\n"
            f"{failures_table(evaluation)}",
            flush=True,
        )
    return evaluations


def log_to_mlflow(
    policy: Policy,
    evaluations: Mapping[str, Evaluation],
    *,
    output_dir: Path,
    tracking_uri: str | None,
    experiment: str,
    settings: Mapping[str, Any],
) -> str:
    """One MLflow run with the settings, `evaluation/<env>/<stat>` metrics and the pages; returns its URL."""
    from rllib_ragen.run.tracking import MLflowTracker

    tracker = MLflowTracker(
        tracking_uri=tracking_uri,
        experiment=experiment,
        run_name=f"evaluate {Path(policy.source).name}",
        tags={"policy": policy.source, "envs": ",".join(evaluations)},
    )
    tracker.log_params({"policy": policy.source, **settings})
    for env, evaluation in evaluations.items():
        tracker.log_metrics({f"evaluation/{env}/{k}": v for k, v in evaluation.stats.items()}, step=0)
    tracker.log_artifacts(output_dir, "evaluation")
    tracker.end()
    return tracker.run_url


@front_door
def main(argv: list[str] | None = None, *, prog: str = "python -m rllib_ragen.run.evaluate") -> int:
    """Entry point of `python -m rllib_ragen.run.evaluate` and `rllib-ragen evaluate`; returns the exit status.

    Bad input ends it with one `error:` line and exit code 2 (`front_door`), the flags and paths
    before Ray and torch are imported, the policy and the settings per env before any evaluation.
    """
    args = build_parser(prog).parse_args(argv)
    output_dir = args.output_dir or Path("evaluations") / Path(args.policy).expanduser().name
    check_writable_dir(output_dir, flag="--output-dir")
    if args.tracking_uri:
        check_tracking_uri(args.tracking_uri)
    with input_checks():
        settings = overrides(args)
    # Imported after the flags are checked, so that --help and a wrong flag answer without loading Ray and torch.
    from rllib_ragen.rollout.evaluation import evaluation_table
    from rllib_ragen.run.mlflow_store import ensure_store
    from rllib_ragen.run.tracking import default_tracking_uri

    if args.mlflow or args.tracking_uri:  # a broken store is reported now, not after the evaluation
        ensure_store(args.tracking_uri or default_tracking_uri())
    with tempfile.TemporaryDirectory(prefix="evaluate-") as scratch:
        with input_checks():
            policy = load_policy(args.policy, scratch=Path(scratch))
            envs = chosen_envs(args, policy.run_config.env if policy.run_config else None)
            for env in envs:  # every env's settings, before the first evaluation
                env_config(policy, env, preset_name=args.preset, settings=settings, assignments=args.set)
        evaluations = evaluate_policy(
            policy,
            envs,
            preset_name=args.preset,
            settings=settings,
            assignments=args.set,
            output_dir=output_dir,
        )
    print(f"\n{args.policy}\n{evaluation_table(evaluations)}\npages and summary.json: {output_dir}")
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
