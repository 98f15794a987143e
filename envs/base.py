"""The text-MDP contract every environment follows.

A `TextEnv` is a gymnasium env whose observations and actions are strings: the
state is rendered as text for the LLM, and each action is one action phrase
the model wrote (e.g. "Up" for Sokoban, "3+5*2" for Countdown). Several
actions in one model answer are stepped one by one by the caller.

Invalid actions never raise: `step` returns the unchanged state, reward 0 and
`info["action_is_valid"] = False`. They do not count toward `max_steps`
either (nothing happened in the world); the caller's per-turn and
per-trajectory action budgets bound how many a policy can emit.

Determinism: `reset(seed=s)` seeds `self.np_random` exactly as
`np.random.default_rng(s)` would and hands it to `_reset`, so the initial
state is a pure function of `s`. Later randomness (slips, payouts) is drawn
from `self.dynamics_rng`: by default that is the same generator, so the whole
episode is a pure function of `s`; with the reset option
`{DYNAMICS_STREAM: k}` it is a separate stream seeded from `(s, k)`, so
envs reset with one seed but different `k` start alike and then draw their
own slips and payouts (a StarPO group's members, `group_randomness="independent"`).
The global numpy/random state is never touched.
"""

from __future__ import annotations

import abc
import ast
import dataclasses
import numbers
import typing
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from envs.board import Board

# Characters the text spaces accept: printable ASCII plus the symbols the
# renders use (box/player on target, newline).
_CHARSET = frozenset([chr(c) for c in range(32, 127)] + ["\n", "√"])
MAX_TEXT_LENGTH = 8192
# Reset option every TextEnv accepts: the index of the dynamics random stream (see above).
DYNAMICS_STREAM = "dynamics_stream"
# Info keys of the optional picture protocol: the state's board (`Board.to_json`), after every
# reset and step; the env's own failure kinds, in the reset info.
BOARD_INFO = "board"
FAILURE_KINDS_INFO = "failure_kinds"
# Step-info key: the env ended the episode (a trajectory's end may also be the caller's budget).
TERMINATED_INFO = "terminated"

# Failure kinds every env shares (`rllib_ragen.rollout.trajectory_record` tells them apart): kind -> what happened.
INVALID_ANSWER = "invalid_answer"
REPEATED_NO_OP = "repeated_no_op"
ENDED_UNSOLVED = "ended_unsolved"
OUT_OF_TURNS = "out_of_turns"
PROMPT_TOO_LONG = "prompt_too_long"
ENV_ERROR = "env_error"
FAILURE_KINDS: dict[str, str] = {
    INVALID_ANSWER: "invalid answer: the last answer held no valid action",
    REPEATED_NO_OP: "repeated no-op: the last moves (two or more) changed nothing",
    ENDED_UNSOLVED: "the env ended the episode unsolved (e.g. a wrong final answer)",
    OUT_OF_TURNS: "ran out of turns: the turn or action budget, or the env's own step limit, ran out",
    PROMPT_TOO_LONG: "the next prompt would not fit the model's context",
    ENV_ERROR: "the env failed (an error, a timeout or malformed output)",
}


