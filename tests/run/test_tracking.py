"""MLflow tracking against a real `mlflow server` on loopback: every plain run is
one MLflow run with its params, per-iteration metrics, trajectory pages,
checkpoints and final policy; a resumed run continues the same MLflow run."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from run_helpers import driver_args, mlflow_server, tiny_config

from rllib_ragen.models import load_causal_lm
from rllib_ragen.run.callbacks import MLflowSettings, with_mlflow
from rllib_ragen.run.checkpoints import latest_checkpoint, tracking_state
from rllib_ragen.run.tracking import MLflowTracker, find_run, flatten_metrics
from rllib_ragen.run.train_loop import run


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow_server")) as uri:
        yield uri


def test_flatten_metrics_keeps_finite_numeric_leaves_only():
    result = {
        "env_runners": {"success_rate": 0.25, "num_trajectories": 4, "done": True, "bad": float("nan")},
        "learners": {"default_policy": {"entropy": 1.5, "note": "text"}},
        "training_iteration": 3,
        "config": {"actor_lr": 1e-6},  # params, not metrics
        "timestamp": 1_700_000_000,
        "weird key(%)": 2.0,
    }
    assert flatten_metrics(result) == {
        "env_runners/success_rate": 0.25,
        "env_runners/num_trajectories": 4.0,
        "learners/default_policy/entropy": 1.5,
        "training_iteration": 3.0,
        "weird key___": 2.0,
    }


def test_default_store_is_mlflow_db_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert MLflowSettings().tracking_uri == f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_artifacts_of_a_sqlite_store_go_beside_its_database(tmp_path, monkeypatch):
    job_dir, store_dir = tmp_path / "job", tmp_path / "store"
    job_dir.mkdir(), store_dir.mkdir()
    monkeypatch.chdir(job_dir)  # MLflow's own default would be job_dir/mlruns
    tracker = MLflowTracker(tracking_uri=f"sqlite:///{store_dir / 'mlflow.db'}", experiment="e")
    tracker.log_text("hello", "page.html")
    tracker.end()
    assert list(job_dir.iterdir()) == []
    assert list((store_dir / "mlruns").rglob("page.html"))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(experiment=""), "experiment"),
        (dict(stop_iters=0), "stop_iters"),
        (dict(checkpoint_every=0), "checkpoint_every"),
        (dict(log_checkpoint_every=-1), "log_checkpoint_every"),
        (dict(trajectory_limit=0), "trajectory_limit"),
        (dict(tracking_uri=""), "tracking_uri"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MLflowSettings(**kwargs)


def test_with_mlflow_replaces_an_earlier_mlflow_callback(tiny_model_path):
    config = with_mlflow(tiny_config(tiny_model_path), MLflowSettings(tracking_uri="sqlite:///a.db"))
    config = with_mlflow(config, MLflowSettings(tracking_uri="sqlite:///b.db"))
    (callback,) = config.callbacks_class
    assert callback().settings.tracking_uri == "sqlite:///b.db"


def test_find_run_returns_the_newest_run_with_the_tag(tracking_uri):
    client = MlflowClient(tracking_uri)
    older = MLflowTracker(tracking_uri=tracking_uri, experiment="find-run", tags={"k": "a"}).run_id
    newer = MLflowTracker(tracking_uri=tracking_uri, experiment="find-run", tags={"k": "a"}).run_id
    MLflowTracker(tracking_uri=tracking_uri, experiment="find-run", tags={"k": "b"})
    assert older != newer
    assert find_run(client, "find-run", tag="k", value="a") == newer
    assert find_run(client, "find-run", tag="k", value="zzz") is None
    assert find_run(client, "no-such-experiment", tag="k", value="a") is None


def _metric_steps(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): _sha(p) for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_run_logs_params_metrics_pages_checkpoints_and_policy_then_resumes(
    tracking_uri, ray_session, tiny_model_path, tmp_path
):
    client = MlflowClient(tracking_uri)
    checkpoints = tmp_path / "ckpt"
    flags = (
        "--tracking-uri", tracking_uri, "--experiment", "plain-runs", "--checkpoint-dir", str(checkpoints),
        "--log-checkpoint-every", "2",
    )
    result = run(tiny_config(tiny_model_path), driver_args(*flags, stop_iters=2))

    run_id = tracking_state(latest_checkpoint(checkpoints))["run_id"]
    logged = client.get_run(run_id)
    assert logged.info.status == "FINISHED" and logged.info.run_name == "sokoban-starpo"
    params = logged.data.params
    assert (params["env"], params["n_groups"], params["group_size"], params["max_turns"]) == ("sokoban", "2", "2", "2")
    assert params["llm_model"] == str(tiny_model_path) and params["actor_lr"] == "0.001"
    assert params["adam_betas"] == "(0.9, 0.999)" and "callbacks" not in params
    # One value per iteration, the last equal to what training returned.
    success = _metric_steps(client, run_id, "env_runners/success_rate")
    assert sorted(success) == [1, 2] and success[2] == result["env_runners"]["success_rate"]
    entropy = _metric_steps(client, run_id, "learners/default_policy/entropy")
    assert entropy[2] == pytest.approx(result["learners"]["default_policy"]["entropy"])
    assert not any(key.startswith("config/") for key in logged.data.metrics)

    assert logged.data.tags["env"] == "sokoban" and logged.data.tags["base_model"] == str(tiny_model_path)
    assert logged.data.tags["git_commit"] != "unknown"

    # Step 0 is the evaluation before the first update; one evaluation metric, with its interval.
    evaluation = _metric_steps(client, run_id, "evaluation/success_rate")
    assert sorted(evaluation) == [0, 1, 2]
    low, high = (_metric_steps(client, run_id, f"evaluation/success_rate_{end}") for end in ("low", "high"))
    assert all(low[step] <= evaluation[step] <= high[step] for step in evaluation)
    assert not [key for key in logged.data.metrics if key.startswith("env_runners/eval_")]
    pages = sorted(a.path for a in client.list_artifacts(run_id, "trajectories"))
    assert pages == [f"trajectories/eval_iter_000{i}.html" for i in range(3)]
    page = Path(client.download_artifacts(run_id, pages[-1], str(tmp_path / "dl"))).read_text()
    # eval_size=2 instances (seeds 123, 124), 2 turns each.
    assert page.count("<details") == 2 and "(seed 123)" in page and "(seed 124)" in page
    assert page.count("<b>turn 2</b>") == 2 and "<b>initial state</b><div class='state'><svg class='board'" in page
    # The evaluations before and after RL, each on a page of its own with every trajectory; the failure counts
    # of each evaluation as metrics.
    assert [a.path for a in client.list_artifacts(run_id, "evaluation")] == [
        "evaluation/after_rl.html", "evaluation/before_rl.html"
    ]
    after = Path(client.download_artifacts(run_id, "evaluation/after_rl.html", str(tmp_path / "dl"))).read_text()
    assert after == page
    dead_box = _metric_steps(client, run_id, "evaluation/failures/dead_box")
    assert sorted(dead_box) == [0, 1, 2]
    kinds = [key for key in logged.data.metrics if key.startswith("evaluation/failures/")]
    assert sum(logged.data.metrics[key] for key in kinds) == 2 - 2 * evaluation[2]

    # The logged checkpoint is the local one of iteration 2, file for file.
    checkpoint = Path(client.download_artifacts(run_id, "checkpoints/iter_0002", str(tmp_path / "dl")))
    assert latest_checkpoint(checkpoints).name == "iter_000002"
    assert _tree_digest(checkpoint) == _tree_digest(latest_checkpoint(checkpoints))
    assert "learner_group" in {p.name for p in checkpoint.iterdir()}
    assert [a.path for a in client.list_artifacts(run_id, "checkpoints")] == ["checkpoints/iter_0002"]

    policy = Path(client.download_artifacts(run_id, "final_policy", str(tmp_path / "dl")))
    assert _sha(policy / "model.safetensors") == _sha(checkpoints / "final_policy" / "model.safetensors")
    trained, initial = load_causal_lm(policy).state_dict(), load_causal_lm(tiny_model_path).state_dict()
    assert trained.keys() == initial.keys()
    assert any(not torch.equal(trained[k], initial[k]) for k in trained), "final policy equals the untrained model"

    # A crash after iteration 2, then --resume: the same MLflow run goes on.
    with pytest.raises(ValueError, match="pass --resume"):
        run(tiny_config(tiny_model_path), driver_args(*flags, stop_iters=3))
    run(tiny_config(tiny_model_path), driver_args(*flags, "--resume", stop_iters=3))
    assert tracking_state(latest_checkpoint(checkpoints))["run_id"] == run_id
    resumed = client.get_run(run_id)
    assert resumed.info.status == "FINISHED"
    assert sorted(_metric_steps(client, run_id, "training_iteration").items()) == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert [a.path for a in client.list_artifacts(run_id, "checkpoints")] == [
        "checkpoints/iter_0002", "checkpoints/iter_0003"
    ]
    experiment_id = client.get_experiment_by_name("plain-runs").experiment_id
    assert len(client.search_runs([experiment_id])) == 1
