"""Two-player games played at once, each seat by the module a `policy_mapping_fn` names (self-play rollouts).

`play_games` plays one `TwoPlayerGame` (`envs.textarena_two_player`) per seed. RLlib's convention decides
who plays each seat: `policy_mapping_fn(agent_id, episode, game_index=i)` returns a module id:
- an LLM module: the trained policy (`TRAINED_MODULE`), the snapshot of the policy the run started from
  (`FROZEN_MODULE`) or the league's snapshot, refreshed from the trained policy (`LEAGUE_MODULE`); each has its
  engine in `Seats.engines`, and the prompts of every LLM seat to move, over all games, go to each engine in
  ONE batched `generate` call per step;
- a scripted one, "random", "minimax" or "equilibrium" (`envs.textarena_two_player.SCRIPTED_POLICIES`): the
  game draws its move at once.

Each game is one turn-based `MultiAgentEpisode` whose agents are its trained seats (`player_0`,
`player_1`: both in self-play): a seat's turns are its own steps, with its own rewards (0 until the end,
then the game's final reward for that seat), and a seat's first observation opens its trajectory, whose
start names its role (`"<game>/<seat>"`, RAE's baseline key). The opponent's seat, frozen or scripted, is
no agent of the episode, so no reader of episodes (the learner, the metrics, the row counts) mistakes it
for training data; its moves appear in the trained seat's observations. Each game's outcome is also
returned as a `GameResult`.

A turn's answer is parsed as every answer is; its first action is the move (none: an invalid move, which
ends the game under SPIRAL's rule). Self-play uses the game's own rewards: no format penalty, no shaping.

With a `teacher`, no engine is called: the teacher writes every LLM seat's answer (an expert's, for a warm
start on self-play's own prompts, `rllib_ragen.data.game_demonstrations`), recorded as a sampled one would be,
with unknown (NaN) sampling log-probs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from envs.textarena_two_player import SCRIPTED_POLICIES, SEATS, TwoPlayerGame, seat_of
from rllib_ragen.inference.engine import Completion, InferenceEngine, SamplingParams
from rllib_ragen.rollout.prompt.prompt_protocol import PromptProtocol, ProtocolSettings
from rllib_ragen.rollout.prompt.token_history import ChatTemplate, TokenHistory
from rllib_ragen.rollout.trajectory_record import TrajectoryStart, TurnRecord, start_info, turn_info, turn_model_outputs

TRAINED_MODULE = DEFAULT_MODULE_ID
FROZEN_MODULE = "frozen_policy"
LEAGUE_MODULE = "league_policy"
# RLlib's policy_mapping_fn: (agent_id, episode, **kwargs) -> module id; here kwargs hold `game_index`.
PolicyMappingFn = Callable[..., str]
# Writes the answer of the seat to move (`game.current_seat`): its response token ids under that seat's protocol.
Teacher = Callable[[TwoPlayerGame, PromptProtocol], list[int]]


@dataclasses.dataclass(frozen=True)
class Seats:
    """What the LLM seats are played with.

    Attributes:
        engines: The engine serving each LLM module id (the trained policy's, a frozen snapshot's).
        protocols: Each seat's prompt protocol (its system prompt names its role).
        params: The sampling parameters of every LLM turn.
        max_prompt_len: The longest prompt that leaves room for a response.
    """

    engines: Mapping[str, InferenceEngine]
    protocols: Mapping[str, PromptProtocol]
    params: SamplingParams
    max_prompt_len: int


@dataclasses.dataclass(frozen=True)
class GameResult:
    """How one game ended.

    Attributes:
        seed: The game's seed.
        modules: The module id that played each seat.
        rewards: Each seat's final reward.
        chips: Kuhn Poker: each seat's net chips; None for other games.
        hands_opened: Kuhn Poker: each seat's (hands it opened, hands played); None for other games.
        forfeited_by: The seat whose invalid move ended the game (SPIRAL's rule); None if none did.
    """

    seed: int
    modules: dict[str, str]
    rewards: dict[str, float]
    chips: dict[str, float] | None = None
    hands_opened: dict[str, tuple[int, int]] | None = None
    forfeited_by: str | None = None


def play_games(
    games: Sequence[TwoPlayerGame],
    seeds: Sequence[int],
    policy_mapping_fn: PolicyMappingFn,
    seats: Seats | None,
    *,
    group_ids: Sequence[int],
    policy_version: int | None = 0,
    teacher: Teacher | None = None,
) -> tuple[list[MultiAgentEpisode], list[GameResult]]:
    """Plays `games[i]` from `seeds[i]` to its end, all at once (module docstring).

    Args:
        games: One game per seed (reset here).
        seeds: The games' seeds.
        policy_mapping_fn: Who plays each seat of each game.
        seats: The LLM seats' engines and prompts; None when every seat is scripted.
        group_ids: Each game's StarPO group id (its two seats share it).
        policy_version: The trained weights' version, recorded in every trajectory's start (None: nobody's).
        teacher: Writes every LLM seat's answer instead of the engines (demonstrations); None samples them.

    Returns:
        One episode per game (its LLM seats as agents), and each game's result.
    """
    if not len(games) == len(seeds) == len(group_ids):
        raise ValueError(f"need one seed and group id per game, got {len(games)}, {len(seeds)}, {len(group_ids)}")
    tables = [
        _GameTable(game, seed, i, policy_mapping_fn, seats, group_id=group_ids[i], policy_version=policy_version)
        for i, (game, seed) in enumerate(zip(games, seeds))
    ]
    live = [table for table in tables if not table.over]
    while live:
        if teacher is None:
            _play_llm_turns(live, seats)
        else:
            _teach_turns(live, teacher)
        live = [table for table in live if not table.over]
    return [table.episode for table in tables], [table.result() for table in tables]


def _play_llm_turns(tables: Sequence[_GameTable], seats: Seats | None) -> None:
    """One LLM turn of every table: each module's prompts in one batched engine call."""
    if seats is None:
        raise ValueError("a game seats an LLM module, but play_games got no engines (seats=None)")
    by_module: dict[str, list[_GameTable]] = {}
    for table in tables:
        by_module.setdefault(table.module_to_move, []).append(table)
    for module, waiting in by_module.items():
        if module not in seats.engines:
            raise ValueError(
                f"the policy mapping names module {module!r}, which no engine serves: {sorted(seats.engines)}"
            )
        prompts = [table.prompt_ids() for table in waiting]
        completions = seats.engines[module].generate(prompts, seats.params)
        for table, completion in zip(waiting, completions):
            table.answer(completion)


def _teach_turns(tables: Sequence[_GameTable], teacher: Teacher) -> None:
    """One turn of every table, answered by `teacher` (nobody sampled it: NaN log-probs)."""
    for table in tables:
        token_ids = teacher(table.game, table.protocol_to_move)
        table.answer(Completion(token_ids, [float("nan")] * len(token_ids), "stop"))


def seat_protocols(
    game: TwoPlayerGame, template: ChatTemplate, settings: ProtocolSettings
) -> dict[str, PromptProtocol]:
    """Each seat's prompt protocol: its system prompt names the game and the seat's role."""
    return {
        seat: PromptProtocol(template, instructions=game.instructions(seat), action_vocabulary=None, config=settings)
        for seat in SEATS
    }


class _GameTable:
    """One game in play: its modules per seat, its episode and its LLM seats' token histories."""

    def __init__(
        self,
        game: TwoPlayerGame,
        seed: int,
        index: int,
        policy_mapping_fn: PolicyMappingFn,
        seats: Seats | None,
        *,
        group_id: int,
        policy_version: int | None,
    ) -> None:
        self.game, self.seed, self.seats = game, seed, seats
        self.group_id, self.policy_version = group_id, policy_version
        probe = MultiAgentEpisode()
        self.modules = {seat: str(policy_mapping_fn(seat, probe, game_index=index)) for seat in SEATS}
        self.llm_seats = [seat for seat in SEATS if self.modules[seat] not in SCRIPTED_POLICIES]
        self.trained_seats = {seat for seat in SEATS if self.modules[seat] == TRAINED_MODULE}
        self.episode = MultiAgentEpisode(agent_module_ids=dict.fromkeys(sorted(self.trained_seats), TRAINED_MODULE))
        self.histories: dict[str, TokenHistory] = {}
        self.pending_info: dict[str, dict[str, Any]] = {seat: {} for seat in self.llm_seats}
        self.final_rewards: dict[str, float] | None = None
        self.started = False
        observations, _ = game.reset(seed=seed)
        self._advance(observations, acted={})

    @property
    def over(self) -> bool:
        return self.final_rewards is not None

    @property
    def module_to_move(self) -> str:
        return self.modules[self.game.current_seat]

    @property
    def protocol_to_move(self) -> PromptProtocol:
        return self._protocol(self.game.current_seat)

    def prompt_ids(self) -> list[int]:
        seat = self.game.current_seat
        prompt = self.histories[seat].prompt_ids()
        if self.seats is not None and len(prompt) > self.seats.max_prompt_len:
            raise ValueError(
                f"game {self.game.config.game!r} (seed {self.seed}): {seat}'s prompt is {len(prompt)} tokens, more "
                f"than max_model_len - response_length = {self.seats.max_prompt_len}; lower the self-play "
                "max_game_turns, set a history_window or raise .inference(max_model_len=...)"
            )
        return prompt

    def answer(self, completion: Completion) -> None:
        """Plays the LLM seat's sampled answer as its move."""
        seat = self.game.current_seat
        protocol = self._protocol(seat)
        text, parsed = protocol.parse(completion.token_ids)
        close_ids = protocol.close_ids(completion.token_ids)
        history = self.histories[seat]
        turn = TurnRecord(history.turns[-1].user_ids, close_ids, completion.logprobs, text)
        history.add_response(completion.token_ids, completion.logprobs, close_ids)
        self.pending_info[seat] = {
            **turn_info(turn),
            "format_ok": parsed.format_ok,
            "parsed_actions": list(parsed.actions),
            "finish_reason": completion.finish_reason,
        }
        action = {seat: (np.asarray(completion.token_ids, dtype=np.int32), turn_model_outputs(turn))}
        observations, rewards, terminateds, _, infos = self.game.step(
            {seat: parsed.actions[0] if parsed.actions else ""}
        )
        moved = self.game.last_move
        self.pending_info[seat].update(
            action_is_valid=moved["action_is_valid"],
            game_action=moved["game_action"],
            # What every trajectory's statistics and failure kinds read (`trajectory_record.turn_validity`).
            num_valid_actions=int(bool(parsed.actions) and moved["action_is_valid"]),
        )
        if terminateds["__all__"]:
            self._finish(observations, rewards, infos, acted=action)
        else:
            self._advance(observations, acted=action)

    def _advance(self, observations: dict[str, str], *, acted: dict[str, tuple[np.ndarray, dict]]) -> None:
        """Plays scripted seats until an LLM seat is to move (or the game ends), then records the step."""
        while self.modules[self.game.current_seat] in SCRIPTED_POLICIES:
            seat = self.game.current_seat
            observations, rewards, terminateds, _, infos = self.game.step(
                {seat: self.game.scripted_move(self.modules[seat])}
            )
            if terminateds["__all__"]:
                self._finish(observations, rewards, infos, acted=acted)
                return
        seat = self.game.current_seat
        observation = observations[seat]
        info = self._observe(seat, observation)
        self._record({seat: observation}, {seat: info}, acted, rewards={}, done=False)

    def _observe(self, seat: str, observation: str) -> dict[str, Any]:
        """Adds the seat's observation to its history (opening it on its first); returns the info to record."""
        protocol = self._protocol(seat)
        info = self.pending_info.pop(seat, {})
        self.pending_info[seat] = {}
        if seat not in self.histories:
            self.histories[seat] = TokenHistory(protocol.system_ids, protocol.config.history_window)
            role = self._role(seat)
            start = TrajectoryStart(protocol.system_ids, self.group_id, self.policy_version, role)
            info = {**start_info(start), "seed": self.seed}
        self.histories[seat].add_user(protocol.user_ids(observation))
        return info

    def _role(self, seat: str) -> str:
        """RAE's baseline key of `seat`: "<game>/<seat>" in self-play, "<game>/<seat>/vs_<module>" against any
        other player (a league's opponents differ in strength: one baseline for all would credit a draw
        against the expert with the mean of the wins against random play)."""
        other = self.modules[SEATS[1 - seat_of(seat)]]
        role = f"{self.game.config.game}/{seat}"
        return role if other == TRAINED_MODULE else f"{role}/vs_{other}"

    def _finish(
        self,
        observations: dict[str, str],
        rewards: dict[str, float],
        infos: dict[str, dict],
        *,
        acted: dict[str, tuple[np.ndarray, dict]],
    ) -> None:
        self.final_rewards = {seat: float(rewards[seat]) for seat in SEATS}
        finals = {}
        for seat in self.llm_seats:
            if seat not in self.histories:  # the game ended before this seat's first turn: no trajectory
                continue
            finals[seat] = {**self.pending_info.get(seat, {}), **infos.get(seat, {})}
        self._record(
            {seat: observations[seat] for seat in finals},
            finals,
            acted,
            rewards={seat: self.final_rewards[seat] for seat in finals},
            done=True,
        )

    def _record(
        self,
        observations: dict[str, str],
        infos: dict[str, dict],
        acted: dict[str, tuple[np.ndarray, dict]],
        *,
        rewards: dict[str, float],
        done: bool,
    ) -> None:
        """One step of the turn-based episode: the acting seat's action, the next observation(s), of the
        trained seats only."""
        observations = {seat: value for seat, value in observations.items() if seat in self.trained_seats}
        infos = {seat: value for seat, value in infos.items() if seat in self.trained_seats}
        acted = {seat: value for seat, value in acted.items() if seat in self.trained_seats}
        rewards = {seat: value for seat, value in rewards.items() if seat in self.trained_seats}
        if not self.started:
            if not observations:
                return  # no LLM seat ever observed: an all-scripted game has an empty episode
            self.episode.add_env_reset(observations=observations, infos=infos)
            self.started = True
            return
        flags = {seat: True for seat in observations} if done else {}
        self.episode.add_env_step(
            observations=observations,
            actions={seat: ids for seat, (ids, _) in acted.items()},
            rewards={**{seat: 0.0 for seat in acted}, **rewards},
            infos=infos,
            terminateds={**flags, "__all__": done},
            truncateds={"__all__": False},
            extra_model_outputs={seat: outputs for seat, (_, outputs) in acted.items()},
        )

    def _protocol(self, seat: str) -> PromptProtocol:
        if self.seats is None:
            raise ValueError(f"{seat} is played by LLM module {self.modules[seat]!r}, but play_games got no engines")
        return self.seats.protocols[seat]

    def result(self) -> GameResult:
        if self.final_rewards is None:
            raise RuntimeError(f"game {self.game.config.game!r} (seed {self.seed}) has not ended")
        forfeited_by = self.game.forfeited_by
        result = GameResult(self.seed, dict(self.modules), dict(self.final_rewards), forfeited_by=forfeited_by)
        if not self.game.config.game.startswith("KuhnPoker"):
            return result
        chips = {seat: self.game.chips(seat) for seat in SEATS}
        return dataclasses.replace(result, chips=chips, hands_opened={s: self.game.hands_opened(s) for s in SEATS})
