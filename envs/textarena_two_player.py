"""A two-player TextArena game as an RLlib turn-based multi-agent env: one agent id per seat.

`TwoPlayerGame` follows RLlib's turn-based convention (`MultiAgentEnv`): the
agents are `player_0` and `player_1` (TextArena's player ids 0 and 1); `reset`
and `step` return an observation for the seat that acts next only, and `step`
takes that seat's move. When the game ends, both seats get their final reward
and observation and are terminated.

- observations: what TextArena shows the seat since its last move (its rules
  and role with the first; the opponent's moves as `[Player 1] [4]`);
- moves: the parsed `<answer>`, put in square brackets as `envs.textarena`
  does (an empty answer is an invalid move);
- invalid moves, with `invalid_move_ends_game` (SPIRAL's rule, the default):
  the game ends, the offender gets `invalid_move_reward` (-1.5) and the other
  seat `opponent_invalid_reward` (+0.5); without it the seat moves again (the
  caller's turn budget bounds the retries) and the game's own rewards stand;
- the turn cap: after `max_game_turns` moves (both seats' together, the
  opening's included) the game ends in a draw (0 each), as SPIRAL's cap does;
- a random opening (`max_opening_moves`, off by default): each reset draws a
  number of moves from 0 to `max_opening_moves` and plays that many of the
  moves the game lists, at random, for the seats in turn; a seat's first
  observation then holds every message of the opening;
- rewards: the game's final ones (win 1, loss -1, draw 0; Kuhn Poker's too);
- the render (`render`): "game" shows TextArena's own messages; "board" shows the current state only, with
  the rules in the system prompt: TicTacToe's board in four short lines (`envs.tictactoe_board_text`), a
  whole state in about 42 tokens where TextArena's messages take 150-470; Kuhn Poker's hand in three
  (`envs.kuhn_board_text`).

Scripted seats (`scripted_move`) draw their moves here, from the game's
state: "random" (a uniformly random listed move, from the env's own stream),
"minimax" (`envs.tictactoe_minimax`, TicTacToe only) or "equilibrium"
(`envs.kuhn_equilibrium`, Kuhn Poker only, its mixed moves from the env's stream).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np
from ray.rllib.env.multi_agent_env import MultiAgentEnv

from envs.base import build_config
from envs.kuhn_board_text import kuhn_instructions, kuhn_text
from envs.kuhn_equilibrium import equilibrium_move
from envs.textarena import game_action, make_game
from envs.textarena_isolation import GameSandbox
from envs.textarena_opponent import candidate_moves
from envs.tictactoe_board_text import board_instructions, board_text
from envs.tictactoe_minimax import minimax_move
from envs.user_errors import UserError

SEATS = ("player_0", "player_1")
SCRIPTED_POLICIES = ("random", "minimax", "equilibrium")
RENDERS = ("game", "board")
# The games the board render draws: TextArena ids start with these.
_BOARD_GAMES = ("TicTacToe", "KuhnPoker")
# The game each expert plays: TextArena ids start with these.
_EXPERT_GAMES = {"minimax": "TicTacToe", "equilibrium": "KuhnPoker"}
# How TextArena 0.7.4's KuhnPoker reads a move.
_KUHN_MOVE = re.compile(r"\[(Check|Bet|Fold|Call)\]", re.IGNORECASE)
_SEED_BOUND = 2**31
_GAME_SENDER = -1


def seat_of(agent: str) -> int:
    """TextArena's player id of an agent id (`player_1` -> 1)."""
    if agent not in SEATS:
        raise ValueError(f"unknown seat {agent!r}; the seats are {SEATS}")
    return SEATS.index(agent)


@dataclasses.dataclass(frozen=True)
class TwoPlayerConfig:
    """Which two-player TextArena game, and the self-play rules (module docstring).

    Attributes:
        game: TextArena's id of a two-player game, e.g. "TicTacToe-v0" or "KuhnPoker-v0".
        game_options: Keyword arguments of the game's constructor, over those its id registers, e.g.
            `{"max_rounds": 1}`: Kuhn Poker as Kuhn defined it, one hand a game (KuhnPoker-v0 registers 3).
        invalid_move_ends_game: SPIRAL's rule: an invalid move ends the game.
        invalid_move_reward: The offender's reward when an invalid move ends the game.
        opponent_invalid_reward: The other seat's reward then.
        max_game_turns: Moves (both seats') after which the game is a draw.
        max_opening_moves: Random listed moves that may open a game (module docstring): varied starts, so
            that games between near-deterministic seats do not all repeat one line of play.
        render: What a seat is shown (module docstring): "game" (TextArena's messages) or "board" (TicTacToe
            and Kuhn Poker: the state alone).
    """

    game: str = "TicTacToe-v0"
    game_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    invalid_move_ends_game: bool = True
    invalid_move_reward: float = -1.5
    opponent_invalid_reward: float = 0.5
    max_game_turns: int = 30
    max_opening_moves: int = 0
    render: str = "game"

    def __post_init__(self) -> None:
        if not isinstance(self.game, str) or not self.game:
            raise UserError(f"game must be a TextArena game id such as 'TicTacToe-v0', got {self.game!r}")
        if not isinstance(self.game_options, dict) or not all(isinstance(key, str) for key in self.game_options):
            raise UserError(f"game_options must be a dict of the game's keyword arguments, got {self.game_options!r}")
        if self.max_game_turns < 1:
            raise UserError(f"max_game_turns must be >= 1, got {self.max_game_turns}")
        if not 0 <= self.max_opening_moves < self.max_game_turns:
            raise UserError(
                f"max_opening_moves must be from 0 to max_game_turns - 1 = {self.max_game_turns - 1}, "
                f"got {self.max_opening_moves}"
            )
        if self.render not in RENDERS:
            raise UserError(f"render must be one of {RENDERS}, got {self.render!r}")
        if self.render == "board" and not self.game.startswith(_BOARD_GAMES):
            raise UserError(
                f"the board render draws {' and '.join(_BOARD_GAMES)} only, not {self.game!r}: use render='game'"
            )


