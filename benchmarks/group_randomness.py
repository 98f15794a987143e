"""Is a critic-free advantage biased when a group's members share the env's randomness?

For each env and each `group_randomness` setting this plays `--groups` groups
of `--group-size` through `EnvGroup` with uniformly random actions (the same
picks and first moves under both settings), then computes GRPO's advantages (per group) and
BRPO's (per batch of `--groups-per-batch` groups, an iteration of the Bandit
CPU preset) with the library's estimators, and prints the mean advantage of
the trajectories that took the better and the worse choice, with standard
errors that treat each group as one cluster. An unbiased
estimator gives the better choice a positive mean and the worse a negative one.

- Bandit (`bandit`, RAGEN-2's): better = the high-risk arm (mean payout 0.25
  against 0.1).
- FrozenLake: one action per turn, at most `--max-actions` actions (RAGEN's
  10). Better/worse = the first action with the highest/lowest exact chance of
  reaching the goal when the remaining actions are random (computed from the
  map's transition table); maps where all first actions are equally good are
  left out.

CPU only, no model; seconds to run:

    python benchmarks/group_randomness.py
    python benchmarks/group_randomness.py --groups 500 --envs bandit_phoenix_dragon
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np
import torch

from envs.bandit import BanditEnv
from envs.frozenlake import ACTIONS as LAKE_ACTIONS
from envs.frozenlake import FrozenLakeEnv
from rllib_ragen.rollout.env_group import GROUP_RANDOMNESS, EnvGroup, TurnBudgetSettings
from rllib_ragen.training.advantages import brpo, grpo

BETTER, WORSE, OTHER = "better", "worse", "other"


@dataclasses.dataclass
class Played:
    """One trajectory per entry: its score, group and whether it took the better or worse choice."""

    scores: list[float] = dataclasses.field(default_factory=list)
    group_ids: list[int] = dataclasses.field(default_factory=list)
    labels: list[str] = dataclasses.field(default_factory=list)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="bandit,frozenlake", help="comma-separated: Bandit-family envs, frozenlake")
    parser.add_argument("--groups", type=int, default=2000, help="groups per env and setting")
    parser.add_argument("--group-size", type=int, default=8, help="trajectories per group")
    parser.add_argument("--groups-per-batch", type=int, default=8, help="groups in one BRPO batch")
    parser.add_argument("--max-actions", type=int, default=10, help="FrozenLake: actions per trajectory")
    parser.add_argument("--seed-start", type=int, default=10_000, help="first group seed (StarPO's train_seed_start)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the random actions")
    args = parser.parse_args(argv)
    if args.groups < 1 or args.group_size < 2 or args.groups_per_batch < 1 or args.max_actions < 1:
        parser.error("need --groups >= 1, --group-size >= 2, --groups-per-batch >= 1, --max-actions >= 1")
    return args


def play_bandit(env: str, randomness: str, args: argparse.Namespace) -> Played:
    """Each member pulls a uniformly random arm of its state's pair once."""
    played = Played()
    group = EnvGroup(env, group_size=args.group_size, budget=TurnBudgetSettings(max_turns=1), group_randomness=randomness)
    if not isinstance(group.template_env, BanditEnv):
        raise SystemExit(f"--envs: {env!r} is neither a Bandit env nor frozenlake")
    for index in range(args.groups):
        group.reset(seed=args.seed_start + index)
        rng = np.random.default_rng((args.seed, index))
        picks = {agent: str(rng.choice(e.available_actions)) for agent, e in zip(group.agents, group.envs)}
        _, rewards, *_ = group.step({agent: [arm] for agent, arm in picks.items()})
        for agent, e in zip(group.agents, group.envs):
            played.scores.append(rewards[agent])
            played.group_ids.append(index)
            played.labels.append(BETTER if picks[agent] == e.pair[1] else WORSE)
    return played


