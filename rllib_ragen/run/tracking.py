"""MLflow tracking of StarPO runs: params, per-iteration metrics, artifacts (trajectory pages, models).

The default store is `sqlite:///<working dir>/mlflow.db` (MLflow's own default
location, made explicit), created and migrated crash-safely by
`rllib_ragen.run.mlflow_store`; `--tracking-uri http://host:5000` points at a server.
Look at runs with `mlflow ui --backend-store-uri sqlite:///mlflow.db`.
"""

from __future__ import annotations

import json
import math
import shutil
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.file_utils import local_file_uri_to_path

from rllib_ragen.run.atomic_files import write_dir_atomic, write_text_atomic
from rllib_ragen.run.mlflow_store import artifact_location_for, tracking_client

DEFAULT_EXPERIMENT = "rllib-ragen"
TRIAL_TAG = "rllib_ragen.trial_dir"  # the algorithm's log dir name (Tune: the trial dir)
CHECKPOINT_DIR_TAG = "rllib_ragen.checkpoint_dir"  # the run's local checkpoint directory (absolute)
RUN_FILE = "mlflow_run.json"  # in the checkpoint directory: the run it logs to (`record_run`)
# Top-level entries of a Tune result that are not training metrics (the
# config goes in as params; the rest are process bookkeeping).
NOT_METRICS = frozenset({"config", "pid", "timestamp", "node_ip", "hostname", "date", "trial_id"})
_MAX_PARAM_LENGTH = 500
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 500


def default_tracking_uri() -> str:
    """The local store in the working directory: `sqlite:///<cwd>/mlflow.db`."""
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def flatten_metrics(result: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a nested RLlib result dict as {"a/b/c": value}.

    NaN/inf values and the top-level `NOT_METRICS` entries are left out.
    """
    flat: dict[str, float] = {}
    for key, value in result.items():
        if not prefix and key in NOT_METRICS:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_metrics(value, prefix=f"{name}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            flat[_metric_name(name)] = float(value)
    return flat


def _metric_name(name: str) -> str:
    # MLflow allows alphanumerics, _ - . space / only.
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in name)


def config_params(config: Any) -> dict[str, str]:
    """The StarPO config's plain settings as MLflow params (long values shortened).

    Plain = str/number/bool/None or lists/tuples of those; objects such as the
    callbacks are left out.
    """
    params = {}
    for key, value in sorted(config.to_dict().items()):
        if _is_plain(value) and not key.startswith("_"):
            text = repr(value) if not isinstance(value, str) else value
            params[key] = text[:_MAX_PARAM_LENGTH]
    return params


def _is_plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_is_plain(item) for item in value)
    return isinstance(value, (str, int, float, bool, type(None)))


class MLflowTracker:
    """One MLflow run per training run (resumable by run id).

    Args:
        tracking_uri: MLflow tracking URI; None = the local store in the working dir.
        experiment: Experiment name (created when missing).
        run_name: Display name of a new run.
        run_id: Continue this run instead of creating one.
        tags: Tags of a new run.
    """

    def __init__(
        self,
        *,
        tracking_uri: str | None = None,
        experiment: str = DEFAULT_EXPERIMENT,
        run_name: str | None = None,
        run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri or default_tracking_uri()
        self.client = tracking_client(self.tracking_uri)
        if run_id is None:
            experiment_id = experiment_id_of(self.client, experiment)
            run_id = self.client.create_run(experiment_id, run_name=run_name, tags=dict(tags or {})).info.run_id
        elif self.client.get_run(run_id).info.status != "RUNNING":
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    @property
    def run_url(self) -> str:
        run = self.client.get_run(self.run_id)
        return f"{self.tracking_uri} experiment {run.info.experiment_id} run {self.run_id}"

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Logs params not logged yet (a resumed run keeps its first values)."""
        existing = self.client.get_run(self.run_id).data.params
        new = [Param(k, str(v)[:_MAX_PARAM_LENGTH]) for k, v in params.items() if k not in existing]
        for start in range(0, len(new), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=new[start : start + _PARAMS_PER_BATCH])

    def log_metrics(self, metrics: Mapping[str, float], *, step: int) -> None:
        self.log_metric_entities(metric_entities(metrics, step=step))

    def log_metric_entities(self, metrics: Sequence[Metric]) -> None:
        """Logs metrics with their own steps and timestamps."""
        for start in range(0, len(metrics), _METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=list(metrics[start : start + _METRICS_PER_BATCH]))

    def unlogged(self, metrics: Sequence[Metric]) -> list[Metric]:
        """The metrics whose (key, step) the run has no value for yet."""
        logged = {
            key: {m.step for m in self.client.get_metric_history(self.run_id, key)} for key in {m.key for m in metrics}
        }
        return [m for m in metrics if m.step not in logged[m.key]]

    def log_text(self, text: str, artifact_file: str) -> None:
        """Logs `text` as a file (a local store writes it to a temporary name, then renames it)."""
        self.client.log_text(self.run_id, text, artifact_file)

    def log_artifacts(self, local_dir: str | Path, artifact_path: str) -> None:
        """Logs the directory `local_dir` as `artifact_path`, replacing an earlier one of that name.

        MLflow copies a directory into a local store file by file, so a kill
        mid-copy would leave part of it (e.g. of a policy) looking logged:
        here a local store gets it complete or not at all (`write_dir_atomic`).
        """
        local_artifacts = self._local_artifact_dir()
        if local_artifacts is None:
            self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)
            return
        write_dir_atomic(
            local_artifacts / artifact_path, lambda out: shutil.copytree(local_dir, out, dirs_exist_ok=True)
        )

    def _local_artifact_dir(self) -> Path | None:
        """The run's artifact directory when it is on this file system (else None: a server stores them)."""
        uri = self.client.get_run(self.run_id).info.artifact_uri
        return Path(local_file_uri_to_path(uri)) if urllib.parse.urlparse(uri).scheme in ("", "file") else None

    def status(self) -> str:
        """The run's status in the store: RUNNING, FINISHED, FAILED or KILLED."""
        return self.client.get_run(self.run_id).info.status

    def end(self, status: str = "FINISHED") -> None:
        """Marks the run FINISHED, FAILED or KILLED."""
        self.client.set_terminated(self.run_id, status=status)


