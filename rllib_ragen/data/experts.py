"""Expert players for demonstrations: the best answer of each turn, with a thought drawn from the state.

RAGEN's SFT path trains on solver trajectories (the paper: 74.6% on Sokoban
after SFT on BFS solutions). An expert answers one turn at a time, knowing the
turns and actions left:

- Sokoban: a breadth-first shortest plan, cut into turns; its thought names
  the whole remaining plan.
- FrozenLake: the turn sequence that maximises the probability of reaching the
  goal when each turn runs open-loop on slippery ice
  (`envs.frozenlake_planner`); its thought names where the player and the goal are.
- Corridor: one step towards the goal.
- TextArena's GuessTheNumber (`textarena:GuessTheNumber-v0` and its variants):
  the middle of the range the hints so far leave (binary search); its thought
  names that range.
- TextArena's TicTacToe (`textarena:TicTacToe-v0`): exact minimax
  (`envs.tictactoe_minimax`); its thought names the agent's mark and the free cells.

`expert_for(env)` gives a fresh expert for one episode; it returns None when
the episode cannot be demonstrated within the budget (a Sokoban room whose
shortest plan is longer), and the caller then drops it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from envs import make_env
from envs.base import TextEnv
from envs.corridor import CorridorEnv
from envs.frozenlake import FrozenLakeEnv
from envs.frozenlake_planner import best_turn
from envs.sokoban import SokobanEnv
from envs.sokoban_solver import DEFAULT_MAX_STATES, solve
from envs.textarena import AGENT, TextArenaEnv
from envs.tictactoe_minimax import mark_of, minimax_move

# Who can play a warm start's demonstrations: valid actions at random (the answer
# format only), or the env's expert below.
WARM_START_PLAYERS = ("random", "expert")
# Initial states a warm start plays by default. Random play writes 2 trajectories a state, the
# expert 1. Too few expert states leave SmolLM2 outside the answer format; the expert's many states,
# seen once by the top layers, start RL higher than fewer states seen twice by every weight, at the
# same cost (docs/results/warm_start_speed.md has the measurements).
WARM_START_STATES = {"random": 16, "expert": 192}
# Envs whose expert plays more states by default: the tuned examples' grid envs, where 384 states
# (twice the steps) start RL far higher than 192 (Sokoban 0.539 against 0.297, FrozenLake 0.734 against
# 0.492 on the evaluation seeds; docs/results/warm_start_variants.md, docs/results/tuned_example_runs.md).
EXPERT_STATES_BY_ENV = {"sokoban": 384, "frozenlake": 384}


def warm_start_states(player: str, env: str) -> int:
    """The initial states a warm start of `player` plays on `env` by default."""
    if player == "expert":
        return EXPERT_STATES_BY_ENV.get(env, WARM_START_STATES[player])
    return WARM_START_STATES[player]


@dataclasses.dataclass(frozen=True)
class Turn:
    """One demonstrated answer: the actions and the thought written before them.

    `played`: the moves the env plays instead of `actions` (a disturbed demonstration,
    `rllib_ragen.data.disturbed_expert`: the answer teaches `actions` from this state while
    the env goes elsewhere); None plays `actions`.
    """

    actions: list[str]
    thought: str
    played: list[str] | None = None


@dataclasses.dataclass(frozen=True)
class TurnBudgetLeft:
    """What the expert may still spend: turns, actions, and actions per turn."""

    turns: int
    actions: int
    per_turn: int


# Called with the env `expert_for` was given: the env parameter is typed Any because each expert takes
# its own TextEnv subclass (a Callable[[TextEnv, ...]] would have to accept every TextEnv).
Expert = Callable[[Any, TurnBudgetLeft], "Turn | None"]


def expert_for(env: TextEnv, *, max_states: int = DEFAULT_MAX_STATES, within_budget: bool = True) -> Expert:
    """A new expert for one episode of `env` (its state is read at every call).

    `within_budget` False: Sokoban's expert plays its shortest plan even when the budget left
    cannot hold it (the budget then cuts the episode short) instead of giving up; each answer is
    still the best move from its state. The other experts plan within the budget left either way.

    Raises:
        ValueError: no expert knows this kind of env.
    """
    if isinstance(env, SokobanEnv):
        return _SokobanExpert(max_states, within_budget=within_budget)
    if isinstance(env, FrozenLakeEnv):
        return _frozenlake_turn
    if isinstance(env, CorridorEnv):
        return _corridor_turn
    if isinstance(env, TextArenaEnv) and env.config.game.startswith("GuessTheNumber-"):
        return _guess_the_number_turn
    if isinstance(env, TextArenaEnv) and env.config.game.startswith("TicTacToe-"):
        return _tictactoe_turn
    raise ValueError(
        f"no expert player for {type(env).__name__}; experts exist for Sokoban, FrozenLake, Corridor and "
        "TextArena's GuessTheNumber and TicTacToe "
        "(use random play for a format-only warm start)"
    )


def has_expert(env_name: str) -> bool:
    """Whether the registered env `env_name` has an expert player."""
    try:
        expert_for(make_env(env_name))
    except ValueError:
        return False
    return True


class _SokobanExpert:
    """Plans once from the first state (BFS), then plays the plan a turn's worth at a time."""

    def __init__(self, max_states: int, *, within_budget: bool = True) -> None:
        self.max_states = max_states
        self.within_budget = within_budget
        self.plan: list[str] | None = None

    def __call__(self, env: SokobanEnv, left: TurnBudgetLeft) -> Turn | None:
        if self.plan is None:
            plan = solve(env, max_states=self.max_states)
            too_long = plan is not None and len(plan) > min(left.turns * left.per_turn, left.actions)
            if plan is None or (too_long and self.within_budget):
                return None
            self.plan = plan
        chunk, rest = self.plan[: left.per_turn], self.plan
        self.plan = self.plan[left.per_turn :]
        return Turn(chunk, f"Shortest plan from here: {', '.join(rest)}.")


