"""One synchronous session with an OpenEnv server, every call bounded by a timeout.

OpenEnv's own client (`GenericEnvClient`, WebSocket `/ws`, one env on the
server per connection) bounds connecting and waiting for an answer; its
synchronous wrapper waits for the result without a limit. `OpenEnvSession`
runs the same client under a bound on the whole call, and turns what went
wrong into errors naming the server and the call: `OpenEnvServerError` when the
server answered with an error (bad input: retrying cannot help),
`OpenEnvConnectionError` when it could not be reached, hung up or did not
answer in time (another connection may help: `envs.openenv_client` retries).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from openenv.core.generic_client import GenericEnvClient
from openenv.core.sync_client import SyncEnvClient
from websockets.exceptions import WebSocketException

# What closing a session may take: a dead server must not hold up the caller.
CLOSE_TIMEOUT_S = 5.0
# What reading the last message of a closed connection may take (it is buffered, or there is none).
FAREWELL_TIMEOUT_S = 1.0


class OpenEnvServerError(RuntimeError):
    """An OpenEnv server failed a call; the message names the server, the call and what went wrong."""


class OpenEnvConnectionError(OpenEnvServerError):
    """The server could not be reached, dropped the connection or did not answer within the timeout."""


class _BoundedSyncClient(SyncEnvClient):
    """OpenEnv's synchronous client with a limit on each call's wait."""

    def __init__(self, async_client: GenericEnvClient, *, call_timeout_s: float) -> None:
        super().__init__(async_client)
        self.call_timeout_s = call_timeout_s

    def _run(self, coro: Any, timeout_s: float | None = None) -> Any:
        limit = timeout_s or self.call_timeout_s
        future = asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())
        try:
            return future.result(timeout=limit)
        except TimeoutError:  # also concurrent.futures' and asyncio's (aliases since Python 3.11)
            if future.done():  # the client's own wait for the answer ran out
                raise TimeoutError(f"no answer within {self.async_client._message_timeout:g} s") from None
            future.cancel()
            raise TimeoutError(f"the call did not end within {limit:g} s") from None


class OpenEnvSession:
    """A WebSocket session with the OpenEnv server at `url`: one env on the server, opened on first use.

    Args:
        url: The server's base URL, e.g. "http://127.0.0.1:8000".
        timeout_s: Seconds connecting may take, and seconds an answer may take;
            a call (connect, send, answer) is abandoned after twice that.
    """

    def __init__(self, *, url: str, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.url, self.timeout_s = url, timeout_s
        self._client: _BoundedSyncClient | None = None

    @property
    def is_open(self) -> bool:
        """A connection is open (made by the first call after construction or `close`)."""
        return self._client is not None

    def reset(self, **parameters: Any) -> dict[str, Any]:
        """The server's answer to reset(**parameters): {"observation": {...}, "reward": ..., "done": ...}."""
        return self._call("reset", lambda client: client.reset(**parameters))

    def step(self, action: dict[str, Any]) -> dict[str, Any]:
        """The server's answer to step(action), as for `reset`."""
        return self._call(f"step {action!r}", lambda client: client.step(action))

    def close(self) -> None:
        """Ends the session: says so to the server, which closes its env; never raises, waits at most
        `CLOSE_TIMEOUT_S` for the server (then drops the connection)."""
        self._end(graceful=True)

    def _end(self, *, graceful: bool) -> None:
        """Forgets the connection, after closing it with the server's consent (`graceful`) or not."""
        client, self._client = self._client, None
        if client is None:
            return
        if graceful:
            with contextlib.suppress(Exception):  # a dead server or a dropped connection has nothing left to close
                client._run(client.async_client.close(), CLOSE_TIMEOUT_S)
        with contextlib.suppress(Exception):
            client._run(_drop_connection(client.async_client), CLOSE_TIMEOUT_S)
        client._stop_loop()

    def _call(self, what: str, call: Callable[[_BoundedSyncClient], Any]) -> dict[str, Any]:
        if self._client is None:
            # A new client per connection: one that failed may hold a half-open socket on its old loop.
            client = GenericEnvClient(
                base_url=self.url, connect_timeout_s=self.timeout_s, message_timeout_s=self.timeout_s
            )
            self._client = _BoundedSyncClient(client, call_timeout_s=2 * self.timeout_s)
        try:
            result = call(self._client)
        except RuntimeError as error:
            # How OpenEnv's client reports an error answer; a server at capacity may have room on a retry.
            if str(error).startswith("Server error:") and "CAPACITY_REACHED" not in str(error):
                # OpenEnv's client drops the validation details: the schemas say what the server expects.
                hint = (
                    f"; what it expects: GET {self.url.rstrip('/')}/schema" if "VALIDATION_ERROR" in str(error) else ""
                )
                raise OpenEnvServerError(f"OpenEnv server {self.url} failed {what}: {error}{hint}") from error
            raise self._connection_error(what, error) from error
        except (OSError, TimeoutError, EOFError, WebSocketException) as error:  # OSError: ConnectionError too
            raise self._connection_error(what, error) from error
        return {"observation": result.observation, "reward": result.reward, "done": result.done}

    def _connection_error(self, what: str, error: BaseException) -> OpenEnvConnectionError:
        said = self._farewell() if isinstance(error, WebSocketException) else ""
        # The connection's state is unknown (an answer may still arrive): drop it, without waiting for a server
        # that may be gone or hung; the next call reconnects.
        self._end(graceful=False)
        return OpenEnvConnectionError(
            f"OpenEnv server {self.url}: {what} failed (timeout {self.timeout_s:g} s): "
            f"{type(error).__name__}: {error}{said}"
        )

    def _farewell(self) -> str:
        """What a server that closed the connection said last, if it was an error (e.g. CAPACITY_REACHED)."""
        assert self._client is not None, "called on the connection that failed"
        with contextlib.suppress(Exception):  # nothing said, or not an error: nothing to add
            said = self._client._run(_last_error(self._client.async_client), FAREWELL_TIMEOUT_S)
            if said:
                return f"; before closing, the server said: {said}"
        return ""


async def _last_error(client: GenericEnvClient) -> str | None:
    """The error message the server sent before it closed the connection (websockets keeps it for `recv`)."""
    message = json.loads(await client._ws.recv())
    if message.get("type") != "error":
        return None
    return f"{message['data'].get('message')} (code: {message['data'].get('code')})"


async def _drop_connection(client: GenericEnvClient) -> None:
    """Closes `client`'s socket at once and cancels the loop's other tasks (keepalive, a close cut short):
    asyncio would log each task the stopped loop drops as an error."""
    if client._ws is not None:
        client._ws.transport.abort()
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def get_json(url: str, *, timeout_s: float) -> dict[str, Any] | None:
    """The JSON object at `url` (GET), None when the server answers 404; OpenEnvConnectionError otherwise."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise OpenEnvConnectionError(f"OpenEnv server: GET {url} answered {error.code} {error.reason}") from error
    except (OSError, ValueError) as error:
        raise OpenEnvConnectionError(
            f"OpenEnv server: GET {url} failed (timeout {timeout_s:g} s): {type(error).__name__}: {error}"
        ) from error
