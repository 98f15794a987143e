"""Running a `Study` through Ray Tune: one trial per arm x training seed x env, each an MLflow run
tagged with the study, arm, seed and env; a killed study resumes with Tune's own restore.

- The trials' configs are built and validated in the driver (`trial_configs`) before Tune starts;
  Tune gets one grid over the trial points, and each setting that differs between trials is
  looked up from the trial's point (`TrialValue`).
- Budget: a trial ends at the first iteration that both carried an evaluation on the fixed seeds
  and spent its budget (`trial_finished`). `StudyTrialCallback`, inside the trial, asks for an
  evaluation in the iteration expected to cross the budget and closes the MLflow run FINISHED
  there; `BudgetStopper`, in the driver, stops the trial on the same result.
- Resume: Tune keeps the finished trials; a trial that was running when the study was killed (or
  that failed) starts again from its beginning, and its unfinished MLflow run is deleted when it
  does, so each trial has exactly one run. Tune saves its record of the trials every 10 s or more
  (`TUNE_GLOBAL_CHECKPOINT_S`), so it may start again a trial that had finished just before the
  kill: MLflow, which the trial closed FINISHED itself, is the record `StudyTrial` reads first.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from ray import tune
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.utils import force_list
from ray.rllib.utils.annotations import override
from ray.tune.experiment import Trial
from ray.tune.result import DONE

from rllib_ragen.algorithm.starpo import StarPO
from rllib_ragen.run.callbacks import MLflowSettings, mlflow_callback_of, mlflow_settings_of, with_mlflow
from rllib_ragen.run.console import trial_failed_line
from rllib_ragen.run.mlflow_store import tracking_client
from rllib_ragen.run.placement_watchdog import DEFAULT_PLACEMENT_TIMEOUT_S, PlacementWatchdog
from rllib_ragen.run.study import ARM_TAG, SEED_TAG, STUDY_TAG, Study, TrialPoint, trial_points
from rllib_ragen.run.tracking import TRIAL_TAG, experiment_id_of, find_run
from rllib_ragen.run.trial_resources import StarPOTrial, check_trial_fits_cluster, trials_at_once

if TYPE_CHECKING:
    from rllib_ragen.algorithm.starpo import StarPOConfig

# The config entry (not a StarPO setting: RLlib keeps unknown entries as they are) that tells a trial its point.
TRIAL_ENTRY = "study_trial"
# The declaration a study's Tune folder was started with: a restore must be of the same study.
DECLARATION_FILE = "study_trials.json"
# The result entry of a trial that found its MLflow run FINISHED and did not train again (`StudyTrial`).
KEPT_RUN = "kept_mlflow_run"


def trial_finished(result: Mapping[str, Any], budget_s: float) -> bool:
    """Whether this iteration ends the trial: its budget is spent and it evaluated on the fixed seeds
    (an iteration that did not evaluate reports the evaluation entries as NaN)."""
    evaluated = not math.isnan(float(result.get("evaluation", {}).get("success_rate", math.nan)))
    return evaluated and float(result["time_total_s"]) >= budget_s


class StudyTrialCallback(RLlibCallback):
    """Inside a trial: tags its MLflow run, ends the trial's last iteration with an evaluation and
    closes the run FINISHED there (after `MLflowCallback`, which comes before it, logged the metrics)."""

    def on_algorithm_init(self, *, algorithm: Algorithm, **kwargs: Any) -> None:
        point = getattr(algorithm.config, TRIAL_ENTRY)
        mlflow = mlflow_callback_of(algorithm)
        settings = mlflow.settings
        # A trial starts from its beginning (Tune restarts it after a kill or an error, without a
        # checkpoint): a run an earlier attempt left unfinished would mix two attempts' metrics.
        client = tracking_client(settings.tracking_uri)
        for earlier in trial_runs(client, settings.experiment, point, env=str(algorithm.config.env)):
            client.delete_run(earlier.info.run_id)
        tags = {STUDY_TAG: point["study"], ARM_TAG: point["arm"], SEED_TAG: str(point["seed"])}
        mlflow.settings = dataclasses.replace(settings, tags={**settings.tags, **tags})

    def on_train_result(self, *, algorithm: Algorithm, result: dict, **kwargs: Any) -> None:
        budget_s = getattr(algorithm.config, TRIAL_ENTRY)["budget_s"]
        if trial_finished(result, budget_s):
            mlflow_callback_of(algorithm).end("FINISHED")
        elif result["time_total_s"] + result["time_this_iter_s"] >= budget_s:
            algorithm.final_iteration = algorithm.iteration + 1  # expected to cross the budget: it evaluates


def trial_runs(client: MlflowClient, experiment: str, point: Mapping[str, Any], *, env: str) -> list[Run]:
    """The active MLflow runs of one trial: tagged with its study, arm and training seed, and `env`
    (the config's env, as `MLflowCallback` tags it); newest first."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    tags = {STUDY_TAG: point["study"], ARM_TAG: point["arm"], SEED_TAG: str(point["seed"]), "env": env}
    query = " and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items())
    return client.search_runs([found.experiment_id], filter_string=query, order_by=["attributes.start_time DESC"])


def finished_trial_run(config: StarPOConfig) -> str | None:
    """The id of the trial's FINISHED MLflow run (`trial_runs`), or None: the trial has yet to train."""
    settings = mlflow_settings_of(config)
    runs = trial_runs(
        tracking_client(settings.tracking_uri), settings.experiment, getattr(config, TRIAL_ENTRY), env=str(config.env)
    )
    return next((run.info.run_id for run in runs if run.info.status == "FINISHED"), None)


class StudyTrial(StarPOTrial):
    """A study's trial: `StarPOTrial`, unless MLflow already holds the trial's FINISHED run (a study
    killed soon after that trial ended, before Tune saved its record of it). Then it neither builds
    nor trains anything, and its one result names the kept run and ends the trial."""

    @override(StarPO)
    def setup(self, config: StarPOConfig) -> None:
        self.kept_run = finished_trial_run(config)
        if self.kept_run is None:
            super().setup(config)

    @override(Algorithm)
    def step(self) -> dict:
        if self.kept_run is None:
            return super().step()
        return {DONE: True, KEPT_RUN: self.kept_run}

    @override(Algorithm)
    def log_result(self, result: dict) -> None:
        if self.kept_run is None:  # RLlib's logging needs what `setup` builds; a kept trial has nothing to log
            super().log_result(result)

    @override(StarPO)
    def cleanup(self) -> None:
        if self.kept_run is None:
            super().cleanup()


class BudgetStopper(tune.Stopper):
    """Stops a trial at the iteration `trial_finished` names (the budget spent and an evaluation made)."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s

    def __call__(self, trial_id: str, result: dict) -> bool:
        return trial_finished(result, self.budget_s)

    def stop_all(self) -> bool:
        return False


class TrialValue:
    """`tune.sample_from` of one setting: its value in the trial's own config."""

    def __init__(self, values: Sequence[Any]) -> None:
        self.values = list(values)

    def __call__(self, config: Mapping[str, Any]) -> Any:
        return self.values[config[TRIAL_ENTRY]["index"]]


class CloseFailedRuns(tune.Callback):
    """Marks the MLflow run of a trial that raised FAILED (the trial's next start deletes it).

    The study's own, not the sweep's `EndMLflowRuns`: a study's runs end FINISHED inside the trial."""

    def __init__(self, settings: MLflowSettings) -> None:
        self.settings = settings

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        client = tracking_client(self.settings.tracking_uri)
        run_id = find_run(client, self.settings.experiment, tag=TRIAL_TAG, value=Path(trial.path).name)
        if run_id is not None and client.get_run(run_id).info.status == "RUNNING":
            client.set_terminated(run_id, status="FAILED")


class StudyProgress(tune.Callback):
    """One line per trial iteration: the trial's arm, seed and env, its minutes and success."""

    def __init__(self, budget_min: float) -> None:
        self.budget_min = budget_min

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info: Any) -> None:
        if KEPT_RUN in result:
            print(f"{trial_name(trial)}: kept, its MLflow run {result[KEPT_RUN]} had finished", flush=True)
            return
        evaluation = result.get("evaluation", {}).get("success_rate", math.nan)
        print(
            f"{trial_name(trial)} [{result['training_iteration']}] {result['time_total_s'] / 60:.1f}/"
            f"{self.budget_min:g} min | success {result.get('env_runners', {}).get('success_rate', math.nan):.3f}"
            + ("" if math.isnan(evaluation) else f" | eval success {evaluation:.3f}"),
            flush=True,
        )

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        print(trial_failed_line(trial_name(trial), trial.error_file), file=sys.stderr, flush=True)