class TwoPlayerGame(MultiAgentEnv):
    """One two-player TextArena game, one agent per seat (module docstring)."""

    def __init__(self, config: TwoPlayerConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        self.config: TwoPlayerConfig = build_config(TwoPlayerConfig, config, overrides)
        self.sandbox = GameSandbox(game=self.config.game)
        self.game = self.sandbox.call(lambda: make_game(self.config.game, self.config.game_options))
        self.agents = self.possible_agents = list(SEATS)
        self.rng = np.random.default_rng(0)
        self.moves = 0
        # The last step's move as the mover made it (`action_is_valid`, `game_action`): the step's infos
        # go to the seats that observe next, which are the mover's only when the game ended.
        self.last_move: dict[str, Any] = {}
        # The seat whose invalid move ended the game (SPIRAL's rule), else None: what tells a forfeit from a loss.
        self.forfeited_by: str | None = None
        self._seen: dict[str, list[str]] = {seat: [] for seat in SEATS}

    @property
    def current_seat(self) -> str:
        """The agent id of the seat to move."""
        return SEATS[int(self.game.state.current_player_id)]

    @property
    def done(self) -> bool:
        return bool(self.game.state.done) or self.moves >= self.config.max_game_turns

    def instructions(self, agent: str) -> str:
        """The system prompt's task for one seat: its role is told here and in the game's first message."""
        if self.config.render == "board" and self.config.game.startswith("KuhnPoker"):
            return kuhn_instructions(seat_of(agent), int(self.game.max_rounds))
        if self.config.render == "board":
            return board_instructions(seat_of(agent))
        return (
            f"You are playing {self.config.game}, a two-player TextArena game, as Player {seat_of(agent)}. "
            "Its rules come with the first state; each later state shows what happened since your last move. "
            "Write each move as the game asks for it, e.g. [4]; the square brackets may be left out."
        )

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if options:
            raise ValueError(f"unknown two-player reset option(s) {sorted(options)}; it takes none")
        self.rng = np.random.default_rng(seed)
        game_seed = int(self.rng.integers(_SEED_BOUND))
        self.sandbox.seed(seed=game_seed)
        self.sandbox.call(lambda: self.game.reset(num_players=2, seed=game_seed))
        if self.config.invalid_move_ends_game:
            self.game.state.error_allowance = 0  # the first invalid move ends the game (SPIRAL)
        else:
            self.game.state.error_allowance = math.inf
        self.moves = 0
        self.last_move = {}
        self.forfeited_by = None
        self._seen = {seat: [] for seat in SEATS}
        self._play_opening()
        seat = self.current_seat
        return {seat: self._observe(seat)}, {seat: {}}

    def _play_opening(self) -> None:
        """Plays 0 to `max_opening_moves` random listed moves (the reset seed's stream); their messages stay queued."""
        for _ in range(int(self.rng.integers(self.config.max_opening_moves + 1))):
            seat = self.current_seat
            queued = self.game.state.observations[seat_of(seat)]
            moves = candidate_moves([str(text) for _, text, _ in queued[-1:]])
            if not moves:
                raise UserError(f"game {self.config.game!r} listed no move to open with: max_opening_moves needs one")
            move = str(self.rng.choice(moves))
            self._play(move)
            self.moves += 1
            if self.game.state.done or self.game.state.error_count:
                raise UserError(
                    f"a random opening of game {self.config.game!r} ended it at move {self.moves}: lower "
                    f"max_opening_moves (now {self.config.max_opening_moves})"
                )

    def step(self, action_dict: dict[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        seat = self.current_seat
        if set(action_dict) != {seat}:
            raise ValueError(f"it is {seat}'s turn; step got moves for {sorted(action_dict)}")
        move = game_action(action_dict[seat])
        errors_before = self.game.state.error_count
        self._play(move)
        self.moves += 1
        invalid = bool(self.game.state.game_info[seat_of(seat)].get("invalid_move")) or (
            self.game.state.error_count > errors_before
        )
        info = {"action_is_valid": not invalid, "game_action": move}
        self.last_move = info
        if not self.done:
            nxt = self.current_seat
            return {nxt: self._observe(nxt)}, {nxt: 0.0}, {"__all__": False}, {"__all__": False}, {nxt: info}
        rewards = self._final_rewards(seat, invalid)
        observations = {agent: self._observe(agent) for agent in SEATS}
        infos = {agent: {"success": rewards[agent] >= 1.0, "outcome": _outcome(rewards[agent])} for agent in SEATS}
        infos[seat].update(info)
        flags = {agent: True for agent in SEATS} | {"__all__": True}
        return observations, rewards, flags, {agent: False for agent in SEATS} | {"__all__": False}, infos

    def _play(self, move: str) -> None:
        """Plays `move` for the seat to move; in Kuhn Poker its bet or call first goes into the pot (below)."""
        if self.config.game.startswith("KuhnPoker"):
            self._pay_kuhn_stake(move)
        self.sandbox.call(lambda: self.game.step(move))

    def _pay_kuhn_stake(self, move: str) -> None:
        """A legal bet or call puts the mover's chip into the pot. TextArena 0.7.4 (the version pinned) forgets
        it, though its rules state it: every hand then moves one chip however it is played, and folding only
        loses. Later TextArena versions pay it themselves, so this goes with the pin."""
        state = self.game.state.game_state
        found = _KUHN_MOVE.search(move)
        word = found.group(1).lower() if found else None
        if word in ("bet", "call") and word in state["current_legal_action_tree"]:
            state["player_chips"][int(self.game.state.current_player_id)] -= 1
            state["pot"] += 1

    def _final_rewards(self, mover: str, invalid: bool) -> dict[str, float]:
        if invalid and self.config.invalid_move_ends_game:
            self.forfeited_by = mover
            other = SEATS[1 - seat_of(mover)]
            return {mover: self.config.invalid_move_reward, other: self.config.opponent_invalid_reward}
        if not self.game.state.done:  # the turn cap: a draw
            return {agent: 0.0 for agent in SEATS}
        rewards = self.game.state.rewards or {}
        return {agent: float(rewards.get(seat_of(agent), 0.0)) for agent in SEATS}

    def chips(self, agent: str) -> float:
        """Kuhn Poker: the seat's net chips this game (its stack less the mean, as the game is zero-sum)."""
        stacks = self.game.state.game_state.get("player_chips")
        if stacks is None:
            raise ValueError(f"game {self.config.game!r} keeps no chips")
        return float(stacks[seat_of(agent)] - (stacks[0] + stacks[1]) / 2)

    def hands_opened(self, agent: str) -> tuple[int, int]:
        """Kuhn Poker: (hands the seat opened, hands played); round r (from 1) is opened by player r % 2."""
        rounds = int(self.game.max_rounds)
        return sum(1 for r in range(1, rounds + 1) if r % 2 == seat_of(agent)), rounds

    def scripted_move(self, policy: str) -> str:
        """The move a scripted seat plays now: "random", "minimax" (TicTacToe) or "equilibrium" (Kuhn Poker)."""
        seat = self.current_seat
        if policy in _EXPERT_GAMES:
            if not self.config.game.startswith(_EXPERT_GAMES[policy]):
                raise UserError(f"the {policy} opponent plays {_EXPERT_GAMES[policy]} only, not {self.config.game!r}")
            if policy == "minimax":
                return f"[{minimax_move(self.game.state.game_state['board'], seat_of(seat))}]"
            return equilibrium_move(self.game.state.game_state, seat_of(seat), self.rng)
        if policy != "random":
            raise UserError(f"unknown scripted policy {policy!r}; choose one of {SCRIPTED_POLICIES}")
        moves = candidate_moves(self._seen[seat][-1:]) or candidate_moves(self._seen[seat])
        if not moves:
            raise RuntimeError(f"game {self.config.game!r} showed {seat} no bracketed move to draw from")
        return str(self.rng.choice(moves))

    def _observe(self, agent: str) -> str:
        """The seat's new messages as text (its own moves left out), also kept as what it has seen (what the
        random seat draws its moves from, whatever the render); with the board render, the board instead."""
        player = seat_of(agent)
        state = self.game.state
        texts = []
        for sender, text, kind in state.observations[player]:
            if getattr(kind, "name", "") != "PLAYER_ACTION":
                texts.append(str(text))
            elif sender not in (player, _GAME_SENDER):
                texts.append(f"[Player {sender}] {text}")
        state.observations[player] = []
        if self.done:
            reason = state.game_info[player].get("reason", "") if state.done else "the turn limit was reached"
            texts.append(f"Game over: {reason or 'draw'}")
        self._seen[agent] += texts
        if self.config.render == "board":
            ending = texts[-1:] if self.done else []
            return "\n".join([self._state_text(player), *ending])
        return "\n".join(t.strip() for t in texts)

    def _state_text(self, player: int) -> str:
        """The board render's state for `player`: TicTacToe's board, or Kuhn Poker's hand."""
        state = self.game.state.game_state
        if self.config.game.startswith("KuhnPoker"):
            return kuhn_text(state, player, int(self.game.max_rounds), over=self.done)
        return board_text(state["board"])


def _outcome(reward: float) -> str:
    return "win" if reward > 0 else "loss" if reward < 0 else "draw"
