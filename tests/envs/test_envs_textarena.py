"""TextArena games through the adapter (`envs.textarena`): real games played to their end by
scripted players that read the game's own observations, invalid moves, rewards, the random
opponent, per-seed determinism with several games in one process, and the errors."""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import require_extra

require_extra("textarena", "cpu,test,textarena")

import nltk  # noqa: E402 (a need of textarena's)

from envs import check_env, make_env  # noqa: E402
from envs.base import DYNAMICS_STREAM  # noqa: E402
from envs.textarena import game_action  # noqa: E402
from envs.textarena_isolation import GameNeedsDownload  # noqa: E402

Player = Callable[[str], str]  # the latest observation -> the next answer


def play(game: str, player: Player, *, seed: int = 0, max_moves: int = 300) -> tuple[float, dict, list[str]]:
    """Plays `game` with `player` until the game ends; returns the last reward and info, and every observation."""
    env = make_env(f"textarena:{game}")
    observation, _ = env.reset(seed=seed)
    seen = [observation]
    for _ in range(max_moves):
        observation, reward, terminated, truncated, info = env.step(player(observation))
        seen.append(observation)
        assert not truncated, "the adapter never truncates: the game or the caller's budget ends an episode"
        if terminated:
            return reward, info, seen
    raise AssertionError(f"{game} did not end within {max_moves} moves")


