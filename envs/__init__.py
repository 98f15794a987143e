"""Text environments for LLM agents: Sokoban, FrozenLake, Bandit, Countdown, Corridor.

`make_env(name, **config)` builds a registered env (or one given as
`"module:Class"`); `register_env` adds yours.
"""

from envs.bandit import BanditConfig, BanditEnv
from envs.base import TextEnv
from envs.corridor import CorridorConfig, CorridorEnv
from envs.countdown import CountdownConfig, CountdownEnv, score_equation
from envs.frozenlake import FrozenLakeConfig, FrozenLakeEnv
from envs.registry import check_env, check_env_config, list_envs, make_env, register_env
from envs.sokoban import SokobanConfig, SokobanEnv
from envs.sokoban_room import Room, parse_room, render_room
from envs.sokoban_solver import solve

__all__ = [
    "BanditConfig",
    "BanditEnv",
    "CorridorConfig",
    "CorridorEnv",
    "CountdownConfig",
    "CountdownEnv",
    "FrozenLakeConfig",
    "FrozenLakeEnv",
    "Room",
    "SokobanConfig",
    "SokobanEnv",
    "TextEnv",
    "check_env",
    "check_env_config",
    "list_envs",
    "make_env",
    "parse_room",
    "register_env",
    "render_room",
    "score_equation",
    "solve",
]
