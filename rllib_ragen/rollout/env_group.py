"""`EnvGroup`: one StarPO group as an RLlib multi-agent env.

A group is `group_size` copies of one text env, all reset with the same seed;
each agent ("traj_0", "traj_1", ...) is one trajectory from that shared start.
What happens after the start (FrozenLake's slips, the Bandit's payouts) is
either drawn alike for every member (`group_randomness="shared"`: each env
repeats the seed's one random stream) or by each member on its own
(`"independent"`: member i draws from the stream `(seed, i)`, see
`envs.base.DYNAMICS_STREAM`), reproducibly in both cases.
An agent's action is the list of action phrases parsed from one model turn;
they are stepped in order until the env ends or a budget runs out. The group
enforces the turn budget (`max_turns`) and the per-trajectory action budget
(`max_actions_per_traj`), and adds the format penalty to turns that carried no
valid action.

A faulty env ends only its own trajectory: a reset or step that raises, runs
past `step_timeout_s` (it is abandoned in its worker thread) or returns
malformed output (a non-string observation, a non-finite reward, a wrong
tuple) is logged with the env name and seed, recorded in `errors`, and that
trajectory is truncated (or, on reset, left out) while the others go on.
`close()` closes the member envs: a rollout closes its groups when it ends, so
envs that hold resources (an OpenEnv server session) release them.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import numbers
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.env.multi_agent_env import MultiAgentEnv

from envs import make_env
from envs.base import DYNAMICS_STREAM, TextEnv
from rllib_ragen.checks import check_at_least_one, check_choice

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TurnBudgetSettings:
    """Limits of one trajectory (set with `StarPOConfig.rollouts()`).

    Each field is documented where `StarPOConfig.rollouts()` sets it.
    """

    max_turns: int = 5
    max_actions_per_traj: int = 10
    format_penalty: float = -0.1

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_actions_per_traj < 1:
            raise ValueError(f"max_actions_per_traj must be >= 1, got {self.max_actions_per_traj}")
        if self.format_penalty > 0:
            raise ValueError(f"format_penalty must be <= 0, got {self.format_penalty}")


GROUP_RANDOMNESS = ("shared", "independent")
# With payout draws shared inside a group, GRPO's mean advantage can favour the Bandit's worse arm;
# each member drawing its own removes that bias (benchmarks/group_randomness.py,
# docs/results/group_randomness.md).
DEFAULT_GROUP_RANDOMNESS = "independent"


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """How many trajectories an iteration samples, and how (set with `StarPOConfig.rollouts()`).

    Each field is documented where `StarPOConfig.rollouts()` sets it.
    """

    n_groups: int = 8
    group_size: int = 16
    response_length: int = 400
    temperature: float = 1.0
    train_seed_start: int = 10_000
    env_step_timeout_s: float | None = 60.0
    group_randomness: str = DEFAULT_GROUP_RANDOMNESS
    train_env_overrides: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        check_at_least_one(self, "n_groups", "group_size", "response_length")
        if self.train_env_overrides is not None and not isinstance(self.train_env_overrides, Mapping):
            raise ValueError(f"train_env_overrides must be a dict or None, got {self.train_env_overrides!r}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 for rollouts, got {self.temperature}")
        if self.env_step_timeout_s is not None and not self.env_step_timeout_s > 0:
            raise ValueError(f"env_step_timeout_s must be > 0 or None, got {self.env_step_timeout_s}")
        check_choice("group_randomness", self.group_randomness, GROUP_RANDOMNESS)


def training_env_config(env_config: Mapping[str, Any] | None, settings: RolloutSettings) -> dict[str, Any]:
    """The env config training rollouts play: `env_config` with `settings.train_env_overrides` on top."""
    return {**(env_config or {}), **(settings.train_env_overrides or {})}


def agent_id(index: int) -> str:
    return f"traj_{index}"


class EnvFault(RuntimeError):
    """An env reset/step raised, hung past its timeout, or returned malformed output."""


def call_with_timeout(fn: Callable[[], Any], timeout_s: float | None) -> Any:
    """`fn()`, run in a daemon worker thread when `timeout_s` is set.

    A call still running after `timeout_s` seconds raises EnvFault; its thread
    is abandoned (Python cannot stop it; being a daemon it never blocks exit).
    Exceptions of `fn` are re-raised as they are.
    """
    if timeout_s is None:
        return fn()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as error:  # handed to the caller's thread
            outcome["error"] = error

    worker = threading.Thread(target=target, daemon=True, name="env-call")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise EnvFault(f"did not return within {timeout_s:g} s (abandoned)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def check_reset_result(result: Any) -> tuple[str, dict]:
    """`result` if it is a (str observation, dict info) pair, else EnvFault saying what is wrong."""
    if not isinstance(result, tuple) or len(result) != 2:
        raise EnvFault(f"reset returned {_describe(result)}, not (observation, info)")
    observation, info = result
    _check_observation(observation)
    if not isinstance(info, dict):
        raise EnvFault(f"reset returned an info of type {type(info).__name__}, not dict")
    return observation, info


def check_step_result(result: Any) -> tuple[str, float, bool, bool, dict]:
    """`result` as (obs, float reward, bool, bool, info), else EnvFault saying what is wrong."""
    if not isinstance(result, tuple) or len(result) != 5:
        raise EnvFault(f"step returned {_describe(result)}, not (observation, reward, terminated, truncated, info)")
    observation, reward, terminated, truncated, info = result
    _check_observation(observation)
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
        raise EnvFault(f"step returned the reward {reward!r}, not a finite number")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, (bool, np.bool_)):
            raise EnvFault(f"step returned {name}={flag!r}, not a bool")
    if not isinstance(info, dict):
        raise EnvFault(f"step returned an info of type {type(info).__name__}, not dict")
    return observation, float(reward), bool(terminated), bool(truncated), info


def _check_observation(observation: Any) -> None:
    if not isinstance(observation, str):
        raise EnvFault(f"the observation is a {type(observation).__name__}, not a str")


def _describe(result: Any) -> str:
    if isinstance(result, tuple):
        return f"a tuple of {len(result)}"
    return f"a {type(result).__name__}"


class EnvGroup(MultiAgentEnv):
    """`group_size` envs of one kind, reset with one shared seed.

    Args:
        env_name: A registered env.
        env_config: Its config overrides.
        group_size: Trajectories (env copies) in the group.
        budget: Turn and action limits of each trajectory.
        step_timeout_s: Seconds one env reset or step may take before its
            trajectory is abandoned; None = no limit (and no worker thread).
        group_randomness: "shared" or "independent" randomness after the
            shared start (module docstring).
    """

    def __init__(
        self,
        env_name: str,
        env_config: dict[str, Any] | None = None,
        *,
        group_size: int,
        budget: TurnBudgetSettings,
        step_timeout_s: float | None = None,
        group_randomness: str = DEFAULT_GROUP_RANDOMNESS,
    ) -> None:
        super().__init__()
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if group_randomness not in GROUP_RANDOMNESS:
            raise ValueError(f"group_randomness must be one of {GROUP_RANDOMNESS}, got {group_randomness!r}")
        self.group_randomness = group_randomness
        if step_timeout_s is not None and not step_timeout_s > 0:
            raise ValueError(f"step_timeout_s must be > 0 or None, got {step_timeout_s}")
        self.env_name = env_name
        self.envs: list[TextEnv] = [make_env(env_name, **(env_config or {})) for _ in range(group_size)]
        self.budget = budget
        self.step_timeout_s = step_timeout_s
        self.agents = self.possible_agents = [agent_id(i) for i in range(group_size)]
        self.observation_spaces = {a: e.observation_space for a, e in zip(self.agents, self.envs)}
        self.action_spaces = {a: gym.spaces.Sequence(e.action_space) for a, e in zip(self.agents, self.envs)}
        self.seed: int | None = None
        self.errors: list[str] = []  # one line per faulty reset/step since the last reset
        self._turns: dict[str, int] = {}
        self._actions: dict[str, int] = {}
        self._done: dict[str, bool] = {}
        self._observations: dict[str, str] = {}

    @property
    def template_env(self) -> TextEnv:
        """One member env (they share instructions and vocabulary)."""
        return self.envs[0]

    @property
    def all_done(self) -> bool:
        return all(self._done.values())

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, str], dict[str, dict]]:
        """Resets every member with `seed`; members whose reset failed are absent from the result."""
        self.seed, self.errors = seed, []
        observations, infos = {}, {}
        for index, (agent, env) in enumerate(zip(self.agents, self.envs)):
            self._turns[agent], self._actions[agent], self._done[agent] = 0, 0, False
            member_options = {DYNAMICS_STREAM: index} if self.group_randomness == "independent" else {}
            try:
                observation, info = check_reset_result(
                    call_with_timeout(
                        functools.partial(env.reset, seed=seed, options=member_options),
                        self.step_timeout_s,
                    )
                )
            except Exception as error:
                self._record_fault(agent, "reset", error)
                self._done[agent] = True
                continue
            observations[agent], infos[agent] = observation, {**info, "seed": seed}
            self._observations[agent] = observation
        return observations, infos

    def end(self, agent: str) -> None:
        """Marks `agent`'s trajectory finished from outside (e.g. its next prompt is too long)."""
        self._done[agent] = True

    def step(
        self, action_dict: Mapping[str, Sequence[str]]
    ) -> tuple[dict[str, str], dict[str, float], dict[str, bool], dict[str, bool], dict[str, dict[str, Any]]]:
        """Steps each agent through the actions of its turn.

        Returns RLlib's multi-agent 5-tuple; agents absent from `action_dict`
        do not step. `__all__` is set once every trajectory has ended.
        """
        obs, rewards, terminateds, truncateds, infos = {}, {}, {}, {}, {}
        for agent, actions in action_dict.items():
            if self._done[agent]:
                raise ValueError(f"{agent} already finished; it cannot act again")
            index = self.agents.index(agent)
            obs[agent], rewards[agent], term, trunc, infos[agent] = self._step_one(agent, self.envs[index], actions)
            terminateds[agent], truncateds[agent] = term, trunc
            self._done[agent] = term or trunc
        terminateds["__all__"] = truncateds["__all__"] = self.all_done
        return obs, rewards, terminateds, truncateds, infos

    def _step_one(
        self, agent: str, env: TextEnv, actions: Sequence[str]
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        budget_left = self.budget.max_actions_per_traj - self._actions[agent]
        to_run = list(actions)[:budget_left]
        reward, terminated, truncated = 0.0, False, False
        info: dict[str, Any] = {"success": False}
        valid, error = 0, None
        observation = self._observations[agent]
        for action in to_run:
            try:
                observation, r, terminated, truncated, info = check_step_result(
                    call_with_timeout(functools.partial(env.step, action), self.step_timeout_s)
                )
            except Exception as fault:
                error = self._record_fault(agent, f"step {action!r}", fault)
                info = {"success": False, "env_error": error}
                break
            reward += r
            valid += int(info.get("action_is_valid", True))
            self._actions[agent] += 1
            if terminated or truncated:
                break
        self._observations[agent] = observation
        if valid == 0 and error is None:
            reward += self.budget.format_penalty
        self._turns[agent] += 1
        out_of_budget = (
            self._turns[agent] >= self.budget.max_turns or self._actions[agent] >= self.budget.max_actions_per_traj
        )
        info = {
            **info,
            "num_actions_executed": len(to_run),
            "num_valid_actions": valid,
            "turns_left": self.budget.max_turns - self._turns[agent],
            "actions_left": self.budget.max_actions_per_traj - self._actions[agent],
        }
        truncated = truncated or error is not None or (out_of_budget and not terminated)
        return observation, reward, terminated, truncated, info

    def close(self) -> None:
        """Closes every member env (an OpenEnv client's ends its server session); a failing close is logged."""
        for agent, env in zip(self.agents, self.envs):
            try:
                call_with_timeout(env.close, self.step_timeout_s)
            except Exception as error:
                logger.warning("env %r (%s) failed to close: %s: %s", self.env_name, agent, type(error).__name__, error)

    def _record_fault(self, agent: str, call: str, error: Exception) -> str:
        """Logs and records a faulty env call; returns its one-line description."""
        line = f"{type(error).__name__}: {error}"
        self.errors.append(f"{agent} {call}: {line}")
        logger.warning(
            "env %r (seed %s, %s) failed in %s and its trajectory was ended: %s",
            self.env_name,
            self.seed,
            agent,
            call,
            line,
        )
        return line
