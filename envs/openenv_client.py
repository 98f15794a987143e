"""`OpenEnvClientEnv`: a TextEnv played on an OpenEnv server, named `"openenv:<url>"`.

    rllib-ragen train --env openenv:http://127.0.0.1:8000

Each env holds one WebSocket session with the server (one env on the server),
opened by its first reset and closed by `close()` (env groups close their envs
after each rollout). Every call is bounded by `timeout_s` and retried up to
`retries` times, `backoff_s` doubling between attempts, on a new connection.
The server may forget a session whose connection dropped, so a retry first
replays the episode: a reset with the same seed and options, then the episode's
actions, which must reproduce the observation seen last (StarPO envs are pure
functions of seed and actions; a server that is not fails with an error saying
so). A transient drop therefore does not end the trajectory. A server that stays
unreachable, hangs or dies raises `OpenEnvServerError` naming the URL and the
call; the env group then ends that trajectory as it does any env fault
(`rllib_ragen.rollout.env_group`). An error the server answers with (bad input)
is not retried.

Servers other than `envs.openenv_server` work too: `action_field` names the
action's text field and `observation_field` the observation's; the other
observation fields become the info (a StarPO server sends the info whole). Their instructions are the server's
`/metadata` description, and their actions free-form.
"""

from __future__ import annotations

import dataclasses
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from envs.base import TextEnv, build_config
from envs.openenv_protocol import ACTION_FIELD, OBSERVATION_FIELD, TEXT_ENV_ROUTE, TextEnvSpec
from envs.openenv_session import OpenEnvConnectionError, OpenEnvServerError, OpenEnvSession, get_json

