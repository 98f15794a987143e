"""`SelfPlaySettings` (set with `StarPOConfig.self_play()`) and the policy mappings it names.

A policy mapping follows RLlib's `policy_mapping_fn(agent_id, episode, **kwargs) -> module id`; the
self-play rollout (`game_rollout.play_games`) passes `game_index` among the kwargs, so seats alternate
game by game: in game i the mapped policy sits on seat i % 2 (`player_0` moves first). Several training
opponents (a league of past selves and scripted players, as RLlib's league examples keep) take the games
in pairs, one pair each in turn, so that each opponent meets the trained policy on both seats.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from envs.textarena_two_player import SCRIPTED_POLICIES, TwoPlayerConfig, seat_of
from rllib_ragen.checks import check_at_least_one, check_choice
from rllib_ragen.rollout.game_rollout import FROZEN_MODULE, LEAGUE_MODULE, TRAINED_MODULE, PolicyMappingFn

SELF = "self"
FROZEN = "frozen"
LEAGUE = "league"
OPPONENTS = (SELF, FROZEN, LEAGUE, *SCRIPTED_POLICIES)


@dataclasses.dataclass(frozen=True)
class SelfPlaySettings:
    """Two-player self-play (set with `StarPOConfig.self_play()`).

    Each field is documented where `StarPOConfig.self_play()` sets it.
    """

    self_play_game: str | None = None
    game_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    self_play_opponent: str | tuple[str, ...] = SELF
    invalid_move_ends_game: bool = True
    invalid_move_reward: float = -1.5
    opponent_invalid_reward: float = 0.5
    max_game_turns: int = 30
    training_opening_moves: int = 0
    game_render: str = "game"
    league_refresh_interval: int = 10
    game_eval_opponents: tuple[str, ...] = ("random",)
    game_eval_games: int = 128
    game_eval_opening_moves: int = 0

    def __post_init__(self) -> None:
        if not self.training_opponents:
            raise ValueError("self_play_opponent names no opponent: give one, or a tuple of several")
        for opponent in self.training_opponents:
            check_choice("self_play_opponent", opponent, OPPONENTS)
        for opponent in self.game_eval_opponents:
            check_choice("game_eval_opponents", opponent, (FROZEN, *SCRIPTED_POLICIES))
        check_at_least_one(self, "game_eval_games", "max_game_turns", "league_refresh_interval")
        if self.self_play_game is not None and not (isinstance(self.self_play_game, str) and self.self_play_game):
            raise ValueError(f"self_play_game must be a TextArena game id or None, got {self.self_play_game!r}")
        if self.enabled:
            # TwoPlayerConfig checks the rules and each opening.
            self.game_config(training=True)
            self.game_config(training=False)

    @property
    def enabled(self) -> bool:
        return self.self_play_game is not None

    @property
    def training_opponents(self) -> tuple[str, ...]:
        """Who the trained policy meets in training, one name or several (games taken in turn, in pairs)."""
        opponent = self.self_play_opponent
        return (opponent,) if isinstance(opponent, str) else tuple(opponent)

    @property
    def frozen_opponent(self) -> bool:
        """Whether training or evaluation meets the frozen snapshot (its engine is then built)."""
        return FROZEN in (*self.training_opponents, *self.game_eval_opponents)

    @property
    def league(self) -> bool:
        """Whether training meets the league's snapshot (its engine is then built, and refreshed)."""
        return LEAGUE in self.training_opponents

    def league_refresh_due(self, iteration: int) -> bool:
        """Whether the league's snapshot takes the trained weights after the update of `iteration` (1-based;
        every `league_refresh_interval` iterations)."""
        return self.league and iteration % self.league_refresh_interval == 0

    def game_config(self, *, training: bool) -> TwoPlayerConfig:
        """The two-player env's config of these settings: a training game's, or an evaluation game's (they differ
        in their random openings)."""
        if self.self_play_game is None:
            raise ValueError("self-play is off: no game is set (`StarPOConfig.self_play(self_play_game=...)`)")
        return TwoPlayerConfig(
            game=self.self_play_game,
            game_options=self.game_options,
            invalid_move_ends_game=self.invalid_move_ends_game,
            invalid_move_reward=self.invalid_move_reward,
            opponent_invalid_reward=self.opponent_invalid_reward,
            max_game_turns=self.max_game_turns,
            max_opening_moves=self.training_opening_moves if training else self.game_eval_opening_moves,
            render=self.game_render,
        )


def module_of_opponent(opponent: str) -> str:
    """The module id that plays `opponent` ("frozen" and "league": their snapshots'; a scripted one: its name)."""
    check_choice("opponent", opponent, (FROZEN, LEAGUE, *SCRIPTED_POLICIES))
    return {FROZEN: FROZEN_MODULE, LEAGUE: LEAGUE_MODULE}.get(opponent, opponent)


def shared_policy(agent_id: str, episode: Any, **kwargs: Any) -> str:
    """Self-play: the trained policy on both seats (shared weights; the role is in each seat's prompt)."""
    return TRAINED_MODULE


def _alternating(agent_id: str, episode: Any, *, evaluated: str, opponent: str, game_index: int, **kwargs: Any) -> str:
    return evaluated if seat_of(agent_id) == game_index % 2 else opponent


def alternating_seats(opponent: str, *, evaluated: str = TRAINED_MODULE) -> PolicyMappingFn:
    """`evaluated` on seat `game_index % 2`, the module `opponent` on the other (seats alternate game by game)."""
    return functools.partial(_alternating, evaluated=evaluated, opponent=opponent)


def _opponent_pairs(agent_id: str, episode: Any, *, opponents: tuple[str, ...], game_index: int, **kwargs: Any) -> str:
    opponent = opponents[(game_index // 2) % len(opponents)]
    if opponent == SELF:
        return shared_policy(agent_id, episode)
    return _alternating(
        agent_id, episode, evaluated=TRAINED_MODULE, opponent=module_of_opponent(opponent), game_index=game_index
    )


def training_mapping(settings: SelfPlaySettings) -> PolicyMappingFn:
    """Who plays each seat in training: "self" puts the trained policy on both seats, any other opponent meets it
    with seats alternating game by game. Several opponents take the games in pairs: games 2k and 2k + 1 go to
    opponent k modulo their number, so each opponent meets the trained policy on both seats."""
    return functools.partial(_opponent_pairs, opponents=settings.training_opponents)
