"""`MLflowCallback`: logs a StarPO run to MLflow from inside the Algorithm.

Plain runs (`rllib_ragen.run.experiment`) and Ray Tune trials (`rllib_ragen.run.sweep`)
share this one path, so every run looks the same in MLflow:

- params: every plain `StarPOConfig` setting (logged once, at algorithm init);
- metrics: every numeric leaf of each iteration's result, step = iteration;
- `trajectories/eval_iter_NNNN.html`: one page per evaluation (settings,
  failures by kind, summary table, then states drawn, thoughts, actions,
  rewards; see `rllib_ragen.run.trajectory_page`), and the pages of the
  evaluations before RL (step 0) and after it (the last iteration) again, with
  every trajectory, as `evaluation/before_rl.html` and `evaluation/after_rl.html`;
- `checkpoints/iter_NNNN`: only when asked (`log_checkpoint_every` > 0): an
  RLlib checkpoint every that many iterations and at the last one (each is
  gigabytes for a 135M model: local checkpoints are the ones to resume from);
- `final_policy`: the trained policy as a Hugging Face model directory, once.

Exactly one value per metric and step, even across crashes: with a local
`checkpoint_dir`, an iteration's metrics are held back until a checkpoint
covering that iteration is complete on disk, saved inside it, and only then
logged. A run killed at any point has logged nothing past its last complete
checkpoint, so the iterations it redoes after `--resume` are new to MLflow;
metrics of the checkpoint itself that a kill kept from MLflow are logged by
`restore` (only the (key, step) pairs MLflow lacks). MLflow thus lags by at
most `checkpoint_every` iterations. Without a `checkpoint_dir` (Tune trials)
metrics are logged at once.

The run ends FINISHED after iteration `stop_iters`; a driver that stops
earlier calls `MLflowCallback.end` itself (the sweep's Tune callback does so
for trials a scheduler stops).

One MLflow run per training run, even across kills: with a `checkpoint_dir`,
the run is tagged with it (`CHECKPOINT_DIR_TAG`) and its id is written beside
the checkpoints as soon as the run is opened (`record_run`). A resumed run
(`resume=True`) continues the checkpoint's run, or without a checkpoint yet
the recorded one; a run started afresh there marks the runs a killed process
left RUNNING as KILLED.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.utils import force_list
from ray.rllib.utils.metrics import EVALUATION_RESULTS

from rllib_ragen.run.atomic_files import write_dir_atomic
from rllib_ragen.run.checkpoints import save_checkpoint, tracking_state
from rllib_ragen.run.mlflow_store import tracking_client
from rllib_ragen.run.ray_session import PROJECT_ROOT
from rllib_ragen.run.tracking import (
    CHECKPOINT_DIR_TAG,
    DEFAULT_EXPERIMENT,
    TRIAL_TAG,
    MLflowTracker,
    config_params,
    default_tracking_uri,
    find_run,
    flatten_metrics,
    mark_orphans_killed,
    metric_entities,
    metrics_from_json,
    metrics_to_json,
    record_run,
    recorded_run,
    resumable_run,
)
from rllib_ragen.run.trajectory_page import evaluation_page

FINAL_POLICY = "final_policy"
# Artifact paths of the pages of the evaluations before RL (step 0) and after it (the last iteration).
BEFORE_RL_PAGE = "evaluation/before_rl.html"
AFTER_RL_PAGE = "evaluation/after_rl.html"
# Its INFO records (the stages of an iteration) go to the run's log file, not the console.
logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class MLflowSettings:
    """Where and what `MLflowCallback` logs.

    Args:
        tracking_uri: MLflow tracking URI; the default, the local store
            `sqlite:///<cwd>/mlflow.db`, is resolved when the settings are made
            (in the driver: Tune trials run in other working directories).
        experiment: Experiment name.
        run_name: Name of a new run (default: the Tune trial directory name).
        run_id: Continue this run (`MLflowCallback.restore` sets it from the checkpoint).
        resume: Without `run_id`, continue the unfinished run recorded in
            `checkpoint_dir` (one killed before its first checkpoint); False
            opens a new run and marks the runs of `checkpoint_dir` still
            RUNNING, whose processes are gone, KILLED.
        stop_iters: Last iteration: final checkpoint, final policy, run FINISHED.
        checkpoint_dir: Keep local checkpoints here (`<dir>/iter_NNNNNN`, see
            `rllib_ragen.run.checkpoints`, and the final policy in
            `<dir>/final_policy`); None keeps nothing locally.
        checkpoint_every: Save a local checkpoint every N iterations (and at
            the last one); metrics reach MLflow with the checkpoint.
        keep_checkpoints: Local checkpoints kept: the newest N complete ones
            (older ones are removed after each save).
        log_checkpoint_every: Also log a checkpoint to MLflow every N
            iterations and at the last one (0: never).
        trajectory_limit: Most trajectories shown in full on a periodic trajectory page (the pages
            before and after RL show all).
        tags: Tags of a new run, beside (or replacing) the callback's own:
            `env`, `base_model` (default: the model RL starts from) and
            `git_commit` (of this checkout, `-dirty` with local changes).
    """

    tracking_uri: str = dataclasses.field(default_factory=default_tracking_uri)
    experiment: str = DEFAULT_EXPERIMENT
    run_name: str | None = None
    run_id: str | None = None
    resume: bool = False
    stop_iters: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 1
    keep_checkpoints: int = 2
    log_checkpoint_every: int = 0
    trajectory_limit: int = 16
    tags: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.tracking_uri:
            raise ValueError("tracking_uri must not be empty (leave it out for ./mlflow.db)")
        if not self.experiment:
            raise ValueError("experiment must be a non-empty MLflow experiment name")
        if self.stop_iters is not None and self.stop_iters < 1:
            raise ValueError(f"stop_iters must be >= 1 (or None), got {self.stop_iters}")
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1 (the newest is always kept), got {self.keep_checkpoints}")
        if self.log_checkpoint_every < 0:
            raise ValueError(f"log_checkpoint_every must be >= 0 (0 = never), got {self.log_checkpoint_every}")
        if self.trajectory_limit < 1:
            raise ValueError(f"trajectory_limit must be >= 1, got {self.trajectory_limit}")


class MLflowCallback(RLlibCallback):
    """RLlib callback logging params, metrics, trajectories, checkpoints and the policy."""

    def __init__(self, settings: MLflowSettings | None = None) -> None:
        super().__init__()
        self.settings = settings or MLflowSettings()
        self.tracker: MLflowTracker | None = None
        # Metrics of the iterations since the last local checkpoint (see the module doc).
        self._pending: list[Metric] = []

    def start(self, algorithm: Algorithm) -> MLflowTracker:
        """Opens the run (once) and logs the config; later calls return it.

        Lazy, so restoring a checkpoint only to evaluate it opens no run.
        """
        if self.tracker is None:
            self.tracker = _open_run(self.settings, algorithm)
            self.tracker.log_params(config_params(algorithm.config))
        return self.tracker

    def restore(self, algorithm: Algorithm, checkpoint: str | Path) -> None:
        """Restores `algorithm` from a complete local checkpoint into the MLflow
        run that checkpoint belongs to, and logs the checkpoint's metrics that
        MLflow lacks (a kill between saving it and logging them)."""
        state = tracking_state(Path(checkpoint))
        if self.tracker is not None and self.tracker.run_id != state["run_id"]:
            raise ValueError(
                f"{checkpoint} belongs to MLflow run {state['run_id']}, but this algorithm already "
                f"logs to run {self.tracker.run_id}: restore before training or logging"
            )
        self.settings = dataclasses.replace(self.settings, run_id=state["run_id"])
        algorithm.restore_from_path(str(checkpoint))
        tracker = self.start(algorithm)
        tracker.log_metric_entities(tracker.unlogged(metrics_from_json(state["metrics"])))

    def on_train_result(self, *, algorithm: Algorithm, result: dict, **kwargs: Any) -> None:
        step = int(result["training_iteration"])
        self._record(algorithm, flatten_metrics(result), step)
        self._log_evaluation_trajectories(algorithm, step)
        last = step == self.settings.stop_iters
        if last or step % self.settings.checkpoint_every == 0 or self.settings.checkpoint_dir is None:
            self.checkpoint(algorithm)
        if last:
            self.finish(algorithm)

    def log_initial_evaluation(self, algorithm: Algorithm, stats: dict[str, float]) -> None:
        """Records an evaluation made before the first update as step 0, beside the per-iteration ones."""
        self._record(algorithm, flatten_metrics({EVALUATION_RESULTS: stats}), 0)
        self._log_evaluation_trajectories(algorithm, 0)

    def checkpoint(self, algorithm: Algorithm) -> Path | None:
        """Call between iterations only: saves the local checkpoint of the
        current iteration, then logs the metrics it covers; logs the checkpoint
        to MLflow too when `log_checkpoint_every` asks (every N iterations and the last).

        Returns:
            The local checkpoint, or None without a `checkpoint_dir`.
        """
        settings, step = self.settings, algorithm.iteration
        tracker = self.start(algorithm)
        logger.info("iteration %d: checkpointing into %s", step, settings.checkpoint_dir or "MLflow only")
        log = settings.log_checkpoint_every > 0 and (
            step == settings.stop_iters or step % settings.log_checkpoint_every == 0
        )
        if settings.checkpoint_dir is None:
            if log:
                with tempfile.TemporaryDirectory(prefix="starpo_ckpt_") as scratch:
                    algorithm.save_to_path(scratch)
                    tracker.log_artifacts(scratch, f"checkpoints/iter_{step:04d}")
            return None
        tracking = {"run_id": tracker.run_id, "metrics": metrics_to_json(self._pending)}
        saved = save_checkpoint(algorithm, settings.checkpoint_dir, tracking=tracking, keep=settings.keep_checkpoints)
        tracker.log_metric_entities(self._pending)
        self._pending = []
        if log:
            tracker.log_artifacts(saved, f"checkpoints/iter_{step:04d}")
        return saved

    def finish(self, algorithm: Algorithm) -> None:
        """Logs the final policy and marks the run FINISHED (after the last checkpoint)."""
        logger.info("iteration %d: exporting the final policy", algorithm.iteration)
        self._log_final_policy(algorithm)
        self.end("FINISHED")

    def end(self, status: str) -> None:
        """Marks the run FINISHED, FAILED or KILLED.

        Metrics of iterations after the last checkpoint are dropped, never
        logged: a resumed run redoes those iterations and logs them then.
        """
        self._pending = []
        self._tracker().end(status)

    def is_open(self) -> bool:
        """Whether the run was opened and has not ended (its status is RUNNING)."""
        return self.tracker is not None and self.tracker.status() == "RUNNING"

    def _record(self, algorithm: Algorithm, metrics: dict[str, float], step: int) -> None:
        entities = metric_entities(metrics, step=step)
        tracker = self.start(algorithm)
        if self.settings.checkpoint_dir is None:
            tracker.log_metric_entities(entities)
        else:
            self._pending.extend(entities)

    def _log_evaluation_trajectories(self, algorithm: Algorithm, step: int) -> None:
        # Logged at once: a redone iteration overwrites its page, so each step keeps one.
        episodes = algorithm.pop_evaluation_episodes()
        if episodes:
            logger.info("iteration %d: logging the trajectory page", step)
            config = algorithm.config
            # The evaluations before RL (step 0) and after it (the last iteration) show every trajectory.
            stage = {0: BEFORE_RL_PAGE, self.settings.stop_iters: AFTER_RL_PAGE}.get(step)
            page = evaluation_page(
                config,
                episodes,
                title=f"{config.env} evaluation at iteration {step}",
                limit=len(episodes) if stage else self.settings.trajectory_limit,
                iteration=step,
                seeds=f"{config.starpo_eval.seeds[0]}..{config.starpo_eval.seeds[-1]}",
            )
            self._tracker().log_text(page, f"trajectories/eval_iter_{step:04d}.html")
            if stage:
                self._tracker().log_text(page, stage)

    def _tracker(self) -> MLflowTracker:
        if self.tracker is None:
            raise RuntimeError("MLflowCallback has no run yet: call start(algorithm) or train once")
        return self.tracker

    def _log_final_policy(self, algorithm: Algorithm) -> None:
        if self.settings.checkpoint_dir is not None:
            # Complete or absent: `--warm-start-model` and `evaluate` take it as a model directory.
            policy_dir = write_dir_atomic(Path(self.settings.checkpoint_dir) / FINAL_POLICY, algorithm.export_policy)
            self._tracker().log_artifacts(policy_dir, FINAL_POLICY)
            return
        with tempfile.TemporaryDirectory(prefix="starpo_policy_") as scratch:
            self._tracker().log_artifacts(algorithm.export_policy(scratch), FINAL_POLICY)


def _open_run(settings: MLflowSettings, algorithm: Algorithm) -> MLflowTracker:
    """The run to log into: `settings.run_id`, the run of the checkpoint directory or of this
    trial directory (a Tune trial restarted after a failure), or a new one.

    The trial key is the algorithm's log directory name: Tune's trial directory name
    inside Tune (RLlib drops Tune's trial id when it turns the config dict into
    an `AlgorithmConfig`), a fresh unique name otherwise.
    """
    trial_key = Path(algorithm.logdir).name
    tags = {
        "env": str(algorithm.config.env),
        "base_model": str(algorithm.config.llm_module.model),
        "git_commit": git_commit(),
        **settings.tags,
        TRIAL_TAG: trial_key,
    }
    client = tracking_client(settings.tracking_uri)
    if settings.checkpoint_dir is not None:
        return _open_checkpoint_dir_run(settings, client, run_name=settings.run_name or trial_key, tags=tags)
    run_id = settings.run_id or find_run(client, settings.experiment, tag=TRIAL_TAG, value=trial_key)
    return MLflowTracker(
        tracking_uri=settings.tracking_uri,
        experiment=settings.experiment,
        run_name=settings.run_name or trial_key,
        run_id=run_id,
        tags=tags,
    )


def _open_checkpoint_dir_run(
    settings: MLflowSettings, client: MlflowClient, *, run_name: str, tags: Mapping[str, str]
) -> MLflowTracker:
    """The run of `settings.checkpoint_dir` (see `MLflowSettings.resume`), its id written there at once."""
    checkpoint_dir = str(Path(str(settings.checkpoint_dir)).resolve())
    recorded = recorded_run(checkpoint_dir, settings.tracking_uri)
    run_id = settings.run_id or (resumable_run(client, recorded) if settings.resume else None)
    if run_id is None:
        killed = mark_orphans_killed(client, settings.experiment, checkpoint_dir=checkpoint_dir, also=recorded)
        if killed:
            logger.warning(
                "marked KILLED the MLflow runs of %s a killed process left RUNNING: %s", checkpoint_dir, killed
            )
    tracker = MLflowTracker(
        tracking_uri=settings.tracking_uri,
        experiment=settings.experiment,
        run_name=run_name,
        run_id=run_id,
        tags={**tags, CHECKPOINT_DIR_TAG: checkpoint_dir},
    )
    record_run(checkpoint_dir, tracker)
    return tracker


def git_commit() -> str:
    """This checkout's commit, `<sha>-dirty` with uncommitted changes; "unknown" outside git."""
    try:
        described = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "describe", "--always", "--dirty", "--abbrev=40"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return described.stdout.strip() or "unknown"


def with_mlflow(config: AlgorithmConfig, settings: MLflowSettings) -> AlgorithmConfig:
    """Adds `MLflowCallback(settings)` to the config's callbacks (replacing an earlier one)."""
    kept = [
        c
        for c in force_list(config.callbacks_class)
        if c is not RLlibCallback and getattr(c, "func", None) is not MLflowCallback
    ]
    return config.callbacks(callbacks_class=[*kept, functools.partial(MLflowCallback, settings)])


def mlflow_settings_of(config: AlgorithmConfig) -> MLflowSettings:
    """The settings `with_mlflow` gave the config's `MLflowCallback` (before the algorithm builds it)."""
    for callback in force_list(config.callbacks_class):
        if getattr(callback, "func", None) is MLflowCallback:
            return callback.args[0]
    raise ValueError("this config has no MLflowCallback; build it with with_mlflow(config, settings)")


def mlflow_callback_of(algo: Algorithm) -> MLflowCallback:
    """The algorithm's `MLflowCallback` instance."""
    for callback in force_list(algo.callbacks):
        if isinstance(callback, MLflowCallback):
            return callback
    raise ValueError("this algorithm has no MLflowCallback; build its config with with_mlflow(config, settings)")