def guess_the_number() -> Player:
    """Binary search on the game's 'higher'/'lower' hints."""
    bounds = [1, 20]
    last: list[int] = []

    def move(observation: str) -> str:
        if last and "higher" in observation:
            bounds[0] = last[-1] + 1
        elif last and "lower" in observation:
            bounds[1] = last[-1] - 1
        last.append((bounds[0] + bounds[1]) // 2)
        return str(last[-1])

    return move


def tower_of_hanoi(disks: int = 3) -> Player:
    def moves(n: int, source: str, target: str, spare: str) -> list[str]:
        if n == 0:
            return []
        return [*moves(n - 1, source, spare, target), f"{source} {target}", *moves(n - 1, spare, target, source)]

    plan = iter(moves(disks, "A", "C", "B"))
    return lambda observation: next(plan)


def three_card_monte(observation: str) -> str:
    """Follows the ball through the shuffles the game lists."""
    cups = re.search(r"Ball starts: (.*)", observation)
    assert cups is not None, observation
    ball = cups.group(1).split().index("[X]")
    for a, b in re.findall(r"swapped cups (\d) and (\d)", observation):
        a, b = int(a), int(b)
        ball = b if ball == a else a if ball == b else ball
    return str(ball)


def frozen_lake() -> Player:
    """A shortest safe path on the board of the first observation (breadth-first search)."""
    plan: list[str] = []

    def move(observation: str) -> str:
        if not plan:
            grid = [[c.strip() for c in line.split("|")[1:-1]] for line in observation.splitlines() if line[:1] == "|"]
            plan.extend(_shortest_path(grid))
        return plan.pop(0)

    return move


def _shortest_path(grid: list[list[str]]) -> list[str]:
    steps = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
    start = next((r, c) for r, row in enumerate(grid) for c, cell in enumerate(row) if cell == "P")
    paths, queue = {start: []}, deque([start])
    while queue:
        r, c = queue.popleft()
        if grid[r][c] == "G":
            return paths[(r, c)]
        for name, (dr, dc) in steps.items():
            nr, nc = r + dr, c + dc
            if 0 <= nr < len(grid) and 0 <= nc < len(grid[0]) and grid[nr][nc] != "H" and (nr, nc) not in paths:
                paths[(nr, nc)] = [*paths[(r, c)], name]
                queue.append((nr, nc))
    raise AssertionError(f"no path to the goal in {grid}")


def mastermind() -> Player:
    """Always guesses a code consistent with every feedback so far (wins well within the 20 turns)."""
    candidates = list(itertools.permutations(range(1, 7), 4))
    guesses: list[tuple[int, ...]] = []

    def move(observation: str) -> str:
        feedback = re.search(r"(\d+) black peg\(s\), (\d+) white peg\(s\)", observation)
        if guesses and feedback:
            pegs = (int(feedback.group(1)), int(feedback.group(2)))
            candidates[:] = [c for c in candidates if _pegs(guesses[-1], c) == pegs]
        guesses.append(candidates[0])
        return " ".join(map(str, candidates[0]))

    return move


def _pegs(guess: tuple[int, ...], code: tuple[int, ...]) -> tuple[int, int]:
    black = sum(g == c for g, c in zip(guess, code))
    return black, len(set(guess) & set(code)) - black


def bandit() -> Player:
    """Presses each button in turn while the game lets it explore, then names the best average."""
    buttons = ["red", "blue", "green", "yellow", "purple"]
    pressed: list[str] = []
    payouts: dict[str, list[float]] = {b: [] for b in buttons}

    def move(observation: str) -> str:
        paid = re.search(r"pressed the (\w+) button and received a reward of (\d+(?:\.\d+)?)", observation)
        if paid:
            payouts[paid.group(1)].append(float(paid.group(2)))
        if "exhausted your budget" in observation:
            return max(buttons, key=lambda b: np.mean(payouts[b]))
        pressed.append(buttons[len(pressed) % len(buttons)])
        return pressed[-1]

    return move


def cycle(*moves: str) -> Player:
    answers = itertools.cycle(moves)
    return lambda observation: next(answers)


def test_guess_the_number_multi_turn_feedback_is_won_with_a_win_reward():
    reward, info, seen = play("GuessTheNumber-v0", guess_the_number())
    assert "between 1 and 20" in seen[0]  # the game's own rules come with the first state
    assert any("The target number is higher." in o or "The target number is lower." in o for o in seen[1:])
    assert reward == 1.0 and info["success"] and info["action_is_valid"]
    assert "Game over: Congratulations" in seen[-1]


def test_tower_of_hanoi_planning_is_won_in_the_optimal_seven_moves():
    reward, info, seen = play("TowerOfHanoi-v0", tower_of_hanoi())
    assert len(seen) == 1 + 7 and reward == 1.0 and info["success"]
    assert "C: [3, 2, 1]" in seen[-1]


def test_three_card_monte_stochastic_shuffles_are_followed_to_a_win_on_several_seeds():
    starts = set()
    for seed in range(4):
        reward, info, seen = play("ThreeCardMonte-v0", three_card_monte, seed=seed)
        assert reward == 1.0 and info["success"], seen
        starts.add(seen[0])
    assert len(starts) > 1  # the shuffles are drawn per seed


def test_frozen_lake_is_won_along_the_shortest_safe_path():
    reward, info, _ = play("FrozenLake-v0", frozen_lake())
    assert reward == 1.0 and info["success"]


def test_mastermind_feedback_narrows_the_code_to_a_win():
    reward, info, seen = play("Mastermind-v0", mastermind())
    assert reward == 1.0 and info["success"] and len(seen) - 1 <= 8


def test_blackjack_reward_is_the_games_share_of_hands_won():
    reward, info, seen = play("Blackjack-v0", cycle("Stand"))
    wins = re.search(r"Wins: (\d+), Losses: (\d+), Draws: (\d+)", seen[-1])
    assert wins is not None and len(seen) - 1 == 5  # five hands, one stand each
    assert reward == pytest.approx(int(wins.group(1)) / 5)
    assert info["success"] is (reward >= 1.0)


def test_bandit_stochastic_payouts_end_with_the_final_choice():
    reward, info, seen = play("Bandit-v0", bandit())
    assert len(seen) - 1 == 21 and "Game over" in seen[-1]
    assert info["success"] is (reward == 1.0) and 0.0 <= reward <= 1.0


def test_secretary_forced_to_the_last_value_ends_after_five_draws():
    reward, info, seen = play("Secretary-v0", cycle("continue"))
    assert len(seen) - 1 == 5 and reward in (0.0, 1.0) and info["success"] is (reward == 1.0)


def test_lights_out_ends_at_the_games_turn_limit_with_its_completion_reward():
    reward, info, seen = play("LightsOut-v0", cycle("0 0"))
    assert len(seen) - 1 == 20 and not info["success"] and 0.0 <= reward < 1.0


def test_2048_ends_when_the_board_is_stuck_or_the_tile_reached():
    reward, info, seen = play("2048-v0-ultra-easy", cycle("Up", "Left", "Down", "Right"))
    assert "Game over" in seen[-1] and info["success"] is (reward >= 1.0)


def test_an_invalid_move_changes_nothing_is_explained_and_never_ends_the_game():
    env = make_env("textarena:GuessTheNumber-v0")
    env.reset(seed=0)
    for answer in ("abc", "[99]", "0", "twenty"):  # TextArena would end the game at the second
        observation, reward, terminated, _, info = env.step(answer)
        assert not info["action_is_valid"] and reward == 0.0 and not terminated
        assert "invalid move" in observation
    _, _, terminated, _, info = env.step("10")
    assert info["action_is_valid"] and info["game_action"] == "[10]"


def test_answers_map_to_bracketed_moves():
    assert game_action(" 5 ") == "[5]" and game_action("A C") == "[A C]"
    assert game_action("[Hit]") == "[Hit]" and game_action("col [3]") == "col [3]"


def test_an_invalid_turn_gets_the_format_penalty_in_an_env_group():
    from rllib_ragen.rollout.env_group import EnvGroup, TurnBudgetSettings

    group = EnvGroup("textarena:GuessTheNumber-v0", group_size=2, budget=TurnBudgetSettings(format_penalty=-0.5))
    observations, _ = group.reset(seed=3)
    assert observations["traj_0"] == observations["traj_1"]
    _, rewards, _, _, _ = group.step({"traj_0": ["abc"], "traj_1": ["10"]})
    assert rewards == {"traj_0": -0.5, "traj_1": 0.0}


def test_two_player_games_are_played_against_a_reproducible_random_opponent():
    def first_listed_move(observation: str) -> str:
        moves = re.search(r"Available Moves: (.*)", observation.split("Current Board")[-1])
        assert moves is not None, observation
        return re.findall(r"\[(\d)\]", moves.group(1))[0]

    games = [play("TicTacToe-v0", first_listed_move, seed=seed) for seed in (0, 0, 1, 2, 3)]
    assert games[0][2] == games[1][2]  # one seed, one game
    assert len({tuple(seen) for _, _, seen in games}) > 2  # the opponent draws per seed
    for reward, info, seen in games:
        assert reward in (-1.0, 0.0, 1.0) and info["success"] is (reward == 1.0)
        assert any("[Player 1]" in o for o in seen)  # the opponent's moves are shown


def transcript(env, moves: list[str], seed: int) -> list[str]:
    """The observations of `moves` from `seed`, up to the game's end."""
    observation, _ = env.reset(seed=seed)
    out = [observation]
    for move in moves:
        observation, _, terminated, _, _ = env.step(move)
        out.append(observation)
        if terminated:
            break
    return out


# Stochastic games, each with a fixed list of answers (invalid ones are fine: they change nothing).
INTERLEAVED = {
    "Blackjack-v0": ["Hit", "Stand", "Hit", "Stand"],
    "Bandit-v0": ["red", "blue", "green", "red"],
    "ThreeCardMonte-v0": ["9", "1"],
    "GuessTheNumber-v0": ["10", "5", "15", "3"],
    "2048-v0-ultra-easy": ["Up", "Left", "Down", "Right"],
}


def test_games_interleaved_in_one_process_play_as_they_do_alone():
    alone = {game: transcript(make_env(f"textarena:{game}"), moves, seed=7) for game, moves in INTERLEAVED.items()}
    envs = {game: make_env(f"textarena:{game}") for game in INTERLEAVED}
    together = {game: [env.reset(seed=7)[0]] for game, env in envs.items()}
    ended = dict.fromkeys(INTERLEAVED, False)
    for turn in range(max(map(len, INTERLEAVED.values()))):
        for game, env in envs.items():
            random.random()  # other code drawing from the global generator between the games' calls
            if turn < len(INTERLEAVED[game]) and not ended[game]:
                observation, _, ended[game], _, _ = env.step(INTERLEAVED[game][turn])
                together[game].append(observation)
    assert together == alone


def test_the_games_leave_the_global_generators_alone():
    env = make_env("textarena:Blackjack-v0")
    python_state, numpy_state = random.getstate(), np.random.get_state()[1].copy()
    env.reset(seed=1)
    env.step("Hit")
    assert random.getstate() == python_state and np.array_equal(np.random.get_state()[1], numpy_state)


def test_a_dynamics_stream_keeps_the_start_and_redraws_what_follows():
    def hands(stream: int) -> list[str]:
        env = make_env("textarena:Blackjack-v0")
        first, _ = env.reset(seed=5, options={DYNAMICS_STREAM: stream})
        return [first] + [env.step("Stand")[0] for _ in range(5)]

    streams = [hands(k) for k in range(4)]
    assert len({s[0] for s in streams}) == 1  # one seed, one opening hand
    assert len({tuple(s[1:]) for s in streams}) > 1  # each stream deals its own later cards


def test_the_full_observation_keeps_every_message_for_markov_prompts():
    env = make_env("textarena:GuessTheNumber-v0", observation="full")
    first, _ = env.reset(seed=0)
    second, *_ = env.step("10")
    third, *_ = env.step("5")
    assert second.startswith(first) and third.startswith(second) and third.count("The target number is") == 2


def test_unknown_games_and_bad_config_are_refused_by_name():
    with pytest.raises(KeyError, match=r"unknown TextArena game 'GuessTheNumbr-v0'.*GuessTheNumber-v0"):
        make_env("textarena:GuessTheNumbr-v0")
    with pytest.raises(ValueError, match="unknown TextArena game"):
        check_env("textarena:NoSuchGame-v0", in_other_processes=True)
    check_env("textarena:GuessTheNumber-v0", in_other_processes=True)  # a plain string every process resolves
    with pytest.raises(ValueError, match="observation must be one of"):
        make_env("textarena:GuessTheNumber-v0", observation="all")
    with pytest.raises(ValueError, match="more than two players"):
        make_env("textarena:SecretMafia-v0").reset(seed=0)


def test_a_game_that_downloads_a_corpus_fails_at_once_saying_why(monkeypatch, tmp_path):
    # NLTK looks for its data in an empty folder only: the corpus is missing on every machine.
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    with pytest.raises(GameNeedsDownload, match=r"'Hangman-v0' downloads the NLTK data \['words'\]"):
        make_env("textarena:Hangman-v0")


def test_without_textarena_the_error_names_the_game_and_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)  # what Python does for a package that is not installed
    with pytest.raises(ImportError, match=r"textarena:GuessTheNumber-v0.*bash scripts/install.sh cpu,textarena"):
        make_env("textarena:GuessTheNumber-v0")


