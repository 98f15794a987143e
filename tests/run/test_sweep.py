"""Ray Tune sweeps: grid parsing and validation, and a real 2-trial ASHA sweep of
the tiny model on the README's custom env where every trial is an MLflow run and
the results table is right."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from mlflow.tracking import MlflowClient
from ray.tune.search.variant_generator import generate_variants
from run_helpers import ROOT, load_script, tiny_config, write_readme_env

from envs import BanditEnv, register_env, registry
from rllib_ragen.algorithm.presets import PRESETS, preset
from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.run.callbacks import MLflowSettings
from rllib_ragen.run.sweep import (
    DEFAULT_GRID,
    INTERRUPTED_TAG,
    STOPPED_EARLY_TAG,
    SweepSettings,
    check_grid,
    param_space,
    parse_grid,
)
from rllib_ragen.run.tracking import TRIAL_TAG


def _sweep_cli():
    return load_script(ROOT / "tuned_examples" / "sweep_starpo.py")


def test_parse_grid_reads_literals_per_key(tiny_model_path):
    grid = parse_grid(tiny_config(tiny_model_path), ["group_size=4, 8", "actor_lr=1e-5,3e-5", "kl_type=k1,k3"])
    assert grid == {"group_size": [4, 8], "actor_lr": [1e-5, 3e-5], "kl_type": ["k1", "k3"]}


@pytest.mark.parametrize(
    "assignments,message",
    [
        (["group_sise=4,8"], "unknown config key 'group_sise'"),
        (["group_size"], "KEY=VALUE"),
        (["group_size=4", "group_size=8"], "twice"),
        (["group_size=,"], "no values"),
    ],
)
def test_bad_grid_is_named(tiny_model_path, assignments, message):
    with pytest.raises(ValueError, match=message):
        parse_grid(tiny_config(tiny_model_path), assignments)


def test_grid_values_take_the_settings_types(tiny_model_path):
    with pytest.raises(ValueError, match=r"--grid group_size=4.5: group_size takes int \(an integer\)"):
        parse_grid(tiny_config(tiny_model_path), ["group_size=4,4.5"])


def test_an_env_registered_only_here_is_refused_before_any_trial(tiny_model_path, monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register_env("bandit_here", BanditEnv)
    with pytest.raises(ValueError, match="'bandit_here' is registered in this process only"):
        check_grid(tiny_config(tiny_model_path, env="bandit_here"), {"group_size": [2]})


def test_invalid_grid_point_fails_before_any_trial(tiny_model_path):
    with pytest.raises(ValueError, match=r"grid point \{'rollout_frequency': 1, 'group_size': 0\}.*group_size"):
        check_grid(tiny_config(tiny_model_path), {"rollout_frequency": [1], "group_size": [2, 0]})


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(grid={}), "grid is empty"),
        (dict(grid={"group_size": []}), "non-empty list"),
        (dict(scheduler="pbt"), "scheduler"),
        (dict(mode="best"), "mode"),
        (dict(max_concurrent=0), "max_concurrent"),
        (dict(grace_period=5), "grace_period"),
    ],
)
def test_bad_sweep_config_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SweepSettings(**{"grid": {"group_size": [2, 4]}, "stop_iters": 2, **kwargs})


def test_default_grid_is_valid_for_every_preset():
    for name in PRESETS:
        check_grid(preset(name, "sokoban"), DEFAULT_GRID)
    assert set(DEFAULT_GRID) == {"rollout_frequency", "group_size", "max_turns"}


def test_every_trial_tune_makes_of_the_param_space_carries_its_grid_point(tiny_model_path):
    # Tune resolves the param space into one dict per trial and the algorithm rebuilds its config
    # from that dict: each trial's config must hold its own point, in the groups that store the settings.
    config = tiny_config(tiny_model_path)
    grid = {"group_size": [2, 3], "max_turns": [1, 2], "lambda_": [0.5, 0.9]}
    space = param_space(config, grid, MLflowSettings(tracking_uri="sqlite:////nonexistent/mlflow.db"))
    trials = {
        (c.rollout.group_size, c.turn_budget.max_turns, c.advantages.lambda_)
        for c in (StarPOConfig().update_from_dict(spec) for _, spec in generate_variants(space))
    }
    assert trials == {(g, t, lam) for g in (2, 3) for t in (1, 2) for lam in (0.5, 0.9)}


def test_num_trials_is_the_grid_product():
    assert SweepSettings(grid={"a": [1, 2], "b": [3, 4, 5]}, stop_iters=1).num_trials == 6


@pytest.mark.slow
def test_two_trial_asha_sweep_of_the_readme_env_logs_every_trial_to_mlflow(tiny_model_path, tmp_path, monkeypatch):
    # No --tracking-uri: the store is ./mlflow.db of the directory the sweep starts
    # in, although trials run in their own trial directories.
    monkeypatch.chdir(tmp_path)
    # The README's custom env, named by import path (guess_env.py in the working directory,
    # as a user would): the trials import it themselves, on the sys.path of the Ray the sweep starts.
    assert not ray.is_initialized()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # init_ray extends it
    env = write_readme_env(tmp_path)
    try:
        _sweep_and_check(tiny_model_path, tmp_path, env)
    finally:
        ray.shutdown()


def _sweep_and_check(tiny_model_path: Path, tmp_path: Path, env: str) -> None:
    # One trial after the other, so ASHA's rung-1 cutoff sees trial 0 (6 trajectories
    # per iteration) before trial 1 (4) and stops trial 1 after its first iteration.
    table = _sweep_cli().main([
        "--env", env, "--model", str(tiny_model_path), "--engine", "hf", "--no-warm-start",
        "--stop-iters", "2", "--n-groups", "2",
        "--set", "response_length=8", "--set", "mini_batch_size=4", "--set", "micro_batch_size=2",
        "--set", "eval_interval=1", "--set", "eval_size=2",
        "--grid", "rollout_frequency=2", "--grid", "group_size=3,2", "--grid", "max_turns=1",
        "--scheduler", "asha", "--metric", "env_runners/num_trajectories", "--max-concurrent", "1",
        "--experiment", "sweep-test", "--storage-path", str(tmp_path / "tune"),
    ])

    assert list(table["group_size"]) == [3, 2]  # best first
    assert list(table["rollout_frequency"]) == [2, 2] and list(table["max_turns"]) == [1, 1]
    assert list(table["iterations"]) == [2, 1] and list(table["error"]) == ["", ""]
    assert list(table["status"]) == ["finished", "stopped early"]

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.get_experiment_by_name("sweep-test").experiment_id
    runs = {run.info.run_id: run for run in client.search_runs([experiment_id])}
    assert set(runs) == set(table["mlflow_run_id"])
    best, stopped = (runs[run_id] for run_id in table["mlflow_run_id"])
    for run, group_size in ((best, "3"), (stopped, "2")):
        assert run.data.params["group_size"] == group_size and run.data.params["rollout_frequency"] == "2"
        assert run.info.run_name == run.data.tags[TRIAL_TAG] and run.data.tags["env"] == env
    assert best.info.status == "FINISHED" and STOPPED_EARLY_TAG not in best.data.tags
    assert [m.step for m in client.get_metric_history(best.info.run_id, "env_runners/num_trajectories")] == [1, 2]
    assert client.get_metric_history(best.info.run_id, "env_runners/num_trajectories")[-1].value == 6.0
    # The final policy, once, and the last iteration's evaluation page with every trajectory; checkpoints
    # only with --log-checkpoint-every.
    assert {a.path for a in client.list_artifacts(best.info.run_id)} == {"evaluation", "final_policy", "trajectories"}
    # ASHA stopped trial 1: its run is closed as KILLED, with one iteration and no final policy.
    assert stopped.info.status == "KILLED" and stopped.data.tags[STOPPED_EARLY_TAG] == "true"
    assert [m.step for m in client.get_metric_history(stopped.info.run_id, "training_iteration")] == [1]
    assert {a.path for a in client.list_artifacts(stopped.info.run_id)} == {"trajectories"}
    assert Path(tmp_path / "tune").is_dir()


@pytest.mark.slow
@pytest.mark.vllm
def test_two_trial_sweep_of_the_cpu_preset_places_its_vllm_engines(tiny_model_path, tmp_path, monkeypatch):
    # The CPU preset's trial on the local 2-CPU Ray: the algorithm and its vLLM engine actor, each in a
    # bundle of the trial's placement group (before, the engine waited forever for a CPU the group lacked).
    monkeypatch.chdir(tmp_path)
    assert not ray.is_initialized()
    try:
        table = _sweep_cli().main([
            "--env", "bandit", "--preset", "cpu", "--model", str(tiny_model_path), "--engine", "vllm",
            "--no-warm-start", "--stop-iters", "1", "--n-groups", "2",
            "--set", "kv_cache_gb=0.05", "--set", "max_model_len=512", "--set", "eval_size=2",
            "--grid", "group_size=2,4", "--max-concurrent", "2", "--placement-timeout", "60",
            "--experiment", "sweep-vllm", "--storage-path", str(tmp_path / "tune"),
        ])  # fmt: skip
    finally:
        ray.shutdown()
    assert sorted(table["group_size"]) == [2, 4]
    assert list(table["status"]) == ["finished", "finished"] and list(table["iterations"]) == [1, 1]
    assert sorted(table["return"].notna()) == [True, True]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("sweep-vllm").experiment_id])
    assert {run.info.run_id for run in runs} == set(table["mlflow_run_id"])
    assert {run.data.params["group_size"] for run in runs} == {"2", "4"}
    assert {run.info.status for run in runs} == {"FINISHED"}


@pytest.mark.slow
def test_ctrl_c_stops_the_sweep_with_status_130_and_the_trials_marked_interrupted(tiny_model_path, tmp_path):
    command = [
        sys.executable, str(ROOT / "tuned_examples" / "sweep_starpo.py"),
        "--env", "bandit", "--model", str(tiny_model_path), "--engine", "hf", "--no-warm-start",
        "--stop-iters", "1000", "--n-groups", "2", "--set", "eval_interval=1000",
        "--grid", "group_size=2,3", "--experiment", "sweep-interrupted", "--storage-path", str(tmp_path / "tune"),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    try:
        for line in process.stdout:
            output.append(line)
            if "[1/1000]" in line:  # a trial is mid-way
                process.send_signal(signal.SIGINT)
                break
        output.extend(process.stdout)
        assert process.wait(timeout=180) == 130, "".join(output)
    finally:
        if process.poll() is None:
            process.kill()
    text = "".join(output)
    table = text.split("results (best first):", 1)[1]
    assert re.search(r"^\s*trial\s+group_size\s+status\s", table, re.M), table
    # The swept values in every row: the running trial interrupted, the next one never started.
    assert re.search(r"^\s*\w+_00000\s+2\s+interrupted\s", table, re.M), table
    assert re.search(r"^\s+3\s+not started\s", table, re.M), table
    assert "sweep interrupted: 2 of 2 trials did not finish" in text
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("sweep-interrupted").experiment_id])
    # The trial that was running had opened its run: closed KILLED and tagged, not left RUNNING.
    assert [run.info.status for run in runs] == ["KILLED"]
    assert runs[0].data.tags[INTERRUPTED_TAG] == "true"