class TextEnv(gym.Env, abc.ABC):
    """A text MDP: `reset(seed=...)` and `step(action_text)` speak strings.

    Subclasses set `config_class` (a frozen dataclass validated in
    `__post_init__`), implement the `instructions` property (the task, symbol
    legend and actions, shown once in the system prompt; the answer format is
    added by the prompt builder), optionally `action_vocabulary` (exact action
    names, `None` for free-form actions such as equations), and implement
    `_reset`, `_step` and `render_text`.

    Randomness after the reset (transitions, payouts) must come from
    `self.dynamics_rng`, never from the `rng` given to `_reset`, so that the
    `DYNAMICS_STREAM` reset option can give each group member its own draws.

    `info` always carries `success` (bool: the task is solved) and, after
    `step`, `action_is_valid` (bool: the action was understood and legal) and
    `terminated` (bool: the env ended the episode, as step's `terminated`).
    Stepping before `reset` or after the episode ended raises RuntimeError.

    Optional, for the trajectory page and the failure counts: `board` draws the
    state (`envs.board`; `info[BOARD_INFO]` after every reset and step), and
    `failure_kinds` names the env's own ways to fail (a board's `fault`) and
    words of its own for the shared ones (`FAILURE_KINDS`).
    """

    # gymnasium declares metadata an instance attribute, though every env sets it on the class.
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}  # type: ignore[misc]
    render_mode = "ansi"
    config_class: ClassVar[type | None] = None
    # Failure kind -> what happened: the env's own (its boards' faults), and its words for shared ones.
    failure_kinds: ClassVar[Mapping[str, str]] = {}

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = gym.spaces.Text(max_length=MAX_TEXT_LENGTH, min_length=0, charset=_CHARSET)
        self.action_space = gym.spaces.Text(max_length=MAX_TEXT_LENGTH, min_length=0, charset=_CHARSET)
        self._episode_open = False
        self.dynamics_rng: np.random.Generator | None = None

    @property
    @abc.abstractmethod
    def instructions(self) -> str:
        """What the task is, the symbol legend and the available actions."""

    @property
    def action_vocabulary(self) -> tuple[str, ...] | None:
        """The exact action names, or None when actions are free-form text."""
        return None

    @property
    def available_actions(self) -> tuple[str, ...] | None:
        """The action names that are valid in the current state (default: the whole vocabulary)."""
        return self.action_vocabulary

    def random_action(self, rng: np.random.Generator) -> str:
        """A valid action drawn at random in the current state (for format warm starts).

        Envs with free-form actions override this; the default draws from `available_actions`.
        """
        if not self.available_actions:
            raise ValueError(
                f"{type(self).__name__} has free-form actions: override random_action to use it in a warm start"
            )
        return str(rng.choice(self.available_actions))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Starts an episode from `seed`; `options` are the env's, plus `DYNAMICS_STREAM` (module docstring)."""
        options = dict(options or {})
        stream = options.pop(DYNAMICS_STREAM, None)
        super().reset(seed=seed)
        self.dynamics_rng = self.np_random if stream is None else dynamics_generator(seed, stream)
        info = self._reset(self.np_random, options)
        info.setdefault("success", False)
        own_kinds = [kind for kind in self.failure_kinds if kind not in FAILURE_KINDS]
        if own_kinds:
            info[FAILURE_KINDS_INFO] = own_kinds
        self._episode_open = True
        return self.render_text(), self._with_board(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self._episode_open:
            raise RuntimeError(
                f"{type(self).__name__}.step called with no open episode: "
                "call reset() first (and again after terminated or truncated)"
            )
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        reward, terminated, truncated, info = self._step(action)
        info.setdefault("success", False)
        info.setdefault("action_is_valid", True)
        # Whether the env itself ended the episode: a trajectory also ends when the caller's budget runs out.
        info[TERMINATED_INFO] = bool(terminated)
        self._episode_open = not (terminated or truncated)
        return self.render_text(), float(reward), terminated, truncated, self._with_board(info)

    def board(self) -> Board | None:
        """The current state as a picture draws it (`envs.board`); None (the default): no picture."""
        return None

    @classmethod
    def failure_descriptions(cls) -> dict[str, str]:
        """Every failure kind a trajectory on this env can end in, the env's own first: kind -> description."""
        own = {kind: text for kind, text in cls.failure_kinds.items() if kind not in FAILURE_KINDS}
        return {**own, **{kind: cls.failure_kinds.get(kind, text) for kind, text in FAILURE_KINDS.items()}}

    def _with_board(self, info: dict[str, Any]) -> dict[str, Any]:
        board = self.board()
        if board is not None:
            info[BOARD_INFO] = board.to_json()
        return info

    # gymnasium's return type is a union over a TypeVar no caller binds; "ansi" renders are str.
    def render(self) -> str:  # type: ignore[override]
        return self.render_text()

    @abc.abstractmethod
    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> dict[str, Any]:
        """Builds the initial state from `rng` (seeded per episode); returns info.

        `options` are the reset options; unknown keys must raise ValueError.
        """

    @abc.abstractmethod
    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        """Applies one action phrase; returns (reward, terminated, truncated, info)."""

    @abc.abstractmethod
    def render_text(self) -> str:
        """The current state as the text the model sees."""


# How a grid env joins the cells of a row: "" as RAGEN renders them, or " ". Tokenizers merge runs
# of grid symbols ("####", "__", "OP") into one token, so a cell's column cannot be read off the
# tokens; a space makes every cell its own token (SmolLM2: " #", " _", " O").
CELL_SEPARATORS = ("", " ")


def check_cell_separator(separator: str) -> None:
    """Raises ValueError unless `separator` is one of `CELL_SEPARATORS`."""
    if separator not in CELL_SEPARATORS:
        raise ValueError(f"cell_separator must be one of {CELL_SEPARATORS}, got {separator!r}")


def dynamics_generator(seed: int | None, stream: int) -> np.random.Generator:
    """The random stream number `stream` under `seed`: independent of the seed's own stream and of other numbers.

    A child of `SeedSequence(seed)` (numpy's spawn keys), so `(seed, stream)`
    fixes it; `seed=None` draws fresh entropy as gymnasium does.
    """
    if isinstance(stream, bool) or not isinstance(stream, numbers.Integral) or stream < 0:
        raise ValueError(f"reset option {DYNAMICS_STREAM!r} must be an int >= 0, got {stream!r}")
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(int(stream),)))


def build_config(config_class: type, config: Any, overrides: Mapping[str, Any]) -> Any:
    """Returns `config` (or the defaults) with `overrides` applied and validated.

    Raises TypeError naming any unknown key and listing the accepted ones, so a
    typo in a YAML or `make_env` call fails loudly instead of being ignored.
    """
    if config is not None and not isinstance(config, config_class):
        raise TypeError(f"config must be a {config_class.__name__}, got {type(config).__name__}")
    accepted = config_field_names(config_class)
    unknown = sorted(set(overrides) - set(accepted))
    if unknown:
        raise TypeError(f"unknown {config_class.__name__} key(s) {unknown}; accepted keys: {list(accepted)}")
    _check_whole_numbers(config_class, overrides)
    base: Any = config if config is not None else config_class()
    return dataclasses.replace(base, **overrides)


def _check_whole_numbers(config_class: type, values: Mapping[str, Any]) -> None:
    """Raises TypeError naming a value given for a field declared `int` that is anything else (a float,
    a bool, text), before the config's own checks compare it with numbers."""
    hints = typing.get_type_hints(config_class)
    for name, value in values.items():
        if hints.get(name) is int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise TypeError(f"{name} takes an int, got {value!r} ({type(value).__name__})")


def parse_literal(raw: str) -> Any:
    """A Python literal (`3`, `1e-5`, `None`, `(1, 2)`, `False`), else the text itself: a `KEY=VALUE` value."""
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def config_field_names(config_class: type) -> tuple[str, ...]:
    """The init field names of a config dataclass, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(config_class) if f.init)


def match_action(text: str, vocabulary: Sequence[str]) -> str | None:
    """The canonical name in `vocabulary` that `text` spells, or None.

    Matching ignores case and surrounding whitespace: " up " -> "Up".
    """
    wanted = text.strip().casefold()
    for name in vocabulary:
        if name.casefold() == wanted:
            return name
    return None