@pytest.mark.slow  # two StarPO iterations in a new process, on a remote env runner, then the evaluate CLI
def test_starpo_trains_on_a_textarena_game_on_a_remote_runner_and_the_evaluate_cli_scores_it(tiny_model_path, tmp_path):
    game = "textarena:GuessTheNumber-v0"
    environment = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    train = [
        sys.executable, "-m", "rllib_ragen", "train", "--env", game, "--model", str(tiny_model_path),
        "--engine", "hf", "--no-warm-start", "--stop-iters", "2", "--n-groups", "2", "--group-size", "2",
        "--max-turns", "3", "--eval-size", "2", "--checkpoint-dir", "ckpt", "--summary-json", "summary.json",
        "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--experiment", "textarena",
        "--set", "mini_batch_size=4", "--set", "micro_batch_size=2",
        "--set", "num_env_runners=1", "--set", "create_local_env_runner=False",
    ]  # fmt: skip
    out = subprocess.run(train, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=environment)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["iterations"] == 2 and len(summary["after"]) == 2

    evaluate = [
        sys.executable, "-m", "rllib_ragen.run.evaluate", "ckpt", "--episodes", "3", "--engine", "hf",
        "--output-dir", "evaluation",
    ]  # fmt: skip
    out = subprocess.run(evaluate, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=environment)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"| {game} | 3 |" in out.stdout
    scored = json.loads((tmp_path / "evaluation" / "summary.json").read_text())["envs"][game]
    assert len(scored["successes"]) == 3 and set(scored["successes"]) <= {0, 1}
    page = (tmp_path / "evaluation" / f"{game}.html").read_text()
    assert "Guess The Number" in page  # the game's own rules, passed through to the trajectory page


