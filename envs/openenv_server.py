"""Serves any StarPO env as an OpenEnv server: one env per WebSocket session.

    python -m envs.openenv_server --env frozenlake --set is_slippery=False --port 8000

The app is openenv-core's own (`create_fastapi_app`): `/ws` sessions (reset,
step, state, close), `/reset` and `/step` over HTTP, `/health`, `/metadata`,
`/schema`; plus `GET /text_env`, the env's instructions and action vocabulary
(`envs.openenv_protocol`). Each WebSocket session gets its own env, built with
`make_env(name, **config)`; at most `--max-sessions` are open at once, and one
idle for `--session-timeout-s` is closed by the server. Train against it with
`--env openenv:http://127.0.0.1:8000` (`envs.openenv_client`).
"""

from __future__ import annotations

import argparse
import functools
import json
import socket
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import uvicorn
from fastapi import FastAPI
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import ConcurrencyConfig, EnvironmentMetadata, State

from envs.base import TextEnv, parse_literal
from envs.openenv_protocol import TEXT_ENV_ROUTE, TextAction, TextEnvSpec, TextObservation
from envs.registry import make_env
from envs.user_errors import CLIParser, UserError, front_door, input_checks


class TextEnvEnvironment(Environment[TextAction, TextObservation, State]):
    """A TextEnv behind OpenEnv's `Environment` interface.

    Args:
        env_name: The env's name for `make_env` (registered, `module:Class` or a scheme name).
        env_config: Its config overrides.
    """

    # Every session builds its own env, and TextEnvs share no mutable state.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, *, env_name: str, env_config: Mapping[str, Any]) -> None:
        super().__init__()
        self.env_name = env_name
        self.env: TextEnv = make_env(env_name, **env_config)
        self._state = State()

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        options: dict[str, Any] | None = None,
        **unknown: Any,
    ) -> TextObservation:
        """Starts an episode from `seed` with the TextEnv's reset `options` (e.g. `dynamics_stream`)."""
        if unknown:
            raise ValueError(f"unknown reset parameter(s) {sorted(unknown)}; accepted: seed, episode_id, options")
        text, info = self.env.reset(seed=seed, options=options)
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return _observation(text, reward=None, terminated=False, truncated=False, info=info)

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        """One action phrase; `timeout_s` is OpenEnv's, unused (a TextEnv step does not block)."""
        text, reward, terminated, truncated, info = self.env.step(action.message)
        self._state.step_count += 1
        return _observation(text, reward=reward, terminated=terminated, truncated=truncated, info=info)

    @property
    def state(self) -> State:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name=self.env_name, description=self.env.instructions, version="1.0.0")


def _observation(
    text: str, *, reward: float | None, terminated: bool, truncated: bool, info: Mapping[str, Any]
) -> TextObservation:
    return TextObservation(
        text=text,
        reward=reward,
        done=terminated or truncated,
        truncated=truncated,
        success=bool(info.get("success", False)),
        action_is_valid=bool(info.get("action_is_valid", True)),
        info=json_info(info),
    )


def json_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """`info` with numpy scalars and arrays as plain JSON values; TypeError naming a key that has no JSON form."""

    def plain(value: Any) -> Any:
        if hasattr(value, "tolist"):  # numpy scalars and arrays
            return value.tolist()
        raise TypeError(f"the env's info holds a {type(value).__name__}, which has no JSON form: {value!r}")

    return json.loads(json.dumps(dict(info), default=plain))


def create_app(*, env_name: str, env_config: Mapping[str, Any], max_sessions: int, session_timeout_s: float) -> FastAPI:
    """OpenEnv's FastAPI app serving `env_name`, plus `GET /text_env`.

    Args:
        env_name: The env's name for `make_env`.
        env_config: Its config overrides (checked now: one env is built).
        max_sessions: Most WebSocket sessions (envs) open at once.
        session_timeout_s: Seconds a session may stay idle before the server closes it.
    """
    spec_env = make_env(env_name, **env_config)
    vocabulary = spec_env.action_vocabulary
    spec = TextEnvSpec(
        instructions=spec_env.instructions, action_vocabulary=list(vocabulary) if vocabulary is not None else None
    )
    factory = functools.partial(TextEnvEnvironment, env_name=env_name, env_config=dict(env_config))
    app = create_fastapi_app(
        factory,
        TextAction,
        TextObservation,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=session_timeout_s),
    )
    app.add_api_route(TEXT_ENV_ROUTE, lambda: spec, methods=["GET"], response_model=TextEnvSpec, tags=["StarPO"])
    return app


def parse_settings(items: Sequence[str]) -> dict[str, Any]:
    """`["key=value", ...]` as a config dict; a value is a Python literal (`False`, `3`, `(6, 6)`) or else a string."""
    settings: dict[str, Any] = {}
    for item in items:
        key, separator, text = item.partition("=")
        if not separator or not key.strip():
            raise ValueError(f"--set takes KEY=VALUE, got {item!r}")
        settings[key.strip()] = parse_literal(text)
    return settings


def build_parser() -> argparse.ArgumentParser:
    parser = CLIParser(
        prog="python -m envs.openenv_server",
        description="Serve a StarPO env as an OpenEnv server (WebSocket sessions at /ws, one env each). "
        "Train against it with --env openenv:http://HOST:PORT (docs/openenv.md).",
    )
    parser.add_argument("--env", required=True, help="env name: registered (frozenlake, sokoban, ...) or module:Class")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="env config override, repeatable; VALUE is a Python literal or a string (e.g. is_slippery=False)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=256,
        help="most WebSocket sessions (envs) open at once; a trainer holds n_groups x group_size of them, plus one "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--session-timeout-s",
        type=float,
        default=600.0,
        help="seconds a session may stay idle before the server closes it (default: %(default)s)",
    )
    return parser


@front_door
def main(argv: Sequence[str] | None = None) -> None:
    """Serves until stopped; bad input (flags, env, env config, port) ends it with one `error:` line, exit code 2."""
    args = build_parser().parse_args(argv)
    if args.max_sessions < 1:
        raise UserError(f"--max-sessions must be >= 1, got {args.max_sessions}")
    if not args.session_timeout_s > 0:
        raise UserError(f"--session-timeout-s must be > 0, got {args.session_timeout_s}")
    try:
        with input_checks():
            app = create_app(
                env_name=args.env,
                env_config=parse_settings(args.set),
                max_sessions=args.max_sessions,
                session_timeout_s=args.session_timeout_s,
            )
    except UserError as error:
        raise UserError(f"cannot serve env {args.env!r}: {error}") from error
    check_port_free(args.host, args.port)
    print(f"serving env {args.env!r} over OpenEnv at http://{args.host}:{args.port} (WebSocket sessions at /ws)")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


def check_port_free(host: str, port: int) -> None:
    """Raises UserError unless this process can listen on `host`:`port` (uvicorn would log the failure and exit 1)."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be in [0, 65535], got {port}")
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as error:
        raise UserError(f"cannot listen on {host}:{port} (--host, --port): {error.strerror or error}") from None


if __name__ == "__main__":
    main()
