"""The expert's demonstrations of a two-player game: both seats, on self-play's own prompts, every move the
expert's for the seat that made it; and the self-play warm start that trains on them."""

from __future__ import annotations

import math

import pytest
from conftest import require_extra

from envs.textarena_two_player import SEATS, TwoPlayerConfig, TwoPlayerGame, seat_of
from envs.tictactoe_minimax import minimax_move
from envs.user_errors import UserError
from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.data.game_demonstrations import expert_game_demonstrations
from rllib_ragen.models import load_tokenizer
from rllib_ragen.rollout.game_rollout import seat_protocols
from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings
from rllib_ragen.rollout.prompt.token_history import ChatTemplate
from rllib_ragen.rollout.trajectory_record import trajectories_from_episodes, trajectory_start
from rllib_ragen.run.warm_start import demonstrations, warm_start_config

require_extra("textarena", "cpu,test,textarena")

GAME = TwoPlayerConfig(game="TicTacToe-v0", max_game_turns=9, max_opening_moves=3)
PROTOCOL = ProtocolSettings(think=False, prefill=True, history_window=1)
SEEDS = list(range(700, 716))


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return load_tokenizer(tiny_model_path)


@pytest.fixture(scope="module")
def episodes(tokenizer):
    return expert_game_demonstrations(tokenizer, GAME, PROTOCOL, SEEDS)


def _moves_by_seat(episode) -> dict[str, list[str]]:
    return {
        seat: [info["game_action"] for info in agent.get_infos()[1:]]
        for seat, agent in episode.agent_episodes.items()
    }


def test_every_recorded_move_is_the_experts_for_the_seat_that_made_it(episodes):
    """Replays each game from its seed (the same random opening): at each turn the seat to move takes its
    next recorded move, which must be minimax's for that seat and board; every recorded move is used."""
    assert len(episodes) == len(SEEDS)
    for seed, episode in zip(SEEDS, episodes):
        assert set(episode.agent_episodes) == set(SEATS)  # after at most 3 opening moves both seats move
        moves = _moves_by_seat(episode)
        game = TwoPlayerGame(GAME)
        game.reset(seed=seed)
        while not game.done:
            seat = game.current_seat
            board = game.game.state.game_state["board"]
            move = moves[seat].pop(0)
            assert move == f"[{minimax_move(board, seat_of(seat))}]", (seed, seat, board)
            game.step({seat: move})
        assert moves == {seat: [] for seat in SEATS}, seed


def test_each_seat_is_prompted_as_self_play_prompts_it_and_nobody_sampled_the_answers(episodes, tokenizer):
    protocols = seat_protocols(TwoPlayerGame(GAME), ChatTemplate.from_tokenizer(tokenizer), PROTOCOL)
    trajectories = trajectories_from_episodes(episodes, history_window=PROTOCOL.history_window)
    assert len(trajectories) == 2 * len(SEEDS)
    roles = [trajectory.role for trajectory in trajectories]
    assert sorted(roles) == sorted(f"TicTacToe-v0/{seat}" for seat in SEATS for _ in SEEDS)
    for trajectory in trajectories:
        seat = trajectory.role.split("/")[1]
        assert trajectory.history.system_ids == list(protocols[seat].system_ids)
        for turn in trajectory.history.turns:
            assert turn.response_logprobs and all(math.isnan(lp) for lp in turn.response_logprobs)
            assert tokenizer.decode(turn.response_ids).rstrip().endswith("</answer>" + tokenizer.eos_token)
    # Nobody's weights sampled them: no policy version in their starts, as in the single-seat demonstrations.
    starts = [trajectory_start(episode.agent_episodes[seat]) for episode in episodes for seat in SEATS]
    assert {start.policy_version for start in starts} == {None}


def test_the_openings_make_the_games_differ(episodes):
    games = {tuple(map(tuple, _moves_by_seat(episode).values())) for episode in episodes}
    assert len(games) >= len(SEEDS) // 2


def test_kuhn_pokers_demonstrations_are_the_equilibriums_draws_for_each_seat(tokenizer):
    """Replays each game from its seed: the equilibrium, drawing from the game's own stream, makes each
    recorded move in turn; every game ends with its three hands played and nobody forfeiting."""
    kuhn = TwoPlayerConfig(game="KuhnPoker-v0", max_game_turns=9)
    seeds = list(range(900, 906))
    for seed, episode in zip(seeds, expert_game_demonstrations(tokenizer, kuhn, PROTOCOL, seeds)):
        moves = _moves_by_seat(episode)
        game = TwoPlayerGame(kuhn)
        game.reset(seed=seed)
        while not game.done:
            seat = game.current_seat
            move = moves[seat].pop(0)
            assert move == game.scripted_move("equilibrium"), (seed, seat)
            game.step({seat: move})
        assert moves == {seat: [] for seat in SEATS} and game.forfeited_by is None, seed
        assert game.game.state.game_state["current_round"] > 3, seed  # the game ended after its third hand