def _expert_game(game: str, seed: int, turns: int, check: Callable[[Any, Any, dict], None]) -> tuple[float, bool]:
    """Plays `game` from `seed` with its expert for up to `turns` turns; `check(env, answer, info)` after each
    step. Returns the last reward and whether the game ended."""
    from rllib_ragen.data.experts import TurnBudgetLeft, expert_for

    env = make_env(f"textarena:{game}")
    env.reset(seed=seed)
    expert = expert_for(env)
    for turn in range(turns):
        answer = expert(env, TurnBudgetLeft(turns=turns - turn, actions=turns - turn, per_turn=1))
        assert answer is not None, f"seed {seed}, turn {turn}"
        shown = env.render_text()
        _, reward, terminated, _, info = env.step(answer.actions[0])
        check(shown, answer, info)
        if terminated:
            break
    return reward, terminated


def test_the_guess_the_number_expert_wins_within_five_guesses():
    from rllib_ragen.data.experts import has_expert

    assert has_expert("textarena:GuessTheNumber-v0") and not has_expert("textarena:TowerOfHanoi-v0")

    def check(shown: str, answer: Any, info: dict) -> None:
        assert answer.thought.startswith("The number is from")

    for seed in range(8):
        assert _expert_game("GuessTheNumber-v0", seed, 5, check) == (1.0, True), f"seed {seed}"


