"""Ray Jobs: a tuned example submitted to a real local head node (`ray start
--head`) with the documented runtime env runs to success and logs to MLflow."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from ray.job_submission import JobStatus, JobSubmissionClient
from run_helpers import ROOT, auth_headers, ray_head

RUNTIME_ENV = ROOT / "docs" / "runtime_env.yaml"
TERMINAL = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}


def wait_for_job(client: JobSubmissionClient, job_id: str, *, timeout_s: float) -> JobStatus:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = client.get_job_status(job_id)
        if status in TERMINAL:
            return status
        time.sleep(1)
    client.stop_job(job_id)
    raise TimeoutError(f"job {job_id} still {status} after {timeout_s} s:\n{client.get_job_logs(job_id)[-3000:]}")


def test_documented_runtime_env_ships_the_checkout():
    runtime_env = yaml.safe_load(RUNTIME_ENV.read_text())
    assert runtime_env["working_dir"] == "."
    assert {"checkpoints", "mlflow.db", ".git"} <= set(runtime_env["excludes"])
    assert "ray job submit --working-dir" in (ROOT / "docs" / "ray_jobs.md").read_text()


@pytest.mark.slow
def test_tuned_example_runs_as_a_ray_job_on_a_local_head_node(tmp_path):
    runtime_env = yaml.safe_load(RUNTIME_ENV.read_text())
    runtime_env["working_dir"] = str(ROOT)  # the YAML's "." is the submitter's working directory
    runtime_env["env_vars"].update(HF_HUB_OFFLINE="1", RLLIB_RAGEN_CACHE=str(tmp_path / "cache"))
    store = tmp_path / "mlflow.db"
    entrypoint = (
        "python tuned_examples/bandit_starpo.py --model tiny-random --engine hf --no-warm-start --stop-iters 1 "
        "--n-groups 2 --group-size 2 --set response_length=8 --set mini_batch_size=4 --set micro_batch_size=2 "
        f"--tracking-uri sqlite:///{store} --experiment ray-job --checkpoint-dir {tmp_path / 'ckpt'}"
    )
    with ray_head(tmp_path / "head") as (url, token):
        client = JobSubmissionClient(url, headers=auth_headers(token))
        job_id = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
        status = wait_for_job(client, job_id, timeout_s=150)
        logs = client.get_job_logs(job_id)
    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    assert "[1/1] | success" in logs and "done. MLflow run" in logs

    mlflow = MlflowClient(f"sqlite:///{store}")
    (run,) = mlflow.search_runs([mlflow.get_experiment_by_name("ray-job").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["env"] == "bandit"
    assert Path(tmp_path / "ckpt" / "final_policy" / "model.safetensors").is_file()