def test_a_game_without_a_two_seat_expert_is_refused_by_name(tokenizer):
    with pytest.raises(UserError, match="SimpleNegotiation-v0"):
        expert_game_demonstrations(tokenizer, TwoPlayerConfig(game="SimpleNegotiation-v0"), PROTOCOL, [0])


def _tictactoe_self_play(*, training_opening_moves: int) -> StarPOConfig:
    return (
        StarPOConfig()
        .environment("textarena:TicTacToe-v0")
        .llm(model="tiny-random", critic="none")
        .rollouts(history_window=1, think=False, prefill=True)
        .self_play(self_play_game="TicTacToe-v0", max_game_turns=9, training_opening_moves=training_opening_moves)
    )


def test_the_self_play_warm_start_plays_both_seats_and_the_single_seat_one_does_not(tokenizer):
    config = _tictactoe_self_play(training_opening_moves=3)
    self_play = warm_start_config(config, player="expert", num_examples=4)
    assert self_play.game == config.two_player.game_config(training=True)
    single_seat = warm_start_config(config, player="expert", num_examples=4, world_model_epochs=1)
    assert single_seat.game is None
    assert self_play.fingerprint("m") != warm_start_config(config.copy().self_play(self_play_game=None),
                                                          player="expert", num_examples=4).fingerprint("m")
    played = demonstrations(tokenizer, self_play)
    assert len(played) == 4 and all(set(episode.agent_episodes) == set(SEATS) for episode in played)
    assert self_play.num_steps == -(-2 * 4 // self_play.batch_size)


def test_the_warm_starts_own_openings_vary_its_games_when_training_games_open_from_the_empty_board(tokenizer):
    """With training games from the empty board, minimax's demonstrations would be two games over and over;
    `game_opening_moves` gives the warm start its own openings, and the games played name its cache."""
    config = _tictactoe_self_play(training_opening_moves=0)
    from_empty = warm_start_config(config, player="expert", num_examples=8)
    tuned = {"player": "expert", "game_opening_moves": 3}
    own = warm_start_config(config, player="expert", num_examples=8, tuned=tuned)
    assert own.game.max_opening_moves == 0 and own.expert_game.max_opening_moves == 3

    def distinct_games(settings):
        return {tuple(map(tuple, _moves_by_seat(episode).values())) for episode in demonstrations(tokenizer, settings)}

    assert len(distinct_games(from_empty)) == 1
    assert len(distinct_games(own)) >= 4
    # The same games as a warm start whose training games open with 0-3 moves: one cached result.
    opened = warm_start_config(config.copy().self_play(training_opening_moves=3), player="expert", num_examples=8)
    assert own.fingerprint("m") == opened.fingerprint("m") != from_empty.fingerprint("m")
    with pytest.raises(ValueError, match="game_opening_moves"):
        warm_start_config(config, player="expert", tuned={"player": "expert", "game_opening_moves": -1})


def test_the_games_options_reach_the_warm_starts_games_and_name_its_cache(tokenizer):
    """Kuhn Poker of one hand (`game_options`): the equilibrium's demonstrations are one hand each, at most two
    moves a seat, and they are another warm start than three hands'."""
    config = (
        StarPOConfig()
        .environment("textarena:KuhnPoker-v0")
        .llm(model="tiny-random", critic="none")
        .rollouts(history_window=1, think=False, prefill=True)
        .self_play(self_play_game="KuhnPoker-v0", game_options={"max_rounds": 1}, game_render="board")
    )
    assert config.two_player.game_config(training=False).game_options == {"max_rounds": 1}
    one_hand = warm_start_config(config, player="expert", num_examples=6)
    assert one_hand.game.game_options == {"max_rounds": 1}
    for episode in demonstrations(tokenizer, one_hand):
        moves = _moves_by_seat(episode)
        assert 1 <= len(moves["player_1"]) <= 2 and len(moves["player_0"]) == 1  # player 1 opens the one hand
    three_hands = warm_start_config(config.copy().self_play(game_options={}), player="expert", num_examples=6)
    assert one_hand.fingerprint("m") != three_hands.fingerprint("m")
