"""Reading finished group episodes: success, valid turns, thoughts and the rollout statistics.

The one place that knows where a trajectory keeps these (the infos the env
runner writes each turn); the env runner's metrics, evaluation, the collapse
metrics and the trajectory page all read episodes through it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from rllib_ragen.rollout.reward_shaping import TASK_REWARD, shaping_statistics
from rllib_ragen.rollout.trajectory_record import response_text


def think_text(response: str) -> str | None:
    """The stripped text between `<think>` and `</think>` of a response, or None without one."""
    start, end = response.find("<think>"), response.find("</think>")
    if start < 0 or end < start:
        return None
    return response[start + len("<think>") : end].strip()


def succeeded(trajectory: Any) -> bool:
    """Whether a finished trajectory (one agent's `SingleAgentEpisode`) solved its task."""
    return bool(trajectory.get_infos()[-1].get("success", False))


def turn_validity(trajectory: Any) -> list[float]:
    """Per turn of a trajectory: 1.0 if its answer held at least one valid action, else 0.0."""
    return [float(i.get("num_valid_actions", 0) > 0) for i in trajectory.get_infos()[1:]]


def rollout_statistics(episodes: list[MultiAgentEpisode]) -> dict[str, float]:
    """Success, reward and in-group spread of a list of finished group episodes."""
    returns: list[float] = []
    successes: list[float] = []
    in_group_std: list[float] = []
    lengths: list[int] = []
    turns: list[int] = []
    valid_turns: list[float] = []
    well_formed: list[float] = []
    thoughts: list[str] = []
    task_returns: list[float] = []
    turn_infos: list[dict[str, Any]] = []
    for episode in episodes:
        group_returns = []
        for agent_episode in episode.agent_episodes.values():
            infos = agent_episode.get_infos()
            group_returns.append(float(sum(agent_episode.get_rewards())))
            successes.append(float(succeeded(agent_episode)))
            lengths.extend(len(a) for a in agent_episode.get_actions())
            turns.append(len(agent_episode))
            valid_turns.extend(turn_validity(agent_episode))
            well_formed.extend(float(bool(i.get("format_ok", False))) for i in infos[1:])
            thoughts.extend(t for t in (think_text(response_text(i)) for i in infos[1:]) if t is not None)
            # Episodes from before reward shaping (e.g. offline data) carry only task rewards.
            task_returns.append(sum(i.get(TASK_REWARD, r) for i, r in zip(infos[1:], agent_episode.get_rewards())))
            turn_infos.extend(infos[1:])
        returns.extend(group_returns)
        in_group_std.append(float(np.std(group_returns, ddof=1)) if len(group_returns) > 1 else 0.0)
    return {
        "episode_return_mean": float(np.mean(returns)),
        "episode_return_std": float(np.std(returns)),
        "success_rate": float(np.mean(successes)),
        "in_group_reward_std": float(np.mean(in_group_std)),
        "response_length_mean": float(np.mean(lengths)) if lengths else 0.0,
        "num_turns_mean": float(np.mean(turns)),
        "valid_action_ratio": float(np.mean(valid_turns)) if valid_turns else 0.0,
        # Answers in the <think>/<answer> format, whether or not their actions were valid.
        "well_formed_ratio": float(np.mean(well_formed)) if well_formed else 0.0,
        # Distinct thoughts among all turns' thoughts: near 0 when reasoning collapsed to one template.
        "distinct_thought_ratio": len(set(thoughts)) / len(thoughts) if thoughts else 0.0,
        "num_trajectories": float(len(returns)),
        # The env's reward alone; episode_return_mean includes the reasoning-aware shaping.
        "task_return_mean": float(np.mean(task_returns)),
        **shaping_statistics(turn_infos),
    }
