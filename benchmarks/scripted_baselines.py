"""Where a learned policy stands: success of scripted players on the evaluation seeds.

No model here: players that act by rule on the env itself, under the CPU
preset's turn budget (3 turns, up to 5 actions a turn, 10 a trajectory), on
the same fixed evaluation seeds as `benchmarks/cpu_learning.py` (123 on). Each
player's success has its 95% Wilson interval:

- `random, k a turn`: k valid actions a turn drawn uniformly (k = 1, 3, 5), and
  k drawn uniformly from 1..5 as the format warm start's random player does;
- `towards the goal, 5 a turn` (FrozenLake): each action drawn among those that
  shorten the distance to the goal, seen at the start of the turn (open loop);
- `expert`: the warm start's expert (`rllib_ragen.data.experts`): Sokoban's BFS
  plan, FrozenLake's planner (best open-loop turn on slippery ice).

A SmolLM2 success rate below `random` means the policy has not even learnt to
use its action budget; the expert row is the ceiling of the budget.

    python benchmarks/scripted_baselines.py --envs frozenlake,sokoban --episodes 4
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs import make_env
from envs.base import DYNAMICS_STREAM, TextEnv
from rllib_ragen.data.experts import TurnBudgetLeft, expert_for
from rllib_ragen.intervals import format_rate
from rllib_ragen.algorithm.presets import ENV_BUDGETS

EVAL_SEED_START = 123  # StarPOConfig's eval_seed
MAX_TURNS = 3  # the CPU preset's cap
# A player: (env, budget left, rng) -> the turn's actions.
Player = Callable[[TextEnv, TurnBudgetLeft, np.random.Generator], list[str]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="frozenlake,sokoban", help="comma-separated envs")
    parser.add_argument("--seeds", type=int, default=128, help="evaluation seeds, from 123 on")
    parser.add_argument("--episodes", type=int, default=4, help="episodes per seed (random players and slips vary)")
    return parser.parse_args(argv)


def random_player(count: int | None) -> Player:
    """`count` uniformly drawn valid actions a turn (None: the count itself drawn from 1..per_turn)."""
    def play(env: TextEnv, left: TurnBudgetLeft, rng: np.random.Generator) -> list[str]:
        k = int(rng.integers(1, left.per_turn + 1)) if count is None else count
        return [env.random_action(rng) for _ in range(min(k, left.per_turn, left.actions))]
    return play


def towards_goal(env: TextEnv, left: TurnBudgetLeft, rng: np.random.Generator) -> list[str]:
    """FrozenLake: up to 5 moves drawn among those that shorten the distance to the goal."""
    row, col = divmod(int(env.lake.s), env.lake.ncol)
    goal_row, goal_col = (int(x[0]) for x in np.nonzero(env.lake.desc == b"G"))
    helpful = ((["Down"] if goal_row > row else []) + (["Up"] if goal_row < row else [])
               + (["Right"] if goal_col > col else []) + (["Left"] if goal_col < col else []))
    return [str(rng.choice(helpful)) for _ in range(min(left.per_turn, left.actions))]


def play_episode(env_name: str, seed: int, episode: int, player: Player | None, rng: np.random.Generator) -> bool:
    """One episode under the CPU budget, its slips from stream `episode`; `player` None = the env's expert."""
    budget = ENV_BUDGETS[env_name]
    env = make_env(env_name)
    env.reset(seed=seed, options={DYNAMICS_STREAM: episode})
    expert = expert_for(env) if player is None else None
    used = 0
    for turn in range(MAX_TURNS):
        left = TurnBudgetLeft(turns=MAX_TURNS - turn, actions=budget["max_actions_per_traj"] - used,
                              per_turn=budget["max_actions_per_turn"])
        if left.actions <= 0:
            break
        if expert is not None:
            answer = expert(env, left)
            actions = [] if answer is None else answer.actions
        else:
            actions = player(env, left, rng)
        for action in actions:
            _, _, terminated, truncated, info = env.step(action)
            used += 1
            if terminated or truncated:
                return bool(info.get("success", False))
    return False


def players(env_name: str) -> dict[str, Player | None]:
    table: dict[str, Player | None] = {f"random, {k} a turn": random_player(k) for k in (1, 3, 5)}
    table["random, 1..5 a turn (the format warm start's player)"] = random_player(None)
    if env_name == "frozenlake":
        table["towards the goal, 5 a turn"] = towards_goal
    table["expert"] = None
    return table


def main(argv: list[str] | None = None) -> list[str]:
    args = parse_args(argv)
    rows = ["| env | player | success [95%] |", "|---|---|---|"]
    for env_name in (e.strip() for e in args.envs.split(",")):
        for label, player in players(env_name).items():
            rng = np.random.default_rng(0)
            successes = [float(play_episode(env_name, seed, episode, player, rng))
                         for seed in range(EVAL_SEED_START, EVAL_SEED_START + args.seeds)
                         for episode in range(args.episodes)]
            rows.append(f"| {env_name} | {label} | {format_rate(successes)} |")
            print(rows[-1], flush=True)
    print("\n".join(rows))
    return rows


if __name__ == "__main__":
    main()
