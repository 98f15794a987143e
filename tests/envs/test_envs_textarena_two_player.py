"""The two-player TextArena game (one agent per seat), SPIRAL's rules and the TicTacToe minimax expert."""

from __future__ import annotations

import pytest
from conftest import require_extra

from envs.kuhn_board_text import kuhn_text
from envs.tictactoe_minimax import minimax_move
from envs.user_errors import UserError

require_extra("textarena", "cpu,test,textarena")

from envs.textarena_two_player import SEATS, TwoPlayerGame, seat_of  # noqa: E402


def test_minimax_blocks_and_wins_on_hand_made_boards() -> None:
    # X (player 1) threatens the top row: O (player 0) must block cell 2.
    assert minimax_move([["X", "X", ""], ["O", "", ""], ["", "", ""]], 0) == 2
    # O can win at once in cell 2 rather than block X's row at 5.
    assert minimax_move([["O", "O", ""], ["X", "X", ""], ["", "", ""]], 0) == 2
    with pytest.raises(ValueError, match="over"):
        minimax_move([["O", "O", "O"], ["X", "X", ""], ["", "", ""]], 1)


def _play(game: TwoPlayerGame, seed: int, policies: dict[str, str]) -> tuple[dict, dict]:
    observations, _ = game.reset(seed=seed)
    while True:
        seat = game.current_seat
        assert set(observations) >= {seat}
        observations, rewards, terminateds, _, infos = game.step({seat: game.scripted_move(policies[seat])})
        if terminateds["__all__"]:
            return rewards, infos


def test_minimax_never_loses_to_random_on_either_seat() -> None:
    game = TwoPlayerGame(game="TicTacToe-v0")
    outcomes = []
    for seed in range(40):
        expert = SEATS[seed % 2]  # seats alternate
        other = SEATS[1 - seed % 2]
        rewards, _ = _play(game, seed, {expert: "minimax", other: "random"})
        assert rewards[expert] >= 0.0, f"seed {seed}: minimax lost as {expert}"
        assert rewards[expert] == -rewards[other]
        outcomes.append(rewards[expert])
    assert sum(o > 0 for o in outcomes) > 20  # random blunders: the expert wins most games


def test_spiral_invalid_move_ends_the_game_with_its_rewards() -> None:
    game = TwoPlayerGame(game="TicTacToe-v0")
    observations, _ = game.reset(seed=0)
    assert list(observations) == ["player_0"] and "Player 0" in observations["player_0"]
    game.step({"player_0": "4"})
    assert game.last_move == {"action_is_valid": True, "game_action": "[4]"}  # the mover's, not the next seat's
    # Player 1 plays the occupied cell 4: it loses 1.5, player 0 gains 0.5, both seats see the end.
    observations, rewards, terminateds, _, infos = game.step({"player_1": "[4]"})
    assert rewards == {"player_0": 0.5, "player_1": -1.5}
    assert terminateds == {"player_0": True, "player_1": True, "__all__": True}
    assert infos["player_1"]["action_is_valid"] is False and game.last_move["action_is_valid"] is False
    assert all("Game over" in observations[seat] for seat in SEATS)


def test_without_the_rule_an_invalid_move_is_retried_by_the_same_seat() -> None:
    game = TwoPlayerGame(game="TicTacToe-v0", invalid_move_ends_game=False)
    game.reset(seed=0)
    observations, rewards, terminateds, _, infos = game.step({"player_0": "[9]"})
    assert list(observations) == ["player_0"] and infos["player_0"]["action_is_valid"] is False
    assert rewards == {"player_0": 0.0} and not terminateds["__all__"]


def test_turn_cap_is_a_draw() -> None:
    game = TwoPlayerGame(game="TicTacToe-v0", max_game_turns=2)
    game.reset(seed=0)
    game.step({"player_0": "[0]"})
    _, rewards, terminateds, _trunc, infos = game.step({"player_1": "[4]"})
    assert rewards == {"player_0": 0.0, "player_1": 0.0} and terminateds["__all__"]
    assert infos["player_0"]["outcome"] == infos["player_1"]["outcome"] == "draw"


def test_kuhn_poker_runs_through_the_same_seats() -> None:
    game = TwoPlayerGame(game="KuhnPoker-v0")
    rewards, _ = _play(game, 5, {"player_0": "random", "player_1": "random"})
    assert rewards["player_0"] == -rewards["player_1"]
    chips = game.chips("player_0")
    assert chips == -game.chips("player_1")
    assert game.hands_opened("player_0") == (1, 3)  # rounds 1 and 3 are opened by player 1


