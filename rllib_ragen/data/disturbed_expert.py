"""An expert whose moves are sometimes disturbed: DART's demonstrations (Laskey et al., arXiv 1703.09327).

Behaviour cloning on an expert's own play shows only the states the expert reaches. A policy that errs
once leaves them and has no demonstration to follow there: most of the Sokoban tuned example's failures
are such states (a box pushed against a wall, then the same push again until the moves run out).

Here each turn, with probability `noise`, the env plays random valid moves instead of the expert's,
while the answer recorded for the turn stays the expert's. The demonstration then also visits states off
the expert's path, and every recorded answer is still the expert's best move from the state it was
shown. After a disturbance the expert plans afresh from where the env went, and plays that plan even
where the budget left cannot hold it (the budget then ends the episode): the answers stay right.

A recorded answer the env did not play contradicts the states after it, so only a prompt holding the
current state alone (`history_window=0`) may train on these demonstrations, and the world-model stage,
which learns the state after an answer, may not.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from envs.base import TextEnv
from rllib_ragen.data.experts import Turn, TurnBudgetLeft, expert_for


def check_noise(noise: float) -> None:
    """Raises ValueError unless `noise` is a probability below one (at one the expert would never be followed)."""
    if not 0.0 <= noise < 1.0:
        raise ValueError(f"the expert's noise must be in [0, 1), got {noise}")


class DisturbedExpert:
    """Plays one episode: the expert's answer every turn, with the env sometimes stepped by random moves.

    Args:
        env: The episode's env, reset (its state is read at every call).
        noise: Probability in [0, 1) that a turn's moves are replaced by random valid moves.
        rng: Draws the disturbances and their moves.
        max_states: Most search states the Sokoban solver visits per plan.
    """

    def __init__(self, env: TextEnv, *, noise: float, rng: np.random.Generator, max_states: int) -> None:
        check_noise(noise)
        self.noise = noise
        self.rng = rng
        self.max_states = max_states
        self.expert = expert_for(env, max_states=max_states)

    def __call__(self, env: TextEnv, left: TurnBudgetLeft) -> Turn | None:
        turn = self.expert(env, left)
        if turn is None or self.rng.random() >= self.noise:
            return turn
        played = [env.random_action(self.rng) for _ in turn.actions]
        # The env leaves the expert's plan: a fresh expert plans from wherever it goes.
        self.expert = expert_for(env, max_states=self.max_states, within_budget=False)
        return dataclasses.replace(turn, played=played)
