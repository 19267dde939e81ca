"""Serve any ``ARL/*`` id as an OpenEnv environment.

    python -m integrations.openenv_server --env-id ARL/Sokoban-v0 --port 8000

Each OpenEnv WebSocket session gets its own ``gym.make(env_id)`` (step limit included), so any
OpenEnv client can ``reset(seed=...)``, ``step`` and read rewards; the env contract holds as in-process (a step
after the episode ended or after the step limit is refused with ``EnvStateError``, never played or paid); the
session's ``state`` carries ``env_id`` and ``instructions`` (the env's rules for prompts). The raw env is served,
not the LLM stack: clients wrap it themselves (``wrappers.make_env("ARL/Remote-v0", url=...)``), so prompts,
projection and format penalty stay client-side and identical to the in-process stack.

Clients are bounded (:class:`ClientLimits`): at most ``--limit-concurrency`` connections at once (sessions
included), a whole request within ``--request-timeout`` seconds of connecting (or of the previous response), an
idle keep-alive connection closed after ``--timeout-keep-alive`` seconds; at the cap a new connection takes the place
of the oldest one that has not sent its request yet, so connections that send half a request never keep a trainer
out. Reset options are checked by the env against its catalogue (a TextWorld server makes no new game unless
started with ``--allow-new-games``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import json
import threading
import time
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import gymnasium as gym

import arena_envs  # noqa: F401  (registers the ARL/* ids)
from arena_envs.base import extra_error

try:
    import h11
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import State
    from starlette.websockets import WebSocketDisconnect
    from uvicorn.protocols.http.h11_impl import H11Protocol
except ModuleNotFoundError as err:
    raise extra_error("openenv", "integrations.openenv_server", err.name) from None

from integrations.openenv_client import REMOTE_ERRORS
from integrations.openenv_models import ARLAction, ARLObservation, jsonable
from wrappers.special_tokens import escape_turn_markers


def _tagged(call, *args: Any, **kwargs: Any) -> Any:
    """``call(...)`` on the session's env; a contract error (a step after the episode ended or after the step
    limit, malformed reset options) goes to the client with its type's name in front, and ``RemoteEnv`` raises
    it again as that type. Nothing else of the env runs for such a call: no step is counted, no reward paid."""
    try:
        return call(*args, **kwargs)
    except tuple(REMOTE_ERRORS.values()) as err:
        raise type(err)(f"{type(err).__name__}: {err}") from err


class ARLEnvironment(Environment[ARLAction, ARLObservation, State]):
    """One ``gym.make(env_id, **env_kwargs)`` behind the OpenEnv ``Environment`` interface."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session builds its own env; no state is shared

    def __init__(self, env_id: str, **env_kwargs: Any):
        super().__init__()
        self.env_id = env_id
        self._env = gym.make(env_id, **env_kwargs)
        rules = getattr(self._env.unwrapped, "prompt_instructions", None)
        self._instructions = rules() if callable(rules) else ""
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, options: dict | None = None,
              **kwargs: Any) -> ARLObservation:
        obs, info = _tagged(self._env.reset, seed=None if seed is None else int(seed), options=options)
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        # clients tokenize the text: env text never carries a turn marker
        return ARLObservation(text=escape_turn_markers(obs), reward=0.0, info=jsonable(info), anchor=self._anchor(obs))

    def step(self, action: ARLAction, timeout_s: float | None = None, **kwargs: Any) -> ARLObservation:
        obs, reward, terminated, truncated, info = _tagged(self._env.step, action.text)
        self._state.step_count += 1
        return ARLObservation(text=escape_turn_markers(obs), reward=float(reward), done=bool(terminated or truncated),
                              terminated=bool(terminated), truncated=bool(truncated), info=jsonable(info),
                              anchor=self._anchor(obs))

    def _anchor(self, obs: str) -> str | None:
        """The env's own state key (GiGPO anchors), which a client cannot recompute from the text alone."""
        key_fn = getattr(self._env.unwrapped, "anchor_key", None)
        return str(key_fn(obs)) if callable(key_fn) else None

    @property
    def state(self) -> State:
        return State(episode_id=self._state.episode_id, step_count=self._state.step_count, env_id=self.env_id,
                     instructions=self._instructions)

    def close(self) -> None:
        self._env.close()