_URL_SCHEMES = ("http", "https", "ws", "wss")
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class OpenEnvClientConfig:
    """Where the server is and how long to wait for it.

    Args:
        url: The server's base URL, e.g. "http://127.0.0.1:8000" (set by the env name `openenv:<url>`).
        timeout_s: Seconds connecting may take, and seconds each answer may take.
        retries: Further attempts, each on a new connection, after a call failed to connect or got no answer.
        backoff_s: Seconds before the first retry; doubled before each next one.
        action_field: The field of the server's action that holds the action text.
        observation_field: The field of the server's observation that holds the text the model sees.
    """

    url: str = ""
    # With the retries and backoffs, a call on a hung server ends within (2 + 1) x 2 x 8 + 0.5 + 1 = 49.5 s:
    # before the env group's own limit (`env_step_timeout_s`, 60 s) abandons it with a vaguer message.
    timeout_s: float = 8.0
    retries: int = 2
    backoff_s: float = 0.5
    action_field: str = ACTION_FIELD
    observation_field: str = OBSERVATION_FIELD

    def __post_init__(self) -> None:
        if self.url:  # "" until the env name's URL is applied (build_config starts from the defaults)
            check_url(self.url)
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {self.retries!r}")
        if not self.backoff_s >= 0:
            raise ValueError(f"backoff_s must be >= 0, got {self.backoff_s!r}")
        for name in ("action_field", "observation_field"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")


def check_url(url: str) -> None:
    """Raises ValueError unless `url` is an http(s) or ws(s) URL with a host."""
    parsed = urllib.parse.urlparse(url) if isinstance(url, str) else None
    if parsed is None or parsed.scheme not in _URL_SCHEMES or not parsed.hostname:
        raise ValueError(f"an OpenEnv server URL looks like http://127.0.0.1:8000 (scheme {_URL_SCHEMES}), got {url!r}")


def http_base(url: str) -> str:
    """`url` with a WebSocket scheme turned into its HTTP one, without a trailing slash."""
    parsed = urllib.parse.urlparse(url.rstrip("/"))
    return parsed._replace(scheme={"ws": "http", "wss": "https"}.get(parsed.scheme, parsed.scheme)).geturl()


def resolve_server(rest: str) -> tuple[type[OpenEnvClientEnv], dict[str, Any]]:
    """The registry's resolver of `"openenv:<url>"`: the env class and `{"url": <url>}`; KeyError for a bad URL."""
    try:
        check_url(rest)
    except ValueError as error:
        raise KeyError(f"unknown env 'openenv:{rest}': {error}") from None
    return OpenEnvClientEnv, {"url": rest}


class OpenEnvClientEnv(TextEnv):
    """A TextEnv whose episodes run on an OpenEnv server (module docstring)."""

    config_class = OpenEnvClientConfig

    def __init__(self, config: OpenEnvClientConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        self.config = build_config(OpenEnvClientConfig, config, overrides)
        check_url(self.config.url)
        self._session = OpenEnvSession(url=self.config.url, timeout_s=self.config.timeout_s)
        self._spec: TextEnvSpec | None = None
        self._reset_parameters: dict[str, Any] = {}
        self._actions: list[str] = []  # the episode's actions so far, replayed on a new connection
        self._text = ""

    @property
    def instructions(self) -> str:
        return self._server_spec().instructions

    @property
    def action_vocabulary(self) -> tuple[str, ...] | None:
        vocabulary = self._server_spec().action_vocabulary
        return tuple(vocabulary) if vocabulary is not None else None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        # The server's env draws the dynamics stream itself: it gets the options whole.
        self._reset_parameters = {"seed": seed, "options": dict(options or {})}
        return super().reset(seed=seed, options=options)

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> dict[str, Any]:
        self._actions = []
        text, _, _, _, info = self._read(self._with_retries("reset", self._session_reset))
        self._text = text
        return info

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        def step() -> dict[str, Any]:
            if not self._session.is_open:  # a new connection: the server starts from nothing
                self._replay()
            return self._session.step({self.config.action_field: action})

        text, reward, terminated, truncated, info = self._read(self._with_retries(f"step {action!r}", step))
        self._actions.append(action)
        self._text = text
        return reward, terminated, truncated, info

    def render_text(self) -> str:
        return self._text

    def close(self) -> None:
        """Ends the server session (its env is closed there); safe to call again."""
        self._session.close()
        super().close()

    def _session_reset(self) -> dict[str, Any]:
        return self._session.reset(**self._reset_parameters)

    def _replay(self) -> None:
        """Brings a new session to where the episode is: the same reset, then the same actions."""
        payload = self._session_reset()
        for action in self._actions:
            payload = self._session.step({self.config.action_field: action})
        text = self._read(payload)[0]
        if text != self._text:
            raise OpenEnvServerError(
                f"OpenEnv server {self.config.url}: replaying the episode (reset {self._reset_parameters}, "
                f"{len(self._actions)} actions) on a new connection gave {text!r}, not {self._text!r}: the server's "
                "env is not a pure function of seed and actions, so a dropped connection cannot be recovered"
            )

    def _with_retries(self, what: str, call: Callable[[], _T]) -> _T:
        """`call()`, tried again on a new connection after a connection failure, `retries` times at most."""
        attempts = self.config.retries + 1
        for attempt in range(attempts):
            try:
                return call()
            except OpenEnvConnectionError as error:
                if attempt == attempts - 1:
                    raise OpenEnvConnectionError(f"{error} (gave up on {what} after {attempts} attempts)") from error
                time.sleep(self.config.backoff_s * 2**attempt)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _read(self, payload: dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """(text, reward, terminated, truncated, info) of the server's answer; OpenEnvServerError if malformed."""
        observation, field = payload["observation"], self.config.observation_field
        if not isinstance(observation, dict) or not isinstance(observation.get(field), str):
            fields = sorted(observation) if isinstance(observation, dict) else type(observation).__name__
            raise OpenEnvServerError(
                f"OpenEnv server {self.config.url} answered an observation without the text field {field!r} "
                f"(its fields: {fields}); set env_config observation_field to the one that holds the text"
            )
        truncated = bool(observation.get("truncated", False))
        info = observation.get("info")
        if not isinstance(info, dict):  # not a StarPO server: its other fields are the info
            info = {k: v for k, v in observation.items() if k not in (field, "truncated")}
        reward = payload["reward"]
        return observation[field], float(reward or 0.0), bool(payload["done"]) and not truncated, truncated, info

    def _server_spec(self) -> TextEnvSpec:
        """The server's instructions and action vocabulary, fetched once."""
        if self._spec is None:
            base = http_base(self.config.url)
            timeout_s = self.config.timeout_s
            spec = self._with_retries(
                "GET " + TEXT_ENV_ROUTE, lambda: get_json(base + TEXT_ENV_ROUTE, timeout_s=timeout_s)
            )
            if spec is None:  # not a StarPO server: OpenEnv's metadata describes the env
                metadata = self._with_retries(
                    "GET /metadata", lambda: get_json(base + "/metadata", timeout_s=timeout_s)
                )
                spec = {"instructions": (metadata or {}).get("description", ""), "action_vocabulary": None}
            self._spec = TextEnvSpec.model_validate(spec)
        return self._spec
