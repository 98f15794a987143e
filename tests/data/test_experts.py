"""Expert players: FrozenLake's turn planner against hand-computed probabilities, Sokoban's plans, budgets."""

from __future__ import annotations

import pytest

from envs import make_env
from envs.corridor import CorridorEnv
from envs.frozenlake import FrozenLakeEnv
from envs.frozenlake_planner import best_turn
from envs.sokoban_solver import solve
from rllib_ragen.data.experts import TurnBudgetLeft, expert_for, has_expert


def _lake(desc, *, slippery=True) -> FrozenLakeEnv:
    env = FrozenLakeEnv(is_slippery=slippery)
    env.reset(seed=0, options={"desc": desc})
    return env


def test_slippery_row_success_probability_by_hand():
    """S F G in one row: Right advances w.p. 1/3 (the side slips hit the walls and stay).

    Three Rights in one turn reach G (2 cells away) w.p. P(Binomial(3, 1/3) >= 2) = 7/27.
    """
    actions, value = best_turn(_lake(["SFG"]), turns_left=1, actions_left=3, max_actions_per_turn=3)
    assert value == pytest.approx(7 / 27)
    # From S, Down also advances w.p. 1/3 (it slips Right w.p. 1/3, Left into the wall): a tie.
    assert len(actions) == 3 and actions[-1] in ("Right", "Down")


def test_seeing_the_state_between_turns_is_worth_more():
    """Three one-move turns can still only advance one cell each: the same 7/27; two turns of
    two moves re-plan after the first turn, which beats one blind turn of two moves (1/9)."""
    env = _lake(["SFG"])
    _, three_turns = best_turn(env, turns_left=3, actions_left=3, max_actions_per_turn=1)
    _, one_blind = best_turn(env, turns_left=1, actions_left=2, max_actions_per_turn=2)
    _, two_turns = best_turn(env, turns_left=2, actions_left=4, max_actions_per_turn=2)
    assert three_turns == pytest.approx(7 / 27)
    assert one_blind == pytest.approx(1 / 9)
    # Budget 4 moves: P(Binomial(4, 1/3) >= 2) = 1 - 16/81 - 32/81 = 33/81, whatever the turn split.
    assert two_turns == pytest.approx(33 / 81)


def test_non_slippery_plan_is_a_shortest_safe_path():
    env = _lake(["SFF", "HHF", "GFF"], slippery=False)
    actions, value = best_turn(env, turns_left=2, actions_left=10, max_actions_per_turn=3)
    assert value == pytest.approx(1.0)
    assert actions == ["Right", "Right", "Down"]  # then Down, Left, Left next turn


def test_unreachable_within_the_budget_has_value_zero():
    _, value = best_turn(_lake(["SFFG"], slippery=False), turns_left=1, actions_left=2, max_actions_per_turn=2)
    assert value == 0.0


def test_sokoban_expert_solves_rooms_within_the_budget_and_gives_up_otherwise():
    env = make_env("sokoban")
    solved = 0
    for seed in range(6):
        env.reset(seed=seed)
        expert, left = expert_for(env), TurnBudgetLeft(turns=5, actions=10, per_turn=3)
        turn = expert(env, left)
        if turn is None:
            continue
        for _ in range(5):
            assert 1 <= len(turn.actions) <= 3 and turn.thought.startswith("Shortest plan from here:")
            results = [env.step(a) for a in turn.actions]
            if results[-1][2]:
                solved += results[-1][4]["success"]
                break
            turn = expert(env, left)
    assert solved >= 3
    longer = next(seed for seed in range(50) if _plan_length(seed) > 1)
    env.reset(seed=longer)
    assert expert_for(env)(env, TurnBudgetLeft(turns=1, actions=1, per_turn=1)) is None


def _plan_length(seed: int) -> int:
    env = make_env("sokoban")
    env.reset(seed=seed)
    return len(solve(env) or [])


def test_corridor_expert_walks_to_the_goal():
    env = CorridorEnv(distance=3)
    env.reset(seed=4)
    expert = expert_for(env)
    outcome = [env.step(expert(env, TurnBudgetLeft(3, 3, 1)).actions[0]) for _ in range(3)][-1]
    assert outcome[4]["success"]


def test_envs_without_an_expert_are_named():
    assert has_expert("frozenlake") and has_expert("larger_sokoban") and not has_expert("bandit")
    with pytest.raises(ValueError, match="no expert player for BanditEnv"):
        expert_for(make_env("bandit"))