def _frozenlake_turn(env: FrozenLakeEnv, left: TurnBudgetLeft) -> Turn:
    actions, _ = best_turn(env, turns_left=left.turns, actions_left=left.actions, max_actions_per_turn=left.per_turn)
    lake = env.lake
    assert lake is not None, "best_turn reads the lake, so the env was reset"
    row, col = divmod(int(lake.s), lake.ncol)
    goal_row, goal_col = divmod(int((lake.desc.flatten() == b"G").argmax()), lake.ncol)
    # Short: thought and answer must fit a CPU response budget of a few dozen tokens.
    down, right = goal_row - row, goal_col - col
    where = [f"{abs(down)} {'down' if down > 0 else 'up'}"] * bool(down)
    where += [f"{abs(right)} {'right' if right > 0 else 'left'}"] * bool(right)
    return Turn(actions, f"Goal: {' and '.join(where)}.")


def _corridor_turn(env: CorridorEnv, left: TurnBudgetLeft) -> Turn:
    action = env.optimal_action()
    return Turn([action], f"The goal is to my {action.lower()}.")


def _guess_the_number_turn(env: TextArenaEnv, left: TurnBudgetLeft) -> Turn:
    """Halves the range the game's hints leave (read from TextArena's own record of the guesses)."""
    game = env.game
    low, high = game.min_number, game.max_number
    for guess, hint in game.state.game_state["guess_history"]:
        if hint == "higher":
            low = max(low, guess + 1)
        else:
            high = min(high, guess - 1)
    return Turn([str((low + high) // 2)], f"The number is from {low} to {high}.")


def _tictactoe_turn(env: TextArenaEnv, left: TurnBudgetLeft) -> Turn:
    """The minimax cell for the agent's seat, read from TextArena's board."""
    return tictactoe_turn(env.game.state.game_state["board"], AGENT)


def tictactoe_turn(board: Sequence[Sequence[str]], player: int) -> Turn:
    """The minimax cell for `player` (0 plays O, 1 plays X: TextArena's marks) on TextArena's `board`; the thought
    names the player's mark and the free cells."""
    free = [str(i) for i, cell in enumerate(c for row in board for c in row) if not cell]
    return Turn([f"[{minimax_move(board, player)}]"], f"I play {mark_of(player)}; free cells: {', '.join(free)}.")
