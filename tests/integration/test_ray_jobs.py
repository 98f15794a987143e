"""Ray Jobs as `docs/ray_jobs.md` documents them: its marked commands, run
verbatim in a shell against a real head node (`.venv/bin/ray start --head`
without the venv on its PATH, token auth on, its own ports, stopped through its
own processes), train and log to MLflow; a cluster that is gone fails fast
with an error that says what to do."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml
from mlflow.tracking import MlflowClient
from run_helpers import ROOT, VENV_BIN, ray_head

DOC = ROOT / "docs" / "ray_jobs.md"
RUNTIME_ENV = ROOT / "docs" / "runtime_env.yaml"
# A fenced bash block right after this comment is run by the test.
MARKER = "<!-- ray-jobs-test -->"


def documented_commands() -> list[str]:
    """The bash blocks of the doc marked for this test, in order."""
    return re.findall(
        re.escape(MARKER) + r"\n```bash\n(.*?)```", DOC.read_text(), flags=re.DOTALL
    )


def test_documented_runtime_env_ships_the_checkout_and_the_doc_covers_the_pitfalls():
    runtime_env = yaml.safe_load(RUNTIME_ENV.read_text())
    assert runtime_env["working_dir"] == "."
    assert {"checkpoints", "mlflow.db", ".git"} <= set(runtime_env["excludes"])
    doc = DOC.read_text()
    assert (
        "RAY_AUTH_MODE=token" in doc
        and '"$RLLIB_RAGEN_PYTHON"' in doc
        and "working_dir: ." in doc
    )
    (block,) = documented_commands()
    assert block.startswith(
        "ray job submit --runtime-env docs/runtime_env.yaml -- \\\n"
    )


def test_a_cluster_that_is_gone_fails_fast_saying_what_to_do(tmp_path):
    # A stale address file, as a head killed without `ray stop` leaves it (RAY_TMPDIR: not the real /tmp/ray).
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(
        "127.0.0.1:9\n"
    )  # port 9 (discard): nothing listens
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from rllib_ragen.run.ray_session import init_ray; init_ray()",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "rllib_ragen.run.ray_session.ClusterUnreachableError: Ray would attach to the cluster at "
    )
    assert (
        f"delete {tmp_path / 'ray' / 'ray_current_cluster'}" in last
        and "RAY_ADDRESS=local" in last
    )


@pytest.mark.slow
def test_documented_commands_run_a_job_on_a_local_head_node(tmp_path):
    jobs = tmp_path / "jobs"
    with ray_head(
        tmp_path / "head", env={"RLLIB_RAGEN_CACHE": str(tmp_path / "cache")}
    ) as (url, token_file):
        env = dict(
            os.environ,
            RAY_API_SERVER_ADDRESS=url,
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(token_file),
            RLLIB_RAGEN_PYTHON=sys.executable,
            JOB_DIR=str(jobs),
            PATH=os.pathsep.join(
                [VENV_BIN, os.environ["PATH"]]
            ),  # the doc's `source .venv/bin/activate`
        )
        env.pop("RAY_ADDRESS", None)
        for block in documented_commands():
            result = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
            assert "SUCCEEDED" in result.stdout, result.stdout[-3000:]
    logs = result.stdout
    assert "[1/1] | success" in logs and "done. MLflow run" in logs

    mlflow = MlflowClient(f"sqlite:///{jobs / 'mlflow.db'}")
    (run,) = mlflow.search_runs(
        [mlflow.get_experiment_by_name("rllib-ragen").experiment_id]
    )
    assert run.info.status == "FINISHED" and run.data.params["env"] == "bandit"
    assert (jobs / "check" / "final_policy" / "model.safetensors").is_file()
