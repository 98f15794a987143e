"""`EnvGroup`: one StarPO group as an RLlib multi-agent env.

A group is `group_size` copies of one text env, all reset with the same seed;
each agent ("traj_0", "traj_1", ...) is one trajectory from that shared start.
An agent's action is the list of action phrases parsed from one model turn;
they are stepped in order until the env ends or a budget runs out. The group
enforces the turn budget (`max_turns`) and the per-trajectory action budget
(`max_actions_per_traj`), and adds the format penalty to turns that carried no
valid action.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
from ray.rllib.env.multi_agent_env import MultiAgentEnv

from envs import make_env
from envs.base import TextEnv


@dataclasses.dataclass(frozen=True)
class TurnBudget:
    """Limits of one trajectory.

    Args:
        max_turns: Model turns per trajectory (RAGEN: 5).
        max_actions_per_traj: Env actions per trajectory over all turns (RAGEN: 10).
        format_penalty: Reward added to a turn with no valid action (RAGEN: -0.1).
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


def agent_id(index: int) -> str:
    return f"traj_{index}"


class EnvGroup(MultiAgentEnv):
    """`group_size` envs of one kind, reset with one shared seed."""

    def __init__(
        self,
        env_name: str,
        env_config: dict[str, Any] | None = None,
        *,
        group_size: int,
        budget: TurnBudget,
    ) -> None:
        super().__init__()
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.envs: list[TextEnv] = [make_env(env_name, **(env_config or {})) for _ in range(group_size)]
        self.budget = budget
        self.agents = self.possible_agents = [agent_id(i) for i in range(group_size)]
        self.observation_spaces = {a: e.observation_space for a, e in zip(self.agents, self.envs)}
        self.action_spaces = {a: gym.spaces.Sequence(e.action_space) for a, e in zip(self.agents, self.envs)}
        self._turns: dict[str, int] = {}
        self._actions: dict[str, int] = {}
        self._done: dict[str, bool] = {}

    @property
    def template_env(self) -> TextEnv:
        """One member env (they share instructions and vocabulary)."""
        return self.envs[0]

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[dict[str, str], dict[str, dict]]:
        observations, infos = {}, {}
        for agent, env in zip(self.agents, self.envs):
            observations[agent], info = env.reset(seed=seed)
            infos[agent] = {**info, "seed": seed}
            self._turns[agent], self._actions[agent], self._done[agent] = 0, 0, False
        return observations, infos

    def step(self, action_dict: dict[str, Sequence[str]]):
        """Steps each agent through the actions of its turn.

        Returns RLlib's multi-agent 5-tuple; agents absent from `action_dict`
        do not step. `__all__` is set once every trajectory has ended.
        """
        obs, rewards, terminateds, truncateds, infos = {}, {}, {}, {}, {}
        for agent, actions in action_dict.items():
            if self._done[agent]:
                raise ValueError(f"{agent} already finished; it cannot act again")
            index = self.agents.index(agent)
            obs[agent], rewards[agent], term, trunc, infos[agent] = self._step_one(
                agent, self.envs[index], actions
            )
            terminateds[agent], truncateds[agent] = term, trunc
            self._done[agent] = term or trunc
        terminateds["__all__"] = truncateds["__all__"] = all(self._done.values())
        return obs, rewards, terminateds, truncateds, infos

    def _step_one(self, agent: str, env: TextEnv, actions: Sequence[str]):
        budget_left = self.budget.max_actions_per_traj - self._actions[agent]
        to_run = list(actions)[:budget_left]
        reward, terminated, truncated = 0.0, False, False
        info: dict[str, Any] = {"success": False}
        valid = 0
        observation = env.render_text()
        for action in to_run:
            observation, r, terminated, truncated, info = env.step(action)
            reward += r
            valid += int(info.get("action_is_valid", True))
            self._actions[agent] += 1
            if terminated or truncated:
                break
        if valid == 0:
            reward += self.budget.format_penalty
        self._turns[agent] += 1
        out_of_budget = (
            self._turns[agent] >= self.budget.max_turns
            or self._actions[agent] >= self.budget.max_actions_per_traj
        )
        info = {
            **info,
            "num_actions_executed": len(to_run),
            "num_valid_actions": valid,
            "turns_left": self.budget.max_turns - self._turns[agent],
            "actions_left": self.budget.max_actions_per_traj - self._actions[agent],
        }
        return observation, reward, terminated, truncated or (out_of_budget and not terminated), info
