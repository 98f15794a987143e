"""Hand-made trajectories: scripted answers played through a real `EnvGroup` on hand-made
FrozenLake maps and Sokoban rooms, recorded in a `MultiAgentEpisode` the way
`LLMEnvRunner` records one (the group's infos, the response text, the parsed actions).

The envs are named by import path (`scripted_episodes:HandMadeLake`), so `make_env`
builds them like any user env."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from envs.frozenlake import FrozenLakeEnv
from envs.sokoban import SokobanEnv
from rllib_ragen.rollout.env_group import EnvGroup, TurnBudgetSettings, agent_id
from rllib_ragen.rollout.trajectory_record import TurnRecord, turn_info

# Start (0,0); a hole right of the start's right neighbour; the goal bottom right.
LAKE = ("SFH", "FFF", "HFG")
# The box at (2,2), its target at (3,3), the player at (4,1).
ROOM = "######\n#____#\n#_X__#\n#__O_#\n#P___#\n######"
AGENT = agent_id(0)


class HandMadeLake(FrozenLakeEnv):
    """FrozenLake on `LAKE`, not slippery."""

    def __init__(self, **overrides: Any) -> None:
        super().__init__(**{"is_slippery": False, **overrides})

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> dict[str, Any]:
        return super()._reset(rng, {"desc": LAKE, **options})


class HandMadeRoom(SokobanEnv):
    """Sokoban in `ROOM`."""

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> dict[str, Any]:
        return super()._reset(rng, {"room": ROOM, **options})


class BrokenLake(HandMadeLake):
    """`HandMadeLake` whose step raises on "Up": an env failing mid-trajectory."""

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        if action == "Up":
            raise RuntimeError("the ice cracked")
        return super()._step(action)


LAKE_ENV = "scripted_episodes:HandMadeLake"
ROOM_ENV = "scripted_episodes:HandMadeRoom"
BROKEN_LAKE_ENV = "scripted_episodes:BrokenLake"


def scripted_episode(
    env: str,
    answers: Sequence[Sequence[str]],
    *,
    seed: int = 0,
    env_config: dict | None = None,
    max_turns: int = 5,
) -> MultiAgentEpisode:
    """One trajectory answering turn t with the actions `answers[t]` until the env or the turns end it."""
    group = EnvGroup(
        env, env_config, group_size=1, budget=TurnBudgetSettings(max_turns=max_turns, max_actions_per_traj=20)
    )
    observations, infos = group.reset(seed=seed)
    episode = MultiAgentEpisode()
    episode.add_env_reset(observations=observations, infos=infos)
    for actions in answers:
        response = f"<think>try {' '.join(actions)}</think><answer>{' || '.join(actions)}</answer>"
        observations, rewards, terminateds, truncateds, infos = group.step({AGENT: list(actions)})
        infos[AGENT].update({**turn_info(TurnRecord([], [], [], response)), "parsed_actions": list(actions)})
        episode.add_env_step(
            observations=observations,
            actions={AGENT: np.array([1, 2])},
            rewards=rewards,
            infos=infos,
            terminateds=terminateds,
            truncateds=truncateds,
        )
        if episode.is_done:
            return episode
    raise ValueError(f"the answers {answers} ran out before the episode ended")