def play_frozenlake(randomness: str, args: argparse.Namespace) -> Played:
    """Each member walks at random, one action a turn; its first action is labelled by its exact value."""
    played = Played()
    budget = TurnBudgetSettings(max_turns=args.max_actions, max_actions_per_traj=args.max_actions)
    group = EnvGroup("frozenlake", group_size=args.group_size, budget=budget, group_randomness=randomness)
    for index in range(args.groups):
        group.reset(seed=args.seed_start + index)
        values = first_action_values(group.envs[0], args.max_actions)
        rng = np.random.default_rng((args.seed, index))  # the same first actions under both settings
        scores, live = dict.fromkeys(group.agents, 0.0), list(group.agents)
        first: dict[str, str] = {}
        while live:
            actions = {agent: [str(rng.choice(LAKE_ACTIONS))] for agent in live}
            for agent, (action,) in actions.items():
                first.setdefault(agent, action)
            _, rewards, terminateds, truncateds, _ = group.step(actions)
            for agent, reward in rewards.items():
                scores[agent] += reward
            live = [agent for agent in live if not (terminateds[agent] or truncateds[agent])]
        for agent in group.agents:
            played.scores.append(scores[agent])
            played.group_ids.append(index)
            played.labels.append(_label(values, LAKE_ACTIONS.index(first[agent])))
    return played


def first_action_values(env: FrozenLakeEnv, steps: int) -> np.ndarray:
    """[4] chance of reaching the goal within `steps` actions, per first action, the rest uniformly random."""
    lake = env.lake
    n_states, n_actions = lake.observation_space.n, lake.action_space.n
    reach = np.zeros(n_states)  # chance with k random actions left, k = 0 first
    for _ in range(steps - 1):
        q = np.array([[_expected(lake.P[s][a], reach) for a in range(n_actions)] for s in range(n_states)])
        reach = q.mean(axis=1)
    start = int(lake.s)
    return np.array([_expected(lake.P[start][a], reach) for a in range(n_actions)])


def _expected(transitions: list[tuple[float, int, float, bool]], reach: np.ndarray) -> float:
    """Chance of the goal after one transition: 1 on reward, 0 on another end, else `reach` of the next state."""
    return sum(p * (1.0 if r > 0 else 0.0 if done else reach[s]) for p, s, r, done in transitions)


def _label(values: np.ndarray, action: int) -> str:
    if values.max() - values.min() < 1e-12:
        return OTHER
    if values[action] == values.max():
        return BETTER
    return WORSE if values[action] == values.min() else OTHER


def mean_advantages(played: Played, estimator: str, groups_per_batch: int) -> dict[str, object]:
    """(mean, SE) of the per-trajectory advantage of the better and the worse choices under `estimator`, and counts."""
    scores = torch.tensor(played.scores, dtype=torch.float64)
    group_ids = torch.tensor(played.group_ids)
    mask = torch.ones(len(scores), 1)
    if estimator == "grpo":
        advantages = grpo(scores, group_ids, mask)[0][:, 0]
    else:
        batch_ids = group_ids // groups_per_batch
        advantages = torch.empty(len(scores))
        for batch in batch_ids.unique():
            rows = batch_ids == batch
            advantages[rows] = brpo(scores[rows], mask[rows])[0][:, 0]
    labels, groups = np.array(played.labels), np.array(played.group_ids)
    return {label: clustered_mean(advantages.numpy(), groups, labels == label) for label in (BETTER, WORSE)} | {
        f"n_{label}": int((labels == label).sum()) for label in (BETTER, WORSE)
    }


def clustered_mean(values: np.ndarray, groups: np.ndarray, rows: np.ndarray) -> tuple[float, float]:
    """Mean of `values[rows]` and its standard error with groups as clusters (members of a group are correlated).

    SE = sqrt(sum_g (S_g - mean * N_g)^2) / N, S_g and N_g the sum and count of group g's selected rows.
    """
    mean = float(values[rows].mean())
    sums = np.bincount(groups[rows], weights=values[rows])
    counts = np.bincount(groups[rows])
    return mean, float(np.sqrt(((sums - mean * counts) ** 2).sum()) / rows.sum())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    print(
        "| env | estimator | group randomness | mean advantage, better (± SE) | mean advantage, worse (± SE) | "
        "trajectories better / worse |"
    )
    print("|---|---|---|---|---|---|")
    for env in (name.strip() for name in args.envs.split(",")):
        for randomness in GROUP_RANDOMNESS:
            began = time.perf_counter()
            played = play_frozenlake(randomness, args) if env == "frozenlake" else play_bandit(env, randomness, args)
            print(
                f"  ({env}, {randomness}: {args.groups} groups played in {time.perf_counter() - began:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
            for estimator in ("grpo", "brpo"):
                m = mean_advantages(played, estimator, args.groups_per_batch)
                better, worse = (f"{mean:+.3f} ± {se:.3f}" for mean, se in (m[BETTER], m[WORSE]))
                print(
                    f"| {env} | {estimator} | {randomness} | {better} | {worse} | {m['n_better']} / {m['n_worse']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