def test_a_game_option_makes_kuhn_poker_one_hand_whose_pot_decides_the_game() -> None:
    game = TwoPlayerGame(game="KuhnPoker-v0", game_options={"max_rounds": 1}, render="board")
    assert "one hand a game" in game.instructions("player_0") and "Player 1 opens" in game.instructions("player_0")
    for seed in range(6):
        game.reset(seed=seed)
        cards = dict(game.game.state.game_state["player_cards"])
        winner = 0 if cards[0] > cards[1] else 1
        assert game.current_seat == "player_1"  # TextArena's hand 1 is opened by player 1
        game.step({"player_1": "[bet]"})
        _, rewards, terminateds, _, _ = game.step({"player_0": "[call]"})
        assert terminateds["__all__"]  # no second hand
        assert rewards == {SEATS[winner]: 1.0, SEATS[1 - winner]: -1.0}  # no draw: the hand's pot is the game
        assert game.chips(SEATS[winner]) == 2.0  # the called bet's pot: 2 chips from the loser
        assert game.hands_opened("player_1") == (1, 1) and game.hands_opened("player_0") == (0, 1)


def test_an_option_the_games_constructor_does_not_take_is_refused_by_name() -> None:
    with pytest.raises(UserError, match=r"'KuhnPoker-v0'.*refused the options \{'hands': 1\}.*'hands'"):
        TwoPlayerGame(game="KuhnPoker-v0", game_options={"hands": 1})
    with pytest.raises(UserError, match="game_options must be a dict"):
        TwoPlayerGame(game="KuhnPoker-v0", game_options=[("max_rounds", 1)])


def _hand(game: TwoPlayerGame, seed: int, moves: list[str]) -> tuple[int, int, dict[int, int]]:
    """Plays one hand of Kuhn Poker from a new game: (the showdown's winner, the opener, each seat's chips
    after the hand, the next hand's antes paid)."""
    game.reset(seed=seed)
    state = game.game.state
    cards, opener = dict(state.game_state["player_cards"]), int(state.current_player_id)
    for move in moves:
        game.step({game.current_seat: move})
    return (0 if cards[0] > cards[1] else 1), opener, dict(state.game_state["player_chips"])


def test_a_kuhn_hand_moves_one_chip_or_two_with_a_called_bet() -> None:
    game = TwoPlayerGame(game="KuhnPoker-v0")
    for seed in range(4):
        # A hand won with the antes' pot of 2 leaves the winner +1 - 1 = 0 and the loser -1 - 1 = -2.
        winner, _, chips = _hand(game, seed, ["[check]", "[check]"])
        assert chips == {winner: 0, 1 - winner: -2}
        winner, _, chips = _hand(game, seed, ["[bet]", "[call]"])
        assert chips == {winner: 1, 1 - winner: -3}
        _, opener, chips = _hand(game, seed, ["[bet]", "[fold]"])
        assert chips == {opener: 0, 1 - opener: -2}
        _, opener, chips = _hand(game, seed, ["[check]", "[bet]", "[fold]"])
        assert chips == {opener: -2, 1 - opener: 0}


def test_a_random_opening_plays_0_to_its_bound_of_listed_moves_then_the_next_seat_sees_them() -> None:
    game = TwoPlayerGame(game="TicTacToe-v0", max_game_turns=9, max_opening_moves=3)
    lengths = set()
    for seed in range(30):
        observations, _ = game.reset(seed=seed)
        marks = sum(bool(cell) for row in game.game.state.game_state["board"] for cell in row)
        assert marks == game.moves <= 3 and list(observations) == [SEATS[game.moves % 2]]
        (observation,) = observations.values()
        # The seat's first state holds the rules and every board of the opening, the current one last.
        assert observation.startswith("You are Player") and observation.count("Current Board") == game.moves + 1
        assert observation.rsplit("Available Moves:", 1)[1].count("[") == 9 - game.moves
        lengths.add(game.moves)
    assert lengths == {0, 1, 2, 3}
    first, _ = game.reset(seed=4)
    assert game.reset(seed=4)[0] == first  # the seed decides the opening
    plain = TwoPlayerGame(game="TicTacToe-v0")
    assert all(plain.reset(seed=seed)[1] == {"player_0": {}} and plain.moves == 0 for seed in range(10))
    with pytest.raises(UserError, match="max_opening_moves must be from 0 to max_game_turns - 1 = 8, got 9"):
        TwoPlayerGame(game="TicTacToe-v0", max_game_turns=9, max_opening_moves=9)


