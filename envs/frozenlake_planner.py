"""Optimal turn plans for FrozenLake under StarPO's turn structure (for demonstrations).

A StarPO turn executes its actions open-loop: the model sees the state only
between turns. So the best policy picks, at each turn, the action *sequence*
(1..`max_actions_per_turn` moves) that maximises the probability of reaching
the goal with the turns and actions left, planning the later turns from the
states the slips may lead to. Backward induction over (turns left, actions
left) on the map's exact transition matrices (slips included) gives it: the
success probability of a sequence is a product of 16x16 matrices applied to
the next turn's values. Holes and the goal absorb.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
from gymnasium.spaces import Discrete

from envs.frozenlake import ACTIONS, FrozenLakeEnv


def transition_matrices(env: FrozenLakeEnv) -> np.ndarray:
    """[A, S, S] probabilities of moving s -> s' under each action; holes and the goal absorb."""
    lake = _lake(env)
    space = lake.observation_space
    assert isinstance(space, Discrete), f"FrozenLake's states are Discrete, got {space}"
    n_states = int(space.n)
    matrices = np.zeros((len(ACTIONS), n_states, n_states))
    for state in range(n_states):
        for action in range(len(ACTIONS)):
            for probability, next_state, _, _ in lake.P[state][action]:
                matrices[action, state, next_state] += probability
    absorbing = [s for s in range(n_states) if lake.desc.flat[s] in (b"H", b"G")]
    matrices[:, absorbing, :] = 0.0
    matrices[:, absorbing, absorbing] = 1.0
    return matrices


def best_turn(
    env: FrozenLakeEnv, *, turns_left: int, actions_left: int, max_actions_per_turn: int
) -> tuple[list[str], float]:
    """The action sequence to play now from the env's state, and its success probability."""
    plans = _Plans(transition_matrices(env), _goal_vector(env), max_actions_per_turn)
    sequence, value = plans.best(int(_lake(env).s), turns_left, actions_left)
    return [ACTIONS[a] for a in sequence], value


def _lake(env: FrozenLakeEnv) -> GymFrozenLake:
    assert env.lake is not None, "the env has no lake before reset()"
    return env.lake


def _goal_vector(env: FrozenLakeEnv) -> np.ndarray:
    return (_lake(env).desc.flatten() == b"G").astype(float)


class _Plans:
    """Backward induction over (turns left, actions left), memoised per instance."""

    def __init__(self, matrices: np.ndarray, goal: np.ndarray, max_actions_per_turn: int) -> None:
        self.goal = goal
        self.sequences: list[tuple[int, ...]] = []
        products = []
        for length in range(1, max_actions_per_turn + 1):
            for sequence in itertools.product(range(len(matrices)), repeat=length):
                self.sequences.append(sequence)
                products.append(functools.reduce(np.matmul, (matrices[a] for a in sequence)))
        self.products = np.stack(products)  # [N, S, S]
        self.lengths = np.array([len(s) for s in self.sequences])
        # Per instance: an lru_cache on the method would be one class-wide cache keeping every instance alive.
        self._values: dict[tuple[int, int], np.ndarray] = {}

    def values(self, turns_left: int, actions_left: int) -> np.ndarray:
        """[S] success probability of playing optimally from each state."""
        key = (turns_left, actions_left)
        if key not in self._values:
            if turns_left == 0 or actions_left == 0:
                self._values[key] = self.goal
            else:
                self._values[key] = self._scores(turns_left, actions_left).max(axis=0)
        return self._values[key]

    def _scores(self, turns_left: int, actions_left: int) -> np.ndarray:
        """[N, S] success probability of opening with each sequence (-1 where it exceeds the budget)."""
        scores = np.full((len(self.sequences), len(self.goal)), -1.0)
        for length in set(self.lengths.tolist()):
            if length <= actions_left:
                rows = self.lengths == length
                scores[rows] = self.products[rows] @ self.values(turns_left - 1, actions_left - length)
        return scores

    def best(self, state: int, turns_left: int, actions_left: int) -> tuple[tuple[int, ...], float]:
        """The shortest among the best sequences from `state`, and its value."""
        scores = self._scores(turns_left, actions_left)[:, state]
        best = scores.max()
        # Among (near-)ties prefer fewer moves: nothing is gained by moving more.
        index = int(np.flatnonzero(scores >= best - 1e-9)[0])
        return self.sequences[index], float(best)