class _EndedSessionClose:
    """ASGI middleware: a WebSocket session the client already closed ends quietly.

    openenv-core 0.3.0 closes the socket again after the client's close and only catches
    ``RuntimeError``; starlette raises ``WebSocketDisconnect`` there, which uvicorn would log as an
    application error on every normal disconnect (the session itself is already destroyed).
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            if scope["type"] != "websocket":
                raise


def _registered(env_id: str) -> bool:
    """Whether ``env_id`` is registered; ``module:id`` imports ``module`` first, as ``gym.make`` does (a test's or a
    user's own env, served under the id its trainer passes to ``--env-id``)."""
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError:
            return False
    return name in gym.registry


def make_app(env_id: str, max_sessions: int = 64, **env_kwargs: Any):
    """The FastAPI app serving ``env_id`` (a registered id, or ``module:id`` as for ``gym.make``) to at most
    ``max_sessions`` concurrent WebSocket sessions."""
    if not _registered(env_id):
        raise ValueError(f"unknown env id {env_id!r}; registered ARL ids: {arena_envs.ENV_IDS}")
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
    ARLEnvironment(env_id, **env_kwargs).close()  # a bad kwarg fails here, not in every session
    app = create_app(functools.partial(ARLEnvironment, env_id, **env_kwargs), ARLAction, ARLObservation,
                     env_name=env_id, max_concurrent_envs=max_sessions)
    app.add_middleware(_EndedSessionClose)
    return app


@dataclass(frozen=True)
class ClientLimits:
    """What one server grants its clients, so that no client holds the server from the others.

    ``connections`` (``--limit-concurrency``, uvicorn's ``limit_concurrency``): TCP connections at once, WebSocket
    sessions included (give it more than ``--max-sessions``: each session holds one; the rest are for handshakes).
    It is also the listen backlog: asyncio accepts up to a backlog of connections per wake-up before any of them
    reaches the protocol, and uvicorn's default of 2,048 would take every descriptor at a soft limit of 1,024
    before the cap could close one.
    ``request_timeout_s`` (``--request-timeout``): seconds a connection has to send a whole request after it opens
    or after its previous response; uvicorn bounds only the wait between requests (``timeout_keep_alive``), and its
    h11 parser waits for the rest of a half-sent request line forever. ``keep_alive_s`` (``--timeout-keep-alive``):
    uvicorn's ``timeout_keep_alive``. A request head is bounded in size by h11 (16 KiB), WebSocket messages by
    uvicorn (16 MiB), and an open session by ``--max-sessions`` and uvicorn's pings (a dead client is dropped).
    """

    connections: int = 128
    request_timeout_s: float = 10.0
    keep_alive_s: float = 5.0

    def problem(self, max_sessions: int) -> str | None:
        """Why these limits cannot serve ``max_sessions`` sessions, or None."""
        if self.connections <= max_sessions:
            return (f"--limit-concurrency ({self.connections}) must exceed --max-sessions ({max_sessions}): each "
                    "session holds a connection, and a trainer's handshake needs one more")
        if self.request_timeout_s <= 0 or self.keep_alive_s <= 0:
            return "--request-timeout and --timeout-keep-alive must be > 0"
        return None

    def uvicorn_options(self) -> dict[str, Any]:
        """The keyword arguments of ``uvicorn.Config`` / ``uvicorn.run`` that enforce these limits."""
        return {"http": functools.partial(BoundedH11Protocol, request_timeout_s=self.request_timeout_s),
                "limit_concurrency": self.connections, "backlog": self.connections,
                "timeout_keep_alive": self.keep_alive_s}


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request and a cap on the connections.

    A connection that owes a request (just opened, or answered and kept alive) must send all of it within
    ``request_timeout_s`` or is closed. A connection over ``limit_concurrency`` closes the oldest connection still
    owing a request instead (or itself, when every other connection is a session or a request in progress), so the
    server's descriptors stay bounded and a trainer's handshake, sent whole at once, is served while others hold
    half-sent requests.
    """

    def __init__(self, *args: Any, request_timeout_s: float, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.request_timeout_s = request_timeout_s
        self.deadline: asyncio.TimerHandle | None = None
        self.upgraded = False

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._follow_request()
        if self.limit_concurrency is not None and _open_connections(self.connections) > self.limit_concurrency:
            self._make_room()

    def _make_room(self) -> None:
        """Over the cap: close the connection that has owed its request longest, or this one if none owes one."""
        owing = [c for c in self.connections if isinstance(c, BoundedH11Protocol) and c is not self
                 and c.deadline is not None and not c.transport.is_closing()]
        (min(owing, key=lambda c: c.deadline.when()) if owing else self).drop()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_request()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self.upgraded = True  # a session from now on: the WebSocket protocol owns the connection
        self._set_deadline(False)
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow_request()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._set_deadline(False)

    def drop(self) -> None:
        """Close the connection (its request is late, or a newer connection needs its place)."""
        self._set_deadline(False)
        self.transport.close()

    def _follow_request(self) -> None:
        """A deadline while the client owes a request (nothing or part of it received), none once it is whole: a
        request in progress, or a connection handed to the WebSocket protocol."""
        owing = (not self.upgraded and self.conn.their_state in (h11.IDLE, h11.SEND_BODY)
                 and not self.transport.is_closing())
        self._set_deadline(owing)

    def _set_deadline(self, armed: bool) -> None:
        if armed and self.deadline is None:
            self.deadline = self.loop.call_later(self.request_timeout_s, self.drop)
        elif not armed and self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None


def _open_connections(connections) -> int:
    """Connections not closing yet (a closed one leaves uvicorn's set on the next turn of the loop)."""
    return sum(not c.transport.is_closing() for c in connections if getattr(c, "transport", None) is not None)


class ServerThread:
    """``with ServerThread(app) as server:`` serves ``app`` with uvicorn on ``host`` in a daemon thread.

    ``port=0`` takes a free port (read it from ``server.url``). Start and stop are bounded by
    ``timeout_s``, so a server that cannot bind fails fast instead of hanging its caller. ``limits``: what the
    server grants its clients (:class:`ClientLimits`).
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 30.0,
                 limits: ClientLimits = ClientLimits()):
        import uvicorn

        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                     **limits.uvicorn_options()))
        self._thread = threading.Thread(target=self._server.run, name="openenv-server", daemon=True)
        self.host, self.timeout_s = host, timeout_s
        self.url = ""

    def __enter__(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + self.timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._server.should_exit = True
                raise RuntimeError(f"OpenEnv server did not start on {self.host} within {self.timeout_s} s")
            time.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.should_exit = True
        self._thread.join(self.timeout_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", required=True, help="a registered ARL/* id")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=64, help="concurrent WebSocket sessions (one env each)")
    parser.add_argument("--env-kwargs", default="{}", help="JSON object passed to gym.make")
    defaults = ClientLimits()
    parser.add_argument("--limit-concurrency", type=int, default=defaults.connections,
                        help="TCP connections at once, sessions included (more than --max-sessions; default "
                             "%(default)s)")
    parser.add_argument("--request-timeout", type=float, default=defaults.request_timeout_s,
                        help="seconds a connection has to send a whole request (default %(default)s)")
    parser.add_argument("--timeout-keep-alive", type=float, default=defaults.keep_alive_s,
                        help="seconds an idle keep-alive connection stays open (default %(default)s)")
    parser.add_argument("--allow-new-games", action="store_true",
                        help="let reset options ask for games outside the env's catalogue (TextWorld generates and "
                             "caches each one: seconds and disk per game); off by default")
    args = parser.parse_args(argv)
    limits = ClientLimits(args.limit_concurrency, args.request_timeout, args.timeout_keep_alive)
    problem = limits.problem(args.max_sessions)
    if problem:
        parser.error(problem)
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as err:
        parser.error(f"--env-kwargs is not JSON: {err}")
    if not isinstance(env_kwargs, dict):
        parser.error("--env-kwargs must be a JSON object")
    if args.allow_new_games:
        env_kwargs["new_games"] = True
    try:
        app = make_app(args.env_id, args.max_sessions, **env_kwargs)
    except (ValueError, TypeError) as err:
        parser.error(str(err))
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, **limits.uvicorn_options())


if __name__ == "__main__":
    main()
