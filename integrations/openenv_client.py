"""Clients of a served ARLArena env: the OpenEnv ``EnvClient`` and ``ARL/Remote-v0``, a gymnasium env.

    env = wrappers.make_env("ARL/Remote-v0", url="http://127.0.0.1:8000")   # same stack as in-process

``ARL/Remote-v0`` returns what the served env returns (text observation, env reward, terminated,
truncated, info) and reports the served id and rules, so :func:`wrappers.make_env` picks the same
prompt, projection rule and format penalty as for the in-process env. The URL can also come from
``$ARL_REMOTE_URL``, so a training script run with ``--env-id ARL/Remote-v0`` plays a remote env.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from arena_envs.base import EnvStateError, extra_error, text_space

try:
    from openenv.core import EnvClient
    from openenv.core.client_types import StepResult
    from openenv.core.env_server.types import State
    from websockets.exceptions import ConnectionClosed
except ModuleNotFoundError as err:
    raise extra_error("openenv", "ARL/Remote-v0 and integrations.openenv_*", err.name) from None

from integrations.openenv_models import ARLAction, ARLObservation

#: Environment variable read when ``ARL/Remote-v0`` is made without ``url``.
URL_VARIABLE = "ARL_REMOTE_URL"
#: Errors of the env contract that the server sends with their type's name in front (``EnvStateError: ...``) and
#: ``RemoteEnv`` raises again as that type, so a served env fails like the in-process one.
REMOTE_ERRORS: dict[str, type[Exception]] = {"EnvStateError": EnvStateError, "TypeError": TypeError,
                                             "ValueError": ValueError}
_SERVER_ERROR = re.compile(r"Server error: (\w+): (.*) \(code: [^)]*\)", re.DOTALL)


def _remote_call(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(...)`` on the client; a server-side contract error is raised here as its own type."""
    try:
        return call(*args, **kwargs)
    except RuntimeError as err:
        match = _SERVER_ERROR.fullmatch(str(err))
        if match and match.group(1) in REMOTE_ERRORS:
            raise REMOTE_ERRORS[match.group(1)](match.group(2)) from None
        raise


class ARLEnvClient(EnvClient[ARLAction, ARLObservation, State]):
    """OpenEnv client of :mod:`integrations.openenv_server` (async; ``.sync()`` for blocking calls)."""

    def _step_payload(self, action: ARLAction) -> dict[str, Any]:
        return {"text": action.text}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[ARLObservation]:
        observation = ARLObservation(**payload.get("observation", {}), reward=payload.get("reward"),
                                     done=payload.get("done", False))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)


class RemoteEnv(gym.Env[str, str]):
    """A served ARLArena env as a gymnasium env (one WebSocket session, i.e. one server-side env, per instance).

    ``served_id`` is the id the server plays (what ``wrappers`` use to pick prompts and projection rules).
    """

    metadata = {"render_modes": [], "render_fps": 1}

    def __init__(self, url: str | None = None, connect_timeout_s: float = 10.0, message_timeout_s: float = 120.0):
        url = url or os.environ.get(URL_VARIABLE)
        if not url:
            raise ValueError(f"ARL/Remote-v0 needs url=... (or ${URL_VARIABLE}), e.g. http://127.0.0.1:8000")
        self.observation_space = text_space()
        self.action_space = text_space()
        self._client = ARLEnvClient(base_url=url, connect_timeout_s=connect_timeout_s,
                                    message_timeout_s=message_timeout_s).sync()
        try:  # connects: a missing, full or foreign server fails here, not at the first reset
            state = self._client.state()
        except ConnectionError:
            self._client.close()
            raise
        except (RuntimeError, ConnectionClosed) as err:
            self._client.close()
            raise ConnectionError(f"{url} refused a session ({err}); a server holds at most --max-sessions sessions, "
                                  "one per env instance") from err
        if not getattr(state, "env_id", None):
            self._client.close()
            raise ConnectionError(f"{url} serves no ARLArena env (its state has no env_id)")
        self.served_id: str = state.env_id
        self._instructions: str = getattr(state, "instructions", "")
        self._closed = False
        self._info: dict[str, Any] = {}
        self._anchor: str | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self._closed:
            raise EnvStateError("RemoteEnv.reset() after close(): make a new env")
        super().reset(seed=seed)
        request = {} if seed is None else {"seed": int(seed)}
        if options is not None:
            request["options"] = options
        result = _remote_call(self._client.reset, **request)
        self._info, self._anchor = dict(result.observation.info), result.observation.anchor
        return result.observation.text, dict(self._info)

    def step(self, action: str):
        if self._closed:
            raise EnvStateError("RemoteEnv.step() after close(): make a new env")
        text = "" if action is None else str(action)  # the env contract: any input, judged by the env
        result = _remote_call(self._client.step, ARLAction(text=text))
        obs = result.observation
        self._info, self._anchor = dict(obs.info), obs.anchor
        return obs.text, float(obs.reward or 0.0), obs.terminated, obs.truncated, dict(self._info)

    def task_description(self) -> str:
        return str(self._info.get("task", ""))

    def admissible_actions(self) -> list[str] | None:
        return self._info.get("admissible_actions")

    def anchor_key(self, obs: str) -> str:
        """The served env's key of its latest observation (``wrappers.AnchorState`` calls this right after it)."""
        return self._anchor if self._anchor is not None else str(obs).strip()

    def prompt_instructions(self) -> str:
        return self._instructions

    def close(self) -> None:
        if not self._closed:  # gymnasium may close twice (explicitly, then at garbage collection)
            self._closed = True
            self._client.close()
