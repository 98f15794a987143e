"""Where a learned policy stands: success of scripted players on the evaluation seeds.

No model here: players that act by rule on the env itself, in the CPU
preset's variant of each env (its `env_config`, e.g. FrozenLake on
deterministic ice) under its turn budget, on the same fixed evaluation seeds
as `benchmarks/cpu_learning.py` (123 on; `--seed-start` for another set).
Each player's success has its 95% Wilson interval:

- `random, k a turn`: k valid actions a turn drawn uniformly (k = 1, 3, 5), and
  k drawn uniformly from 1..5 as the format warm start's random player does;
- `towards the goal` (FrozenLake): each action drawn among those that shorten
  the distance to the goal, seen at the start of the turn (open loop);
  `... around holes` also never steps into a hole next to it when another
  such action is safe: what a reader of the words render can do in one step;
- `expert`: the warm start's expert (`rllib_ragen.data.experts`): Sokoban's BFS
  plan, FrozenLake's planner (best open-loop turn on slippery ice).

A SmolLM2 success rate below `random` means the policy has not even learnt to
use its action budget; the expert row is the ceiling of the budget.

    python benchmarks/scripted_baselines.py --envs frozenlake,sokoban --episodes 4
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np

from envs.user_errors import CLIParser, front_door
from rllib_ragen.run.given_paths import output_file
from envs import make_env
from envs.base import DYNAMICS_STREAM, TextEnv
from envs.frozenlake_words import DIRECTIONS
from rllib_ragen.algorithm.presets import cpu_preset
from rllib_ragen.data.experts import TurnBudgetLeft, expert_for
from rllib_ragen.intervals import format_rate
from rllib_ragen.run.provenance import header

ROOT = Path(__file__).resolve().parents[1]

EVAL_SEED_START = 123  # StarPOConfig's eval_seed
# A player: (env, budget left, rng) -> the turn's actions.
Player = Callable[[TextEnv, TurnBudgetLeft, np.random.Generator], list[str]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="frozenlake,sokoban", help="comma-separated envs")
    parser.add_argument("--seeds", type=int, default=128, help="evaluation seeds, from 123 on")
    parser.add_argument("--episodes", type=int, default=4, help="episodes per seed (random players and slips vary)")
    parser.add_argument("--seed-start", type=int, default=EVAL_SEED_START, help="first evaluation seed")
    parser.add_argument("--output", type=output_file, help="also write the table, with its provenance, to this markdown file")
    return parser.parse_args(argv)


def random_player(count: int | None) -> Player:
    """`count` uniformly drawn valid actions a turn (None: the count itself drawn from 1..per_turn)."""
    def play(env: TextEnv, left: TurnBudgetLeft, rng: np.random.Generator) -> list[str]:
        k = int(rng.integers(1, left.per_turn + 1)) if count is None else count
        return [env.random_action(rng) for _ in range(min(k, left.per_turn, left.actions))]
    return play


def towards_goal(around_holes: bool) -> Player:
    """FrozenLake: moves drawn among those that shorten the distance to the goal (and skip adjacent holes)."""
    def play(env: TextEnv, left: TurnBudgetLeft, rng: np.random.Generator) -> list[str]:
        row, col = divmod(int(env.lake.s), env.lake.ncol)
        goal_row, goal_col = (int(x[0]) for x in np.nonzero(env.lake.desc == b"G"))
        helpful = {name: (row + dr, col + dc) for name, dr, dc in DIRECTIONS
                   if abs(goal_row - row - dr) + abs(goal_col - col - dc) < abs(goal_row - row) + abs(goal_col - col)}
        safe = [name for name, (r, c) in helpful.items() if env.lake.desc[r, c] != b"H"]
        choices = safe if around_holes and safe else list(helpful)
        return [str(rng.choice(choices)) for _ in range(min(left.per_turn, left.actions))]
    return play


def play_episode(env_name: str, seed: int, episode: int, player: Player | None, rng: np.random.Generator) -> bool:
    """One episode under the CPU preset's budget, its slips from stream `episode`; `player` None = the expert."""
    preset = cpu_preset(env_name)
    env = make_env(env_name, **(preset.env_config or {}))
    env.reset(seed=seed, options={DYNAMICS_STREAM: episode})
    expert = expert_for(env) if player is None else None
    used = 0
    for turn in range(preset.turn_budget.max_turns):
        left = TurnBudgetLeft(turns=preset.turn_budget.max_turns - turn, actions=preset.turn_budget.max_actions_per_traj - used,
                              per_turn=preset.protocol.max_actions_per_turn)
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
    per_turn = cpu_preset(env_name).protocol.max_actions_per_turn
    table: dict[str, Player | None] = {f"random, {k} a turn": random_player(k) for k in (1, 3, 5) if k <= per_turn}
    if per_turn > 1:
        table[f"random, 1..{per_turn} a turn (the format warm start's player)"] = random_player(None)
    if env_name == "frozenlake":
        table["towards the goal"] = towards_goal(around_holes=False)
        table["towards the goal, around holes"] = towards_goal(around_holes=True)
    table["expert"] = None
    return table


@front_door
def main(argv: list[str] | None = None) -> list[str]:
    args = parse_args(argv)
    provenance = header(ROOT, argv)
    rows = ["| env | variant | player | success [95%] |", "|---|---|---|---|"]
    for env_name in (e.strip() for e in args.envs.split(",")):
        preset = cpu_preset(env_name)
        variant = (f"{preset.env_config or 'RAGEN defaults'}, {preset.turn_budget.max_turns} turns x "
                   f"{preset.protocol.max_actions_per_turn} actions, {preset.turn_budget.max_actions_per_traj} in all")
        for label, player in players(env_name).items():
            rng = np.random.default_rng(0)
            successes = [float(play_episode(env_name, seed, episode, player, rng))
                         for seed in range(args.seed_start, args.seed_start + args.seeds)
                         for episode in range(args.episodes)]
            rows.append(f"| {env_name} | {variant} | {label} | {format_rate(successes)} |")
            print(rows[-1], flush=True)
    print("\n".join(rows))
    if args.output:
        Path(args.output).write_text(f"{provenance}\n" + "\n".join(rows) + "\n")
    return rows


if __name__ == "__main__":
    main()