def trial_name(trial: Trial) -> str:
    """`<arm>_seed<seed>_<env>`: the trial's name in Tune's output."""
    return TrialPoint(**_point_fields(trial.config[TRIAL_ENTRY])).label


def trial_dirname(trial: Trial) -> str:
    """The trial's folder (and its MLflow run's name): its name and Tune's id, unique within the study."""
    return f"{trial_name(trial)}_{trial.trial_id}"


def _point_fields(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {field.name: entry[field.name] for field in dataclasses.fields(TrialPoint)}


def param_space(study: Study, configs: Sequence[StarPOConfig], settings: MLflowSettings) -> dict[str, Any]:
    """Tune's space: the first trial's config with the study's callbacks, one grid over the trial
    points, and each setting that differs between trials taken from the trial's own config."""
    budget_s = study.budget_min * 60.0
    points = [{**dataclasses.asdict(point), "budget_s": budget_s} for point in trial_points(study)]
    dicts = [config.to_dict() for config in configs]
    space = with_study_callbacks(configs[0], settings).to_dict()
    for key in dicts[0]:
        values = [d[key] for d in dicts]
        if any(value != values[0] for value in values[1:]):
            space[key] = tune.sample_from(TrialValue(values))
    space[TRIAL_ENTRY] = tune.grid_search(points)
    return space


def with_study_callbacks(config: StarPOConfig, settings: MLflowSettings) -> StarPOConfig:
    """The config logging to MLflow, with `StudyTrialCallback` after `MLflowCallback`."""
    tracked = with_mlflow(config.copy(copy_frozen=False), settings)
    return tracked.callbacks(callbacks_class=[*force_list(tracked.callbacks_class), StudyTrialCallback])


@dataclasses.dataclass(frozen=True)
class StudyRunSettings:
    """Where a study runs and how many trials at once.

    Args:
        storage_path: Tune's folder; the study's trials go in `<storage_path>/<study name>`, and
            running the study again there resumes it.
        max_concurrent: Trials at once; None: one per node of the Ray cluster (a trial on CPU
            computes on every core of its node), and never more than the cluster holds side by side
            with what each trial reserves (`trial_resources`): one at a time on a single machine.
    """

    storage_path: str
    max_concurrent: int | None = None

    def __post_init__(self) -> None:
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {self.max_concurrent}")


def run_study(
    study: Study, configs: Sequence[StarPOConfig], settings: MLflowSettings, run: StudyRunSettings
) -> tune.ResultGrid:
    """Runs (or resumes) the study's trials through Tune; returns Tune's results.

    `configs` are `trial_configs(study)`. Every trial logs to `settings`' store and experiment.

    Raises:
        ValueError: `run.storage_path` holds this study's folder from a different declaration.
        TrialDoesNotFitError: a trial reserves more than the running Ray cluster has.
    """
    placements = [check_trial_fits_cluster(config) for config in configs]  # before Tune: one line, not a hang
    # A trial on CPU computes on every core of its node whatever it reserves: one a node by default.
    fits = min(trials_at_once(placement, ray.cluster_resources()) for placement in placements)
    nodes = len([node for node in ray.nodes() if node["Alive"]])
    run = dataclasses.replace(run, max_concurrent=run.max_concurrent or min(nodes, fits))
    path = Path(run.storage_path) / study.name
    declaration = [dataclasses.asdict(point) for point in trial_points(study)]
    settings = dataclasses.replace(settings, stop_iters=None, run_id=None, run_name=None, checkpoint_dir=None)
    # Created here, once: trials starting together would race to create it.
    experiment_id_of(tracking_client(settings.tracking_uri), settings.experiment)
    if tune.Tuner.can_restore(str(path)):
        check_declaration(path, declaration)
        print(f"resuming study {study.name} from {path}: its finished trials are kept", flush=True)
        # The same space again: Tune stored its callables (the MLflow callback) as placeholders.
        space = param_space(study, configs, settings)
        tuner = tune.Tuner.restore(str(path), trainable=trial_trainable(), resume_errored=True, param_space=space)
    else:
        path.mkdir(parents=True, exist_ok=True)
        (path / DECLARATION_FILE).write_text(json.dumps(declaration, indent=1))
        tuner = new_tuner(study, configs, settings, run)
    return tuner.fit()


def new_tuner(
    study: Study, configs: Sequence[StarPOConfig], settings: MLflowSettings, run: StudyRunSettings
) -> tune.Tuner:
    return tune.Tuner(
        trial_trainable(),
        param_space=param_space(study, configs, settings),
        tune_config=tune.TuneConfig(
            max_concurrent_trials=run.max_concurrent,
            trial_name_creator=trial_name,
            trial_dirname_creator=trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=study.name,
            storage_path=run.storage_path,
            stop=BudgetStopper(study.budget_min * 60.0),
            callbacks=[
                CloseFailedRuns(settings),
                StudyProgress(study.budget_min),
                PlacementWatchdog(timeout_s=DEFAULT_PLACEMENT_TIMEOUT_S),
            ],
            # No Tune checkpoints (a SmolLM2 one is gigabytes): a trial cut short starts again.
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=0, checkpoint_at_end=False),
            verbose=0,
        ),
    )


def trial_trainable() -> type[StarPO]:
    """What Tune runs for each trial (the same for a new study and a restored one): StarPO whose
    placement group holds its engine actors too, and that keeps a trial MLflow holds FINISHED."""
    return StudyTrial


def check_declaration(path: Path, declaration: list[dict[str, Any]]) -> None:
    """Refuses to resume a study folder that was started with other trials."""
    stored = path / DECLARATION_FILE
    if not stored.is_file() or json.loads(stored.read_text()) != declaration:
        raise ValueError(
            f"{path} holds a Tune experiment of other trials than study {path.name}'s declaration has now; "
            "resume it with the declaration it started with, or give another --storage-path"
        )