def test_board_text_shows_marks_and_free_cell_numbers_by_hand() -> None:
    from envs.tictactoe_board_text import board_text

    board = [["X", "", ""], ["", "O", ""], ["", "", "X"]]
    assert board_text(board) == "X 1 2\n3 O 5\n6 7 X\nFree cells: 1 2 3 5 6 7"
    full = [["X", "O", "X"], ["X", "O", "O"], ["O", "X", "X"]]
    assert board_text(full).endswith("Free cells: none")
    with pytest.raises(ValueError, match="9 cells"):
        board_text([["X", ""]])


def test_the_board_render_shows_the_current_board_and_puts_the_rules_in_the_system_prompt() -> None:
    game = TwoPlayerGame(game="TicTacToe-v0", render="board", max_game_turns=9)
    assert "as X (Player 1)" in game.instructions("player_1") and "as O (Player 0)" in game.instructions("player_0")
    observations, _ = game.reset(seed=0)
    assert observations == {"player_0": "0 1 2\n3 4 5\n6 7 8\nFree cells: 0 1 2 3 4 5 6 7 8"}
    observations, *_ = game.step({"player_0": "4"})
    # Player 1 sees the board after player 0's move, and nothing of TextArena's messages.
    assert observations == {"player_1": "0 1 2\n3 O 5\n6 7 8\nFree cells: 0 1 2 3 5 6 7 8"}
    # The random seat still draws a free cell (from TextArena's messages, which the render hides).
    for _ in range(3):
        move = game.scripted_move("random")
        assert move.strip("[]") in observations[game.current_seat].split("Free cells: ")[1].split()
        observations, _, terminateds, *_ = game.step({game.current_seat: move})
        if terminateds["__all__"]:
            break


def test_the_board_render_ends_with_the_game_over_line_and_refuses_other_games() -> None:
    game = TwoPlayerGame(game="TicTacToe-v0", render="board")
    game.reset(seed=0)
    observations, rewards, terminateds, *_ = game.step({"player_0": "[9]"})  # no such cell: SPIRAL's rule ends it
    assert terminateds["__all__"] and rewards == {"player_0": -1.5, "player_1": 0.5}
    for seat in SEATS:
        assert observations[seat].startswith("0 1 2\n") and observations[seat].splitlines()[-1].startswith("Game over")
    with pytest.raises(UserError, match="draws TicTacToe and KuhnPoker only, not 'SimpleNegotiation-v0'"):
        TwoPlayerGame(game="SimpleNegotiation-v0", render="board")
    with pytest.raises(UserError, match="render must be one of"):
        TwoPlayerGame(game="TicTacToe-v0", render="ascii")


def test_the_kuhn_board_render_shows_the_hand_so_far_by_hand() -> None:
    # Player 1 opens hand 2 holding the queen, and has checked; player 0 bet. Stacks after antes and bets.
    state = {"current_round": 2, "starting_player": 1, "player_cards": {0: 2, 1: 1}, "player_chips": {0: -2, 1: -1},
             "current_legal_action_tree": {"fold": "loser", "call": "showdown"}}
    assert kuhn_text(state, 1, 3) == (
        "Hand 2 of 3. Chips: you -1, opponent -2.\nYour card: Q. You opened; you checked, the opponent bet.\n"
        "Your moves: fold call"
    )
    assert kuhn_text(state, 0, 3).splitlines()[1] == "Your card: K. The opponent opened and bet."
    before_any_move = dict(state, current_legal_action_tree={"check": {}, "bet": {}})
    assert kuhn_text(before_any_move, 1, 3).splitlines()[1:] == ["Your card: Q. You open.", "Your moves: check bet"]
    assert kuhn_text(before_any_move, 0, 3).splitlines()[1] == "Your card: K. The opponent opened and checked."


def test_the_kuhn_board_render_plays_a_game_with_the_rules_in_the_system_prompt() -> None:
    game = TwoPlayerGame(game="KuhnPoker-v0", render="board", max_game_turns=9)
    assert "Kuhn Poker as Player 1" in game.instructions("player_1") and "J, Q, K" in game.instructions("player_1")
    observations, _ = game.reset(seed=3)
    state = game.game.state.game_state
    seat = game.current_seat
    assert observations[seat] == kuhn_text(state, seat_of(seat), 3) and observations[seat].startswith("Hand 1 of 3.")
    while not game.done:
        seat = game.current_seat
        observations, *_ = game.step({seat: game.scripted_move("random")})
    for seat in SEATS:
        assert observations[seat].splitlines()[0] == "The game is over."
        assert observations[seat].splitlines()[-1].startswith("Game over")