def experiment_id_of(client: MlflowClient, name: str) -> str:
    """The id of experiment `name`, created when missing (artifacts beside a SQLite store)."""
    experiment = client.get_experiment_by_name(name)
    if experiment:
        return experiment.experiment_id
    return client.create_experiment(name, artifact_location=artifact_location_for(client.tracking_uri))


def find_run(client: MlflowClient, experiment: str, *, tag: str, value: str) -> str | None:
    """The id of the newest run of `experiment` tagged `tag=value`, or None."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs(
        [found.experiment_id],
        filter_string=f"tags.`{tag}` = '{value}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


def record_run(checkpoint_dir: str | Path, tracker: MLflowTracker) -> Path:
    """Writes `<checkpoint_dir>/mlflow_run.json` naming `tracker`'s run (whole or not at all), so that
    `--resume` finds the run of a process killed before its first checkpoint."""
    record = {"run_id": tracker.run_id, "tracking_uri": tracker.tracking_uri}
    return write_text_atomic(Path(checkpoint_dir) / RUN_FILE, json.dumps(record) + "\n")


def recorded_run(checkpoint_dir: str | Path, tracking_uri: str) -> str | None:
    """The run id `record_run` wrote in `checkpoint_dir` for the store `tracking_uri`; None without
    one (no run was opened there, or it was opened in another store)."""
    path = Path(checkpoint_dir) / RUN_FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record["run_id"] if record["tracking_uri"] == tracking_uri else None


def mark_orphans_killed(client: MlflowClient, experiment: str, *, checkpoint_dir: str, also: str | None) -> list[str]:
    """Marks KILLED the runs of `checkpoint_dir` still RUNNING: processes that died without closing
    them (SIGKILL, power loss). Called by a run that starts afresh in that directory.

    Args:
        client: The store's client.
        experiment: Where to look for runs tagged with `checkpoint_dir` (`CHECKPOINT_DIR_TAG`).
        checkpoint_dir: The checkpoint directory (absolute, as tagged).
        also: A run id recorded in the directory (it may be in another experiment).

    Returns:
        The ids of the runs marked KILLED.
    """
    found = client.get_experiment_by_name(experiment)
    # Filtered here, not in the query: a path may hold quotes that MLflow's filter syntax can't take.
    live = client.search_runs([found.experiment_id], "attributes.status = 'RUNNING'") if found else []
    running = {run.info.run_id for run in live if run.data.tags.get(CHECKPOINT_DIR_TAG) == checkpoint_dir}
    if also is not None and _status(client, also) == "RUNNING":
        running.add(also)
    for run_id in sorted(running):
        client.set_terminated(run_id, status="KILLED")
    return sorted(running)


def resumable_run(client: MlflowClient, run_id: str | None) -> str | None:
    """`run_id` when the store holds it unfinished (a killed, failed or still RUNNING run); else None."""
    return run_id if run_id is not None and _status(client, run_id) not in (None, "FINISHED") else None


def _status(client: MlflowClient, run_id: str) -> str | None:
    """The run's status, None when the store has no such run (or it was deleted)."""
    try:
        run = client.get_run(run_id)
    except MlflowException:
        return None
    return None if run.info.lifecycle_stage == "deleted" else run.info.status


def metric_entities(metrics: Mapping[str, float], *, step: int) -> list[Metric]:
    """{key: value} at `step` as MLflow metrics stamped now."""
    now = _now_ms()
    return [Metric(key, value, now, step) for key, value in metrics.items()]


def metrics_to_json(metrics: Iterable[Metric]) -> list[list[Any]]:
    """Metrics as JSON rows `[key, value, timestamp_ms, step]` (read back by `metrics_from_json`)."""
    return [[m.key, m.value, m.timestamp, m.step] for m in metrics]


def metrics_from_json(rows: Iterable[Sequence[Any]]) -> list[Metric]:
    """The metrics `metrics_to_json` wrote."""
    return [Metric(str(key), float(value), int(timestamp), int(step)) for key, value, timestamp, step in rows]


def _now_ms() -> int:
    return int(time.time() * 1000)
