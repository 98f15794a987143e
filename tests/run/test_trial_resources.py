"""What a sweep trial reserves (a bundle per vLLM engine actor besides RLlib's own), the one-line
refusal of a trial larger than the cluster, and the watchdog that names an actor left unplaced."""

from __future__ import annotations

import time

import pytest
import ray
from conftest import require_extra
from ray.tune.execution.placement_groups import PlacementGroupFactory
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from run_helpers import ROOT, load_script

from rllib_ragen.algorithm.presets import preset
from rllib_ragen.rllib_private import actor_table
from rllib_ragen.run.placement_watchdog import ActorPlacementTimeoutError, PlacementWatchdog
from rllib_ragen.run.trial_resources import TrialDoesNotFitError, check_trial_fits, trial_placement


def test_a_cpu_preset_trial_reserves_the_algorithm_and_its_engine():
    require_extra("vllm", "cpu,test")
    config = preset("cpu", "bandit").inference(engine="vllm")
    # RLlib's own request holds the algorithm only; the engine actor needs a bundle of its own.
    assert trial_placement(config).bundles == [{"CPU": 1.0}, {"CPU": 1.0}]
    # Tune hands the callable a trial's config dict: the same placement.
    assert trial_placement(config.to_dict()).bundles == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert trial_placement(config.copy().inference(num_cpus_per_engine=0.5)).required_resources == {"CPU": 1.5}
    # Each remote env runner holds a pool of its own: 2 runners x 2 engines.
    scaled = config.copy().inference(num_engines=2).env_runners(num_env_runners=2)
    assert trial_placement(scaled).bundles == [{"CPU": 1.0}] * 7
    # The in-process HF engine and an engine reserving nothing add no bundle.
    assert trial_placement(config.copy().inference(engine="hf")).bundles == [{"CPU": 1.0}]
    assert trial_placement(config.copy().inference(num_cpus_per_engine=0)).bundles == [{"CPU": 1.0}]


def test_a_trial_larger_than_the_cluster_is_named_in_one_line():
    placement = PlacementGroupFactory([{"CPU": 1.0}, {"CPU": 1.5}])
    check_trial_fits(placement, parts="the algorithm", cluster={"CPU": 2.5}, nodes=[{"CPU": 2.5}])
    with pytest.raises(TrialDoesNotFitError) as error:
        check_trial_fits(placement, parts="the algorithm", cluster={"CPU": 2.0, "memory": 1e9}, nodes=[{"CPU": 2.0}])
    message = str(error.value)
    assert "\n" not in message
    assert "needs {'CPU': 2.5}" in message and "the cluster has {'CPU': 2.0}" in message
    # Enough in total, but a bundle no single node holds.
    gpu = PlacementGroupFactory([{"CPU": 1.0}, {"GPU": 2.0}])
    with pytest.raises(TrialDoesNotFitError, match=r"bundle \{'GPU': 2.0\} that no node holds"):
        check_trial_fits(gpu, parts="x", cluster={"CPU": 2.0, "GPU": 2.0}, nodes=[{"CPU": 2.0, "GPU": 1.0}] * 2)


def test_a_sweep_whose_trial_exceeds_the_cluster_fails_before_it_starts(ray_session, tiny_model_path, tmp_path, capsys):
    require_extra("vllm", "cpu,test")
    sweep = load_script(ROOT / "tuned_examples" / "sweep_starpo.py")
    with pytest.raises(SystemExit) as exit_info:
        sweep.main([
            "--env", "bandit", "--model", str(tiny_model_path), "--engine", "vllm", "--no-warm-start",
            "--set", "num_cpus_per_engine=1.5", "--grid", "group_size=2,4", "--stop-iters", "1",
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--storage-path", str(tmp_path / "tune"),
        ])  # fmt: skip
    assert exit_info.value.code == 2
    # One line (beside MLflow's and Ray's own log lines).
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert error.startswith("error: grid point {'group_size': 2}: one trial needs {'CPU': 2.5}")
    assert "1 vLLM engine(s) ({'CPU': 1.5} each" in error and "the cluster has {'CPU': 2.0}" in error
    assert [path.name for path in (tmp_path / "tune").iterdir()] == ["sweep.log"]  # Tune never started


@ray.remote(num_cpus=1)
class Starter:
    """Starts, inside its placement group, an actor that needs a CPU the group does not have."""

    def start(self) -> None:
        self.child = Unplaceable.remote()


@ray.remote(num_cpus=1)
class Unplaceable:
    pass


@ray.remote(num_cpus=0.5)
class SlowToStart:
    """Placed at once, but its start takes a while (as a vLLM engine's model load)."""

    def __init__(self) -> None:
        time.sleep(60)


def test_the_watchdog_names_an_actor_left_unplaced_and_spares_one_still_starting(ray_session):
    group = placement_group([{"CPU": 1.0}, {"CPU": 0.5}])
    ray.get(group.ready(), timeout=60)
    in_group = PlacementGroupSchedulingStrategy(group, placement_group_capture_child_tasks=True)
    starter = Starter.options(scheduling_strategy=in_group).remote()
    slow = SlowToStart.options(scheduling_strategy=in_group).remote()
    try:
        ray.get(starter.start.remote(), timeout=60)
        _wait_until_leased("SlowToStart")
        now = [100.0]
        watchdog = PlacementWatchdog(timeout_s=30, clock=lambda: now[0])
        watchdog.check([])
        now[0] += 30  # at the timeout: not past it
        watchdog.check([])
        now[0] += 1
        with pytest.raises(ActorPlacementTimeoutError) as error:
            watchdog.check([])
        message = str(error.value)
        assert message.startswith("actor Unplaceable (started by Starter) waited 31 s for resources")
        assert "SlowToStart" not in message and "no trial is live" in message
    finally:
        for actor in (starter, slow):
            ray.kill(actor)
        remove_placement_group(group)


def _wait_until_leased(class_name: str, timeout_s: float = 60) -> None:
    """Until the actor's worker process exists (it is placed and running its __init__)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(a["ActorClassName"] == class_name and a["Pid"] for a in actor_table()):
            return
        time.sleep(0.2)
    raise AssertionError(f"{class_name} was not placed within {timeout_s} s")
