"""Evaluating a saved policy on one or more envs (the work behind `python -m rllib_ragen.run.evaluate`).

A policy is a StarPO checkpoint (evaluated with its run's rollout settings:
prompt format, turns, response length), a Hugging Face model directory or a
model name (evaluated with a preset's settings for each env). Each env gets
its own `LLMEnvRunner` and goes through `rllib_ragen.rollout.evaluation`, the code
training evaluates with.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ray.rllib.core import (
    COMPONENT_LEARNER,
    COMPONENT_LEARNER_GROUP,
    COMPONENT_RL_MODULE,
    DEFAULT_MODULE_ID,
)
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.utils.checkpoints import Checkpointable

from rllib_ragen.algorithm.presets import preset
from rllib_ragen.algorithm.starpo import StarPOConfig, save_policy
from rllib_ragen.inference.engine_config import resolve_kind
from rllib_ragen.models import resolve_model
from rllib_ragen.rollout.env_runner import LLMEnvRunner
from rllib_ragen.rollout.evaluation import (
    Evaluation,
    evaluate_on_seeds,
    evaluation_page,
)
from rllib_ragen.run.checkpoints import latest_checkpoint
from rllib_ragen.run.experiment import apply_setting
from rllib_ragen.run.ray_session import init_ray
from rllib_ragen.run.tracking import MLflowTracker

RLLIB_CHECKPOINT_FILE = "rllib_checkpoint.json"


@dataclasses.dataclass(frozen=True)
class Policy:
    """A policy ready to evaluate.

    Args:
        source: What the user named (checkpoint, directory or model name).
        model: Local Hugging Face directory of the policy.
        run_config: The StarPO config of the checkpoint's run; None for a model.
    """

    source: str
    model: Path
    run_config: StarPOConfig | None


def load_policy(source: str, *, scratch: Path) -> Policy:
    """The policy `source` names; a checkpoint's policy is exported into `scratch`.

    Raises:
        ValueError: `source` is a directory that is neither a model nor a checkpoint.
        rllib_ragen.models.ModelNotFoundError: an unknown model name or missing path.
    """
    path = Path(source).expanduser()
    if path.is_dir() and not (path / "config.json").is_file():
        checkpoint = (
            path
            if (path / RLLIB_CHECKPOINT_FILE).is_file()
            else latest_checkpoint(path)
        )
        if checkpoint is None:
            raise ValueError(
                f"{path} is neither a Hugging Face model directory (config.json), an RLlib checkpoint "
                f"({RLLIB_CHECKPOINT_FILE}) nor a directory of complete StarPO checkpoints (iter_NNNNNN)"
            )
        config = checkpoint_config(checkpoint)
        print(f"exporting the policy of checkpoint {checkpoint}", flush=True)
        return Policy(
            source,
            export_checkpoint_policy(checkpoint, config, scratch / "policy"),
            config,
        )
    return Policy(source, resolve_model(source, progress=True), None)


def checkpoint_config(checkpoint: Path) -> StarPOConfig:
    """The `StarPOConfig` a StarPO checkpoint was saved with."""
    with open(checkpoint / Checkpointable.CLASS_AND_CTOR_ARGS_FILE_NAME, "rb") as file:
        (config,), _ = pickle.load(file)["ctor_args_and_kwargs"]
    return (
        config if isinstance(config, StarPOConfig) else StarPOConfig.from_dict(config)
    )


def export_checkpoint_policy(
    checkpoint: Path, config: StarPOConfig, directory: Path
) -> Path:
    """Writes the policy of a StarPO checkpoint as a Hugging Face model directory."""
    module_dir = (
        checkpoint
        / COMPONENT_LEARNER_GROUP
        / COMPONENT_LEARNER
        / COMPONENT_RL_MODULE
        / DEFAULT_MODULE_ID
    )
    module = RLModule.from_checkpoint(module_dir)
    return save_policy(
        module.get_state(inference_only=True),
        base_model=config.llm_model,
        dtype=config.dtype,
        directory=directory,
        lora=config.lora_settings,
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
    if policy.run_config is None:
        config = preset(preset_name, env)
    else:
        config = policy.run_config.copy(copy_frozen=False).environment(env)
    config.llm(model=str(policy.model))
    config.env_runners(num_env_runners=0)
    for key, value in settings.items():
        setattr(config, key, value)
    for assignment in assignments:
        apply_setting(config, assignment)
    config.validate_starpo()
    return config


def evaluate_env(config: StarPOConfig, *, seeds: Sequence[int]) -> Evaluation:
    """One trajectory per seed on `config.env` at `config.eval_temperature`, on a runner of its own."""
    if resolve_kind(config.engine) == "vllm":
        init_ray()  # vLLM engines are Ray actors
    runner = LLMEnvRunner(config=config)
    try:
        return evaluate_on_seeds(
            runner.sample, seeds=seeds, temperature=config.eval_temperature
        )
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
    output_dir.mkdir(parents=True, exist_ok=True)
    evaluations: dict[str, Evaluation] = {}
    summary = {
        "policy": policy.source,
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
        seeds = range(config.eval_seed, config.eval_seed + config.eval_size)
        print(
            f"{env}: {len(seeds)} episodes (seeds {seeds[0]}..{seeds[-1]}, temperature "
            f"{config.eval_temperature}) ...",
            flush=True,
        )
        began = time.perf_counter()
        evaluations[env] = evaluation = evaluate_env(config, seeds=seeds)
        page = evaluation_page(
            config,
            evaluation.episodes,
            title=f"{policy.source} on {env}",
            limit=len(seeds),
            seeds=f"{seeds[0]}..{seeds[-1]}",
            policy=policy.source,
        )
        (output_dir / f"{env}.html").write_text(page)
        summary["envs"][env] = {
            "seeds": [seeds[0], seeds[-1]],
            "stats": evaluation.stats,
            "successes": evaluation.successes,
        }
        # After each env, so that the envs done so far survive a failure in the next one.
        (output_dir / "summary.json").write_text(
            json.dumps(summary, indent=1, default=float)
        )
        print(
            f"{env}: done in {time.perf_counter() - began:.0f} s; page {output_dir / f'{env}.html'}",
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
    tracker = MLflowTracker(
        tracking_uri=tracking_uri,
        experiment=experiment,
        run_name=f"evaluate {Path(policy.source).name}",
        tags={"policy": policy.source, "envs": ",".join(evaluations)},
    )
    tracker.log_params({"policy": policy.source, **settings})
    for env, evaluation in evaluations.items():
        tracker.log_metrics(
            {f"evaluation/{env}/{k}": v for k, v in evaluation.stats.items()}, step=0
        )
    tracker.log_artifacts(output_dir, "evaluation")
    tracker.end()
    return tracker.run_url
