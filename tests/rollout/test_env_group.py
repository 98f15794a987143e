"""EnvGroup: a StarPO group as an RLlib MultiAgentEnv over real text envs."""

import math
import threading

import numpy as np
import pytest

from rllib_ragen.rollout.env_group import (
    EnvFault,
    EnvGroup,
    TurnBudgetSettings,
    call_with_timeout,
    check_reset_result,
    check_step_result,
)


def test_group_members_share_the_initial_state():
    group = EnvGroup("sokoban", group_size=3, budget=TurnBudgetSettings())
    observations, infos = group.reset(seed=10_003)
    assert len(set(observations.values())) == 1
    assert all(info["seed"] == 10_003 for info in infos.values())
    again, _ = group.reset(seed=10_003)
    assert again == observations  # deterministic per seed


def test_format_penalty_when_no_valid_action_and_budget_of_turns():
    group = EnvGroup("sokoban", group_size=2, budget=TurnBudgetSettings(max_turns=2, max_actions_per_traj=10))
    observations, _ = group.reset(seed=1)
    obs, rewards, terminateds, truncateds, infos = group.step({"traj_0": [], "traj_1": ["Up"]})
    assert rewards["traj_0"] == pytest.approx(-0.1)  # no valid action: format penalty only
    assert obs["traj_0"] == observations["traj_0"]  # and the state did not change
    assert infos["traj_0"]["num_valid_actions"] == 0
    assert not truncateds["traj_0"] and not terminateds["__all__"]
    _, _, _, truncateds, _ = group.step({"traj_0": [], "traj_1": ["Down"]})
    assert truncateds["traj_0"] and truncateds["traj_1"]  # 2 turns used
    assert truncateds["__all__"]
    with pytest.raises(ValueError, match="already finished"):
        group.step({"traj_0": ["Up"]})


def test_action_budget_per_trajectory_cuts_the_action_list():
    # Unknown action names change nothing but still use the action budget.
    group = EnvGroup("sokoban", group_size=1, budget=TurnBudgetSettings(max_turns=5, max_actions_per_traj=4))
    group.reset(seed=2)
    _, rewards, _, truncated, info = group.step({"traj_0": ["Jump", "Jump", "Jump"]})
    assert info["traj_0"]["num_actions_executed"] == 3 and not truncated["traj_0"]
    assert rewards["traj_0"] == pytest.approx(-0.1)  # none valid: format penalty
    _, _, _, truncated, info = group.step({"traj_0": ["Jump", "Jump", "Jump"]})
    assert info["traj_0"]["num_actions_executed"] == 1
    assert info["traj_0"]["actions_left"] == 0
    assert truncated["traj_0"]


def test_bandit_group_ends_after_one_pick_with_success_flag():
    group = EnvGroup("bandit_phoenix_dragon", {"high_prob": 1.0}, group_size=2, budget=TurnBudgetSettings(max_turns=1))
    group.reset(seed=5)
    _, rewards, terminateds, _, infos = group.step({"traj_0": ["Dragon"], "traj_1": ["Phoenix"]})
    assert rewards == {"traj_0": pytest.approx(1.0), "traj_1": pytest.approx(0.15)}
    assert infos["traj_0"]["success"] and not infos["traj_1"]["success"]
    assert terminateds["traj_0"] and terminateds["traj_1"] and terminateds["__all__"]


def test_unknown_env_is_a_clear_error():
    with pytest.raises(KeyError, match="sokoban"):
        EnvGroup("sokobann", group_size=1, budget=TurnBudgetSettings())


def test_budget_validation():
    with pytest.raises(ValueError, match="format_penalty"):
        TurnBudgetSettings(format_penalty=0.5)
    with pytest.raises(ValueError, match="max_turns"):
        TurnBudgetSettings(max_turns=0)


@pytest.mark.parametrize(
    "result",
    [("s", 1.0, False, False, {}), ("s", np.float32(-0.5), np.bool_(True), False, {"x": 1}), ("", 0, False, True, {})],
)
def test_well_formed_step_results_pass_as_plain_python(result):
    observation, reward, terminated, truncated, info = check_step_result(result)
    assert (observation, reward, terminated, truncated, info) == tuple(result)
    assert type(reward) is float and type(terminated) is bool and type(truncated) is bool


@pytest.mark.parametrize(
    "result,message",
    [
        (("s", 1.0, False, {}), "a tuple of 4"),
        (["s", 1.0, False, False, {}], "a list"),
        ((b"s", 1.0, False, False, {}), "observation is a bytes"),
        (("s", math.nan, False, False, {}), "reward nan"),
        (("s", math.inf, False, False, {}), "reward inf"),
        (("s", "1", False, False, {}), "reward '1'"),
        (("s", True, False, False, {}), "reward True"),
        (("s", 1.0, 0, False, {}), "terminated=0, not a bool"),
        (("s", 1.0, False, None, {}), "truncated=None"),
        (("s", 1.0, False, False, None), "info of type NoneType"),
    ],
)
def test_malformed_step_results_are_env_faults(result, message):
    with pytest.raises(EnvFault, match=message):
        check_step_result(result)


def test_reset_results_are_checked():
    assert check_reset_result(("s", {})) == ("s", {})
    with pytest.raises(EnvFault, match="not \\(observation, info\\)"):
        check_reset_result("s")
    with pytest.raises(EnvFault, match="observation is a int"):
        check_reset_result((3, {}))


def test_call_with_timeout_returns_raises_or_abandons(monkeypatch):
    assert call_with_timeout(lambda: 7, None) == 7
    assert call_with_timeout(lambda: 7, 1.0) == 7
    with pytest.raises(ZeroDivisionError):
        call_with_timeout(lambda: 1 / 0, 1.0)

    # A call that ends when released (or, should the timeout never fire, after 300 s, failing the
    # test): an EnvFault raised while it still runs can only come from the timeout.
    started, release, returned = threading.Event(), threading.Event(), threading.Event()

    def hung():
        started.set()
        release.wait(300)
        returned.set()

    waits = []  # the timeouts the caller's thread waited on the worker with
    join = threading.Thread.join

    def recorded_join(thread, timeout=None):
        if thread.name == "env-call":
            waits.append(timeout)
        return join(thread, timeout)

    monkeypatch.setattr(threading.Thread, "join", recorded_join)
    with pytest.raises(EnvFault, match=r"did not return within 0.2 s \(abandoned\)"):
        call_with_timeout(hung, 0.2)
    monkeypatch.undo()
    assert waits == [0.2]  # one wait, of the configured length
    assert not returned.is_set()  # the caller left it running...
    assert started.wait(timeout=60)  # ...in its worker thread
    release.set()
    assert returned.wait(timeout=60)  # the abandoned thread finishes on its own


def test_step_timeout_must_be_positive():
    with pytest.raises(ValueError, match="step_timeout_s"):
        EnvGroup("sokoban", group_size=1, budget=TurnBudgetSettings(), step_timeout_s=0)
