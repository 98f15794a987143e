"""`SelfPlayEnvRunner`: the `LLMEnvRunner` of two-player self-play (`StarPOConfig.self_play()`).

Each `sample` call plays one game per seed (`game_rollout.play_games`), seats mapped by the training
mapping (`self_play_settings.training_mapping`): the trained policy on both seats, or against the frozen
snapshot or a scripted opponent, seats alternating game by game. Each game is one episode and one StarPO
group (its trained seats share the group id).

The frozen snapshot is served by a second engine, built like the trained one from the model the run
started from, so it costs the learner nothing (no module, no optimiser state, no gradient) and the
weight sync never reaches it: it loads into `self.engine` only (`rllib_ragen.inference.weight_sync`).
The league's snapshot (opponent "league") is a third engine built the same way; every
`league_refresh_interval` iterations the algorithm loads the trained weights into it
(`PolicyWeightSync.sync_snapshot(LEAGUE_ENGINE)`), so training meets a past self that the trained policy
keeps catching up with, while evaluation's "frozen" stays the policy the run started from.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.annotations import override

from envs.textarena_two_player import SEATS, TwoPlayerGame
from rllib_ragen.inference.engine import InferenceEngine, SamplingParams
from rllib_ragen.inference.engine_factory import make_engine
from rllib_ragen.models import load_tokenizer
from rllib_ragen.rollout.env_runner import LLMEnvRunner
from rllib_ragen.rollout.game_evaluation import GameScore, score_games
from rllib_ragen.rollout.game_rollout import (
    FROZEN_MODULE,
    LEAGUE_MODULE,
    TRAINED_MODULE,
    GameResult,
    PolicyMappingFn,
    Seats,
    play_games,
    seat_protocols,
)
from rllib_ragen.rollout.prompt.token_history import ChatTemplate
from rllib_ragen.rollout.self_play_settings import (
    SelfPlaySettings,
    alternating_seats,
    module_of_opponent,
    training_mapping,
)
from rllib_ragen.rollout.trajectory_record import rollout_statistics

_TEXT = gym.spaces.Text(max_length=100_000)
# The runner attribute holding the league's snapshot engine (what `PolicyWeightSync.sync_snapshot` loads).
LEAGUE_ENGINE = "league_engine"


class SelfPlayEnvRunner(LLMEnvRunner):
    """Samples two-player games (module docstring); the frozen snapshot's engine beside the trained one."""

    def __init__(self, *, config: AlgorithmConfig, **kwargs: Any) -> None:
        self.self_play: SelfPlaySettings = config.two_player
        self.frozen_engine: InferenceEngine | None = None
        self.league_engine: InferenceEngine | None = None
        self.last_game_results: list[GameResult] = []
        super().__init__(config=config, **kwargs)

    @override(LLMEnvRunner)
    def make_env(self) -> None:
        """Each seat's prompt protocol: its system prompt names the game and the seat's role."""
        game = TwoPlayerGame(self.self_play.game_config(training=False))
        template = ChatTemplate.from_tokenizer(load_tokenizer(self.model_path))
        self.protocols = seat_protocols(game, template, self.config.protocol)
        self.protocol = self.protocols[SEATS[0]]  # both seats share the template's stop tokens
        self.reward_shaping = self.config.shaping

    @override(LLMEnvRunner)
    def make_module(self) -> None:
        super().make_module()
        if self.self_play.frozen_opponent:
            # The snapshot: the weights the run started from, in an engine the weight sync never loads.
            seed = (self.config.seed or 0) + 1
            self.frozen_engine = make_engine(self.engine_settings, self.model_path, seed=seed, lora=self.config.lora)
        if self.self_play.league:
            # The league's snapshot starts as the same weights; the algorithm's league refresh loads it later.
            seed = (self.config.seed or 0) + 2
            self.league_engine = make_engine(self.engine_settings, self.model_path, seed=seed, lora=self.config.lora)

    @override(LLMEnvRunner)
    def get_spaces(self) -> dict[str, tuple[Any, Any]]:
        return {INPUT_ENV_SPACES: (_TEXT, _TEXT), DEFAULT_MODULE_ID: (_TEXT, _TEXT)}

    @override(LLMEnvRunner)
    def sample(
        self,
        *,
        seeds: list[int] | None = None,
        group_size: int | None = None,
        temperature: float | None = None,
        evaluation: bool = False,
        policy_mapping_fn: PolicyMappingFn | None = None,
        **kwargs: Any,
    ) -> list[MultiAgentEpisode]:
        """Plays one game per seed; returns the episodes in which a trained seat acted (each game's result
        in `last_game_results`).

        Args:
            seeds: The games' seeds; default the first `n_groups` training seeds.
            group_size: Unused: a game's group is its trained seats.
            temperature: Sampling temperature (default: the config's).
            evaluation: Log none of the runner's training metrics.
            policy_mapping_fn: Who plays each seat (default: the training mapping of `.self_play()`).
        """
        settings = self.rollout
        if seeds is None:
            seeds = list(range(settings.train_seed_start, settings.train_seed_start + settings.n_groups))
        episodes, self.last_game_results = play_games(
            [TwoPlayerGame(self.self_play.game_config(training=not evaluation)) for _ in seeds],
            seeds,
            policy_mapping_fn or training_mapping(self.self_play),
            self._seats(settings.temperature if temperature is None else temperature),
            group_ids=[self.next_group_id() for _ in seeds],
            policy_version=self.policy_version,
        )
        # A game the opponent ended before the trained seat moved holds no trajectory (the seat never acted).
        trained = [episode for episode in episodes if any(len(agent) for agent in episode.agent_episodes.values())]
        if not evaluation and trained:
            for key, value in rollout_statistics(trained).items():
                self.metrics.log_value(key, value, window=1)
        return trained

    def evaluate_games(self, opponent: str, *, seeds: list[int], temperature: float) -> GameScore:
        """The trained policy against `opponent` ("frozen" or a scripted one), one game per seed, seats alternating."""
        mapping = alternating_seats(module_of_opponent(opponent))
        self.sample(seeds=seeds, temperature=temperature, evaluation=True, policy_mapping_fn=mapping)
        return score_games(self.last_game_results, TRAINED_MODULE)

    def game_scores(self, *, first_seed: int, temperature: float) -> dict[str, GameScore]:
        """Every configured opponent's `GameScore`, each over `game_eval_games` games from seed `first_seed`
        (the same seeds for every opponent, and in every evaluation: outcomes pair game by game)."""
        seeds = list(range(first_seed, first_seed + self.self_play.game_eval_games))
        return {
            opponent: self.evaluate_games(opponent, seeds=seeds, temperature=temperature)
            for opponent in self.self_play.game_eval_opponents
        }

    def _seats(self, temperature: float) -> Seats:
        engines = {TRAINED_MODULE: self.engine}
        if self.frozen_engine is not None:
            engines[FROZEN_MODULE] = self.frozen_engine
        if self.league_engine is not None:
            engines[LEAGUE_MODULE] = self.league_engine
        params = SamplingParams(
            max_new_tokens=self.rollout.response_length,
            temperature=temperature,
            stop_token_ids=self.protocol.stop_token_ids,
        )
        max_prompt_len = self.engine_settings.max_model_len - self.rollout.response_length
        return Seats(engines, self.protocols, params, max_prompt_len)

    @override(EnvRunner)
    def stop(self) -> None:
        super().stop()
        for snapshot in (self.frozen_engine, self.league_engine):
            if snapshot is not None:
                snapshot.shutdown()
