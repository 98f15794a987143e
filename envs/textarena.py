"""TextArena games as TextEnvs: the env name `textarena:GuessTheNumber-v0`.

`resolve_game` (the registry's resolver for the `textarena:` scheme) checks
the game id against TextArena's registry and returns `TextArenaEnv` with the
game as its config. The game is TextArena's own, unwrapped (its default
wrappers reformat observations and actions, which this adapter does itself):

- actions: the `<answer>` our protocol parses is the game's move; TextArena
  reads moves in square brackets, so an action without any is put in them
  (`5` -> `[5]`, `A C` -> `[A C]`) and one that has them is passed as is;
- observations: what the game shows the player, passed through: on reset its
  rules and opening messages, after each move that turn's messages (or, with
  `observation="full"`, every message so far: for Markov prompts, which show
  the latest state only); the player's own move is not echoed back;
- invalid moves: a move the game refuses (it says why, in the next state)
  leaves the game as it was, with reward 0 and `action_is_valid=False`, so a
  turn without a valid move gets our format penalty. TextArena would end the
  game after a game-specific number of invalid moves; here the turn and action
  budgets bound them instead (the game's allowance is lifted);
- rewards: 0 until the game ends, then the game's final reward for the player
  (1 a win; a loss is 0 or -1, or the game's share of completion, e.g. how close
  the last guess was); `success` is a win, a final reward of at least 1.

Two-player games are played against the fixed opponent `opponent` names
(`envs.textarena_opponent`); the agent is player 0. Games for more players are
refused. Each env keeps its game's randomness to itself
(`envs.textarena_isolation`), so episodes are a function of the seed, and
games that would download data at run time fail with an error saying so.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from envs.base import TextEnv, build_config
from envs.textarena_isolation import GameSandbox
from envs.textarena_opponent import OPPONENTS, candidate_moves, play_random_move
from envs.user_errors import UserError

INSTALL_HINT = "bash scripts/install.sh cpu,textarena"
OBSERVATIONS = ("turn", "full")
AGENT = 0  # the agent's player id; a two-player game's opponent is 1
GAME_SENDER = -1  # textarena.GAME_ID, the sender of the game's own messages (some games echo moves as theirs)
# Game seeds stay below 2**31: some games add to the seed or hand it to numpy's legacy seeding.
_SEED_BOUND = 2**31


@dataclasses.dataclass(frozen=True)
class TextArenaConfig:
    """Which TextArena game, and how it is shown.

    Attributes:
        game: TextArena's id of the game, e.g. "GuessTheNumber-v0" (the env
            name `textarena:GuessTheNumber-v0` sets it).
        observation: "turn" (each state is that turn's game messages; the rules
            come with the first) or "full" (every message so far, rules included).
        opponent: the fixed opponent of a two-player game (`envs.textarena_opponent.OPPONENTS`).
    """

    game: str = "GuessTheNumber-v0"
    observation: str = "turn"
    opponent: str = "random"

    def __post_init__(self) -> None:
        if not isinstance(self.game, str) or not self.game:
            raise ValueError(f"game must be a TextArena game id such as 'GuessTheNumber-v0', got {self.game!r}")
        if self.observation not in OBSERVATIONS:
            raise ValueError(f"observation must be one of {OBSERVATIONS}, got {self.observation!r}")
        if self.opponent not in OPPONENTS:
            raise ValueError(f"opponent must be one of {OPPONENTS}, got {self.opponent!r}")


def resolve_game(game: str) -> tuple[type[TextArenaEnv], dict[str, Any]]:
    """The registry's resolver for `textarena:GAME`: `(TextArenaEnv, {"game": GAME})`.

    Builds the game once, so that an unknown game (KeyError, with close
    matches), a missing textarena package (ImportError, with the install
    command) or a game that downloads data at run time (`GameNeedsDownload`)
    fails here, where the name is checked, rather than in an env runner.
    """
    GameSandbox(game=game).call(lambda: make_game(game))
    return TextArenaEnv, {"game": game}


def make_game(game: str, options: Mapping[str, Any] | None = None) -> Any:
    """TextArena's game `game`, built with its constructor's keyword arguments `options` (e.g. KuhnPoker's
    `{"max_rounds": 1}`), without its default wrappers (call it inside the game's sandbox)."""
    textarena = _import_textarena(game)
    registry = textarena.envs.registration.ENV_REGISTRY
    if game not in registry:
        close = difflib.get_close_matches(game, list(registry), n=5)
        raise KeyError(
            f"unknown TextArena game {game!r}: textarena {textarena.__version__} has no such id"
            + (f"; close matches: {close}" if close else "")
            + " (the games tried here: docs/textarena.md)"
        )
    try:
        wrapped = textarena.make(game, **(options or {}))
    except TypeError as error:  # an option the game's constructor does not take
        entry_point = registry[game].entry_point
        given = dict(options or {})
        raise UserError(f"TextArena game {game!r} ({entry_point}) refused the options {given}: {error}") from None
    while isinstance(wrapped, textarena.Wrapper):
        wrapped = wrapped.env
    return wrapped


def _import_textarena(game: str) -> Any:
    try:
        return importlib.import_module("textarena")
    except ImportError as error:
        raise ImportError(
            f"env 'textarena:{game}' needs the optional textarena package ({error}); install it with {INSTALL_HINT}"
        ) from None


def game_action(answer: str) -> str:
    """The game's move for one parsed answer: in square brackets unless it has some already."""
    text = answer.strip()
    return text if "[" in text and "]" in text else f"[{text}]"


class TextArenaEnv(TextEnv):
    """One TextArena game (module docstring); build it by name: `make_env("textarena:GuessTheNumber-v0")`."""

    config_class = TextArenaConfig

    def __init__(self, config: TextArenaConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        self.config: TextArenaConfig = build_config(TextArenaConfig, config, overrides)
        self.sandbox = GameSandbox(game=self.config.game)
        self.game = self.sandbox.call(lambda: make_game(self.config.game))
        self.num_players: int | None = None  # found on the first reset
        self._seen: list[str] = []  # every message shown to the agent this episode
        self._shown: list[str] = []  # the current state's messages
        self._opponent_seen: list[str] = []

    @property
    def instructions(self) -> str:
        # The same before and after a reset: the system prompt is written before any episode.
        return (
            f"You are playing {self.config.game}, a TextArena game (in a two-player game you are Player 0, "
            f"against a {self.config.opponent} opponent). Its rules come with the first state; each later state "
            "shows what the game says after your move. Write each move as the game asks for it, e.g. [5]; the "
            "square brackets may be left out: 5 means [5]."
        )

    def random_action(self, rng: np.random.Generator) -> str:
        """A bracketed move the game has shown so far (its listed or example moves), drawn with `rng`."""
        moves = candidate_moves(self._seen)
        if not moves:
            raise ValueError(f"TextArena game {self.config.game!r} has shown no bracketed move to draw from")
        return str(rng.choice(moves))

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> dict[str, Any]:
        if options:
            raise ValueError(f"unknown TextArena reset option(s) {sorted(options)}; it takes none")
        game_seed = int(rng.integers(_SEED_BOUND))
        self.num_players = self._reset_game(game_seed)
        # Draws after the start come from the dynamics stream (envs.base: group members may draw apart).
        assert self.dynamics_rng is not None, "TextEnv.reset sets dynamics_rng before _reset"
        self.sandbox.seed(seed=int(self.dynamics_rng.integers(_SEED_BOUND)))
        self._seen, self._opponent_seen = [], []
        self.sandbox.call(self._opponent_turns)
        self._shown = self._take_messages()
        return {"success": False}

    def _reset_game(self, game_seed: int) -> int:
        """Resets the game with `game_seed`; returns its number of players (1, else 2)."""
        single_player = _import_textarena(self.config.game).SinglePlayerState
        refusal: Exception | None = None
        for players in [self.num_players] if self.num_players else [1, 2]:
            self.sandbox.seed(seed=game_seed)
            try:
                self.sandbox.call(functools.partial(self.game.reset, num_players=players, seed=game_seed))
            except (AssertionError, ValueError) as error:  # how TextArena's games refuse a number of players
                refusal = error
                continue
            # Some games ignore the number they are given: a game is for one player if its state is.
            if players == 2 or isinstance(self.game.state, single_player):
                # Invalid moves never end the game here (module docstring).
                self.game.state.error_allowance = math.inf
                return players
        raise ValueError(
            f"TextArena game {self.config.game!r} is for more than two players (it refused one and two: "
            f"{refusal!r}); only one- and two-player games are supported"
        )

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        move = game_action(action)
        done = self.sandbox.call(lambda: self._play(move))
        valid = self.game.state.error_count == 0 or done
        self._shown = self._take_messages()
        reward = self._final_reward() if done else 0.0
        if done:
            ending = f"Game over: {self.game.state.game_info[AGENT].get('reason', '')}".rstrip()
            self._shown.append(ending)
            self._seen.append(ending)
        return reward, done, False, {"action_is_valid": valid, "success": reward >= 1.0, "game_action": move}

    def _play(self, move: str) -> bool:
        """The agent's move, then the opponent's until it is the agent's turn again; returns the game's done."""
        done, _ = self.game.step(move)
        return bool(done) or self._opponent_turns()

    def _opponent_turns(self) -> bool:
        """Plays the opponent while it is its turn; returns whether the game ended."""
        state = self.game.state
        while not state.done and state.current_player_id != AGENT:
            opponent = state.current_player_id
            self._opponent_seen += [text for _, text, _ in _pop_messages(state, opponent)]
            play_random_move(messages=self._opponent_seen, try_move=self._opponent_move, game=self.config.game)
        return bool(state.done)

    def _opponent_move(self, move: str) -> bool:
        """Steps the opponent's `move`; False when the game refused it."""
        self.game.step(move)
        return self.game.state.done or self.game.state.error_count == 0

    def _take_messages(self) -> list[str]:
        """The agent's new messages as text (its own move left out), also appended to what it has seen."""
        state = self.game.state
        texts = []
        for sender, text, kind in _pop_messages(state, AGENT):
            if not isinstance(text, str) or not hasattr(kind, "name"):
                raise RuntimeError(
                    f"TextArena game {self.config.game!r} queued a malformed message {(sender, text, kind)!r} "
                    "(its code passes the message's parts in the wrong order): it cannot be played here"
                )
            if kind.name != "PLAYER_ACTION":
                texts.append(text)
            elif sender not in (AGENT, GAME_SENDER):  # the opponent's move; the agent's own is not echoed
                texts.append(f"[{state.role_mapping.get(sender, f'Player {sender}')}] {text}")
        self._seen += texts
        return texts

    def _final_reward(self) -> float:
        rewards = self.game.state.rewards or {}
        return float(rewards.get(AGENT, 0.0))

    def render_text(self) -> str:
        shown = self._seen if self.config.observation == "full" else self._shown
        return "\n".join(text.strip() for text in shown)


def _pop_messages(state: Any, player: int) -> list[tuple[int, str, Any]]:
    """The messages the game has queued for `player` since the last call, which empties the queue."""
    messages: list[tuple[int, str, Any]] = state.observations[player]
    state.observations[player] = []
    return messages
