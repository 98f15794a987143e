"""MLflow tracking of StarPO runs: params, per-iteration metrics, trajectories, models.

The default store is `sqlite:///<working dir>/mlflow.db` (MLflow's own default
location, made explicit); `--tracking-uri http://host:5000` points at a server.
Look at runs with `mlflow ui --backend-store-uri sqlite:///mlflow.db`.
"""

from __future__ import annotations

import html
import logging
import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from rllib_ragen.env_runner import RESPONSE_TEXT

logger = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "rllib-ragen"
_MAX_PARAM_LENGTH = 500


def default_tracking_uri() -> str:
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def flatten_metrics(result: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a nested RLlib result dict as {"a/b/c": value} (NaN/inf dropped)."""
    flat: dict[str, float] = {}
    for key, value in result.items():
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
    """The StarPO config's plain settings as MLflow params (long values shortened)."""
    params = {}
    for key, value in sorted(config.to_dict().items()):
        if isinstance(value, (str, int, float, bool, type(None), tuple, list)) and not key.startswith("_"):
            text = repr(value) if not isinstance(value, str) else value
            params[key] = text[:_MAX_PARAM_LENGTH]
    return params


class MLflowTracker:
    """One MLflow run per training run (resumable by run id).

    Args:
        tracking_uri: MLflow tracking URI; None = the local store in the working dir.
        experiment: Experiment name.
        run_name: Display name of the run.
        run_id: Continue this run (used when a crashed run resumes).
    """

    def __init__(
        self,
        *,
        tracking_uri: str | None = None,
        experiment: str = DEFAULT_EXPERIMENT,
        run_name: str | None = None,
        run_id: str | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri or default_tracking_uri()
        mlflow.set_tracking_uri(self.tracking_uri)
        self.client = MlflowClient(self.tracking_uri)
        if run_id is None:
            experiment_id = _experiment_id(self.client, experiment)
            run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        self.run_id = run_id

    @property
    def run_url(self) -> str:
        run = self.client.get_run(self.run_id)
        return f"{self.tracking_uri} experiment {run.info.experiment_id} run {self.run_id}"

    def log_params(self, params: Mapping[str, Any]) -> None:
        existing = self.client.get_run(self.run_id).data.params
        new = {k: str(v)[:_MAX_PARAM_LENGTH] for k, v in params.items() if k not in existing}
        for start in range(0, len(new), 100):
            batch = dict(list(new.items())[start : start + 100])
            self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in batch.items()])

    def log_metrics(self, metrics: Mapping[str, float], *, step: int) -> None:
        entities = [Metric(k, v, _now_ms(), step) for k, v in metrics.items()]
        for start in range(0, len(entities), 500):
            self.client.log_batch(self.run_id, metrics=entities[start : start + 500])

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_artifacts(self, local_dir: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, value)

    def end(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


def _experiment_id(client: MlflowClient, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    return experiment.experiment_id if experiment else client.create_experiment(name)


def _now_ms() -> int:
    return int(time.time() * 1000)


def trajectories_html(episodes: Iterable[Any], *, title: str, limit: int = 16) -> str:
    """A readable HTML page of trajectories: states, the model's answers, rewards.

    Args:
        episodes: Group episodes (`MultiAgentEpisode`) from `LLMEnvRunner.sample`.
        title: Page heading.
        limit: Most trajectories shown.
    """
    parts = [
        "<!doctype html><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:auto}"
        "pre{background:#f4f4f4;padding:.4em}.ok{color:green}.bad{color:#b00}"
        ".turn{border-left:3px solid #ccc;padding-left:.6em;margin:.6em 0}</style>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    shown = 0
    for group_index, episode in enumerate(episodes):
        for agent, trajectory in episode.agent_episodes.items():
            if shown >= limit:
                break
            shown += 1
            parts.append(_trajectory_html(group_index, agent, trajectory))
    return "\n".join(parts)


def _trajectory_html(group_index: int, agent: str, trajectory: Any) -> str:
    observations, infos, rewards = trajectory.get_observations(), trajectory.get_infos(), trajectory.get_rewards()
    success = bool(infos[-1].get("success", False))
    status = "<span class='ok'>success</span>" if success else "<span class='bad'>no success</span>"
    rows = [
        f"<h2>group {group_index} / {html.escape(agent)} (seed {infos[0].get('seed')}): "
        f"return {sum(rewards):.2f}, {status}</h2>",
        f"<b>initial state</b><pre>{html.escape(str(observations[0]))}</pre>",
    ]
    for t, reward in enumerate(rewards):
        info = infos[t + 1]
        rows.append(
            f"<div class='turn'><b>turn {t + 1}</b> &mdash; reward {reward:.2f}, "
            f"actions {html.escape(str(info.get('parsed_actions', [])))}"
            f"<pre>{html.escape(str(info.get(RESPONSE_TEXT, '')))}</pre>"
            f"<b>state after</b><pre>{html.escape(str(observations[t + 1]))}</pre></div>"
        )
    return "\n".join(rows)
