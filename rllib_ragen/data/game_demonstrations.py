"""Expert demonstrations of a two-player game on self-play's own prompts: the expert plays both seats.

A warm start on the single-seat env (`textarena:TicTacToe-v0` against a random opponent) teaches the
policy player 0's moves under that env's system prompt, while self-play and its evaluation prompt each seat
with its role (`TwoPlayerGame.instructions`) and seat player 1 as often as player 0. Here the games are
played by the self-play rollout itself (`game_rollout.play_games`), the trained policy mapped to both seats,
with the expert as its teacher: every turn of both seats is recorded under the prompt self-play will show,
and each game gives one trajectory per seat.

The experts: TicTacToe's exact minimax (`envs.tictactoe_minimax`) and Kuhn Poker's Nash equilibrium
(`envs.kuhn_equilibrium`). Minimax is deterministic, so TicTacToe's games differ by their openings: the game
config's `max_opening_moves` (the training games' random openings) plays 0 to that many random moves first.
Kuhn Poker's games differ by their deals and the equilibrium's mixed moves (drawn from the game's own stream,
so one seed plays one game).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from envs.kuhn_equilibrium import card_name
from envs.textarena_two_player import TwoPlayerConfig, TwoPlayerGame, seat_of
from envs.user_errors import UserError
from rllib_ragen.data.demonstrations import demonstration_response
from rllib_ragen.data.experts import tictactoe_turn
from rllib_ragen.inference.engine import SamplingParams
from rllib_ragen.rollout.game_rollout import Seats, play_games, seat_protocols
from rllib_ragen.rollout.prompt.prompt_protocol import PromptProtocol, ProtocolSettings
from rllib_ragen.rollout.prompt.token_history import ChatTemplate
from rllib_ragen.rollout.self_play_settings import shared_policy


def has_game_expert(game: str) -> bool:
    """Whether the two-player TextArena game `game` has an expert for both seats (module docstring)."""
    return _teacher(game) is not None


def expert_game_demonstrations(
    tokenizer: Any, game: TwoPlayerConfig, protocol: ProtocolSettings, seeds: Sequence[int]
) -> list[MultiAgentEpisode]:
    """One game per seed, the expert on both seats (module docstring).

    Args:
        tokenizer: The policy's tokenizer (its chat template builds the prompts).
        game: The two-player game and its rules (`SelfPlaySettings.game_config(training=True)`).
        protocol: The prompt settings of the self-play run.
        seeds: The games' seeds.

    Returns:
        One turn-based episode per game, each seat an agent with its own turns.
    """
    teacher = _teacher(game.game)
    if teacher is None:
        raise UserError(
            f"no expert plays both seats of {game.game!r} (TicTacToe has minimax, Kuhn Poker an equilibrium); "
            "warm-start self-play on the single-seat env, or with random play"
        )
    games = [TwoPlayerGame(game) for _ in seeds]
    template = ChatTemplate.from_tokenizer(tokenizer)
    # No engine is called: the teacher answers every turn, and no prompt is refused for its length.
    seats = Seats({}, seat_protocols(games[0], template, protocol), SamplingParams(), max_prompt_len=2**62)
    episodes, _ = play_games(
        games, seeds, shared_policy, seats, group_ids=range(len(seeds)), policy_version=None, teacher=teacher
    )
    return episodes


def _teacher(game: str) -> Callable[[TwoPlayerGame, PromptProtocol], list[int]] | None:
    """The expert's answers for TextArena's game `game`, or None."""
    if game.startswith("TicTacToe-"):
        return _tictactoe_answer
    if game.startswith("KuhnPoker-"):
        return _kuhn_answer
    return None


def _tictactoe_answer(game: TwoPlayerGame, protocol: PromptProtocol) -> list[int]:
    """The minimax move of the seat to move, as the model would write it under `protocol`."""
    turn = tictactoe_turn(game.game.state.game_state["board"], seat_of(game.current_seat))
    return demonstration_response(protocol, turn.actions, turn.thought)


def _kuhn_answer(game: TwoPlayerGame, protocol: PromptProtocol) -> list[int]:
    """The equilibrium's move of the seat to move (drawn from the game's stream), as the model would write it."""
    player = seat_of(game.current_seat)
    move = game.scripted_move("equilibrium")
    return demonstration_response(protocol, [move], f"I hold the {card_name(game.game.state.game_state, player)}.")