def test_the_tictactoe_expert_plays_legal_moves_and_never_loses_to_the_random_opponent():
    from rllib_ragen.data.experts import has_expert

    assert has_expert("textarena:TicTacToe-v0")

    def check(shown: str, answer: Any, info: dict) -> None:
        assert answer.actions[0] in shown and answer.thought.startswith("I play O; free cells:")  # a listed cell
        assert info["action_is_valid"]

    games = [_expert_game("TicTacToe-v0", seed, 5, check) for seed in range(24)]
    assert all(ended for _, ended in games), "a game outlasted the board"
    outcomes = [reward for reward, _ in games]
    # Minimax moving first against random play: never a loss, and a win in most games.
    assert min(outcomes) >= 0.0 and sum(r == 1.0 for r in outcomes) >= 18, outcomes


def test_the_cpu_preset_plays_a_textarena_game_one_move_a_turn_with_the_whole_history():
    from rllib_ragen.algorithm.presets import TEXTARENA_TURNS, cpu_preset

    config = cpu_preset("textarena:GuessTheNumber-v0")
    assert (config.turn_budget.max_turns, config.protocol.max_actions_per_turn, config.turn_budget.max_actions_per_traj) == (TEXTARENA_TURNS, 1, 6)
    assert config.protocol.history_window is None and not config.protocol.think and config.protocol.prefill
    # A row is a whole trajectory: the 4 kept groups x 4 trajectories fill the one on-policy step, unrepeated.
    assert config.update.mini_batch_size is None and config.max_rows_per_update == 16 and config.update.rows_per_step(16) == 16
    assert config.update_is_one_on_policy_step


@pytest.mark.parametrize("game", ["GuessTheNumber-v0", "TicTacToe-v0", "TowerOfHanoi-v0"])
def test_arbitrary_answers_never_raise_and_an_invalid_one_changes_nothing(game):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    env = make_env(f"textarena:{game}")

    @settings(max_examples=40, deadline=None)
    @given(st.lists(st.text(max_size=30) | st.sampled_from(["4", "[4]", "A C", "[A B]", "0", "]", "["]), max_size=6))
    def check(answers: list[str]) -> None:
        env.reset(seed=0)
        for answer in answers:
            moves_before = env.game.state.turn
            observation, reward, terminated, truncated, info = env.step(answer)
            assert isinstance(observation, str) and np.isfinite(reward) and not truncated
            if not info["action_is_valid"]:  # the game refused it: nothing happened, and it says why
                assert reward == 0.0 and not terminated and env.game.state.turn == moves_before
                assert "invalid" in observation.lower()
            if terminated:
                break

    check()
