"""Serve any ``ARL/*`` id as an OpenEnv environment.

    python -m integrations.openenv_server --env-id ARL/Sokoban-v0 --port 8000

Each OpenEnv WebSocket session gets its own ``gym.make(env_id)`` (step limit included), so any
OpenEnv client can ``reset(seed=...)``, ``step`` and read rewards; the env contract holds as in-process (a step
after the episode ended or after the step limit is refused with ``EnvStateError``, never played or paid); the
session's ``state`` carries ``env_id`` and ``instructions`` (the env's rules for prompts). The raw env is served,
not the LLM stack: clients wrap it themselves (``wrappers.make_env("ARL/Remote-v0", url=...)``), so prompts,
projection and format penalty stay client-side and identical to the in-process stack.
"""

from __future__ import annotations

import argparse
import functools
import json
import threading
import time
from typing import Any
from uuid import uuid4

import gymnasium as gym

import arena_envs  # noqa: F401  (registers the ARL/* ids)
from arena_envs.base import extra_error

try:
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import State
    from starlette.websockets import WebSocketDisconnect
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


def make_app(env_id: str, max_sessions: int = 64, **env_kwargs: Any):
    """The FastAPI app serving ``env_id`` to at most ``max_sessions`` concurrent WebSocket sessions."""
    if env_id not in gym.registry:
        raise ValueError(f"unknown env id {env_id!r}; registered ARL ids: {arena_envs.ENV_IDS}")
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
    ARLEnvironment(env_id, **env_kwargs).close()  # a bad kwarg fails here, not in every session
    app = create_app(functools.partial(ARLEnvironment, env_id, **env_kwargs), ARLAction, ARLObservation,
                     env_name=env_id, max_concurrent_envs=max_sessions)
    app.add_middleware(_EndedSessionClose)
    return app


class ServerThread:
    """``with ServerThread(app) as server:`` serves ``app`` with uvicorn on ``host`` in a daemon thread.

    ``port=0`` takes a free port (read it from ``server.url``). Start and stop are bounded by
    ``timeout_s``, so a server that cannot bind fails fast instead of hanging its caller.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 30.0):
        import uvicorn

        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
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
    args = parser.parse_args(argv)
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as err:
        parser.error(f"--env-kwargs is not JSON: {err}")
    if not isinstance(env_kwargs, dict):
        parser.error("--env-kwargs must be a JSON object")
    try:
        app = make_app(args.env_id, args.max_sessions, **env_kwargs)
    except (ValueError, TypeError) as err:
        parser.error(str(err))
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
