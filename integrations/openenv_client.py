"""Clients of a served ARLArena env: the OpenEnv ``EnvClient`` and ``ARL/Remote-v0``, a gymnasium env.

    env = wrappers.make_env("ARL/Remote-v0", url="http://127.0.0.1:8000")   # same stack as in-process

``ARL/Remote-v0`` returns what the served env returns (text observation, env reward, terminated,
truncated, info) and reports the served id and rules, so :func:`wrappers.make_env` picks the same
prompt, projection rule and format penalty as for the in-process env. The URL can also come from
``$ARL_REMOTE_URL``, so a training script run with ``--env-id ARL/Remote-v0`` plays a remote env.

A server is not trusted: ``RemoteEnv`` bounds and cleans what it sends as an in-process env's output is
(observations and info strings without hidden code points, at most ``MAX_OBSERVATION_CHARS`` each; info and
messages bounded in size) and refuses a reply that breaks the env contract (a reward that is not a finite number
within ``MAX_ABS_REWARD``, contract info keys of the wrong type) with ``ServerReplyError``, so that reply's reset or
step fails as an env error, which the rollout's failure policy replays or drops and counts.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import gymnasium as gym

from arena_envs.base import (
    INFO_KEYS,
    MAX_OBSERVATION_CHARS,
    EnvStateError,
    bound_observation,
    clean_observation,
    extra_error,
    text_space,
)

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
#: The largest message read from a server (MiB; OpenEnv's default is 100): a larger one fails its call.
MAX_MESSAGE_MB = 64
#: The largest |reward| a served step may pay: ARLArena's envs pay a few units at most, and a return summed from
#: larger ones could overflow to inf.
MAX_ABS_REWARD = 1e6
#: Bounds of a served info dict: characters of its strings and keys (one more per value) for each contract key and
#: for all other keys together, entries per list or dict, nesting depth. The registered envs' infos hold under
#: 1,000 characters.
MAX_INFO_CHARS = 65_536
MAX_INFO_ITEMS = 1_024
MAX_INFO_DEPTH = 8
#: Types of the contract's info keys (``arena_envs.base.INFO_KEYS``) when a served info has them.
_INFO_TYPES = {"won": bool, "action_is_valid": bool, "task": str}
_MAX_ID_CHARS = 200


class ServerReplyError(ValueError):
    """A served env's reply that breaks the env contract; its reset or step fails as an env error."""


def _remote_call(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(...)`` on the client; a server-side contract error is raised here as its own type. The server's
    message is bounded and cleaned as its observations are: it goes to the run's log."""
    try:
        return call(*args, **kwargs)
    except RuntimeError as err:
        match = _SERVER_ERROR.fullmatch(str(err))
        if match and match.group(1) in REMOTE_ERRORS:
            raise REMOTE_ERRORS[match.group(1)](served_text(match.group(2), "error")) from None
        raise RuntimeError(served_text(str(err), "error")) from None


def served_text(value: Any, what: str) -> str:
    """A server's text as an in-process env's observation: hidden code points removed (lone surrogates too, which
    no log or episode file could encode), at most ``MAX_OBSERVATION_CHARS`` characters."""
    if not isinstance(value, str):
        raise ServerReplyError(f"the server sent a {what} of type {type(value).__name__}, not text")
    return bound_observation(clean_observation(value), MAX_OBSERVATION_CHARS)


def served_reward(value: Any) -> float:
    """A served step's reward; anything but a finite number within ``MAX_ABS_REWARD`` raises: a NaN would
    otherwise become the episode's return, its group's advantages and a record no episode file can hold."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ServerReplyError(f"the server sent a non-numeric reward: {type(value).__name__} {str(value)[:60]!r}")
    if not abs(value) <= MAX_ABS_REWARD:  # also NaN; an int of any size compares exactly
        raise ServerReplyError(f"the server sent a reward outside [-{MAX_ABS_REWARD:g}, {MAX_ABS_REWARD:g}]: "
                               f"{str(value)[:60]}")
    return float(value)


class _InfoBudget:
    """Copies a JSON value within ``MAX_INFO_CHARS``: strings cleaned and cut, non-finite floats as ``None``,
    containers cut to ``MAX_INFO_ITEMS`` entries and ``MAX_INFO_DEPTH`` levels, nothing once the budget is spent.

    Why: the info goes into prompts (task, admissible actions), episode records and metrics; bounding it as a whole
    keeps a server from growing the trainer's memory, its prompts or its logs, and from writing a value (NaN, a lone
    surrogate) that a JSON log cannot hold."""

    def __init__(self):
        self.left = MAX_INFO_CHARS

    def copy(self, value: Any, depth: int = 0) -> Any:
        self.left -= 1
        if self.left < 0 or depth > MAX_INFO_DEPTH:
            return None
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(str(k)): self.copy(v, depth + 1) for k, v in self._entries(value.items())}
        if isinstance(value, list):
            return [self.copy(v, depth + 1) for v in self._entries(value)]
        return value  # None, bool or int: what else JSON decodes to

    def text(self, value: str) -> str:
        out = bound_observation(clean_observation(value), max(0, min(self.left, MAX_OBSERVATION_CHARS)))
        self.left -= len(out)
        return out

    def _entries(self, items: Iterable[Any]) -> Iterator[Any]:
        for item in itertools.islice(items, MAX_INFO_ITEMS):
            if self.left <= 0:
                return
            yield item


def served_info(value: Any) -> dict[str, Any]:
    """A served info dict, bounded (``_InfoBudget``: one for each key of ``INFO_KEYS``, one for all the others), with
    the contract's keys of the contract's types."""
    if not isinstance(value, dict):
        raise ServerReplyError(f"the server sent an info of type {type(value).__name__}, not a dict")
    shared, info = _InfoBudget(), {}
    for key, item in itertools.islice(value.items(), MAX_INFO_ITEMS):
        if key in INFO_KEYS:  # a budget each: the server's other keys cannot crowd the contract's out
            info[key] = _InfoBudget().copy(item, 1)
        elif shared.left > 0:
            info[shared.text(str(key))] = shared.copy(item, 1)
    for key, kind in _INFO_TYPES.items():
        if key in info and not isinstance(info[key], kind):
            raise ServerReplyError(f"the server sent info[{key!r}] of type {type(info[key]).__name__}, "
                                   f"not {kind.__name__}")
    actions = info.get("admissible_actions")
    if actions is not None and not (isinstance(actions, list) and all(isinstance(a, str) for a in actions)):
        raise ServerReplyError("the server sent admissible_actions that are not a list of strings")
    return info


def served_anchor(value: Any) -> str | None:
    """A served anchor key (compared, never shown): text of at most ``MAX_OBSERVATION_CHARS`` characters."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ServerReplyError(f"the server sent an anchor of type {type(value).__name__}, not text")
    return value[:MAX_OBSERVATION_CHARS]


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
                                    message_timeout_s=message_timeout_s, max_message_size_mb=MAX_MESSAGE_MB).sync()
        try:  # connects: a missing, full or foreign server fails here, not at the first reset
            state = self._client.state()
        except ConnectionError:
            self._client.close()
            raise
        except (RuntimeError, ConnectionClosed) as err:
            self._client.close()
            raise ConnectionError(f"{url} refused a session ({err}); a server holds at most --max-sessions sessions, "
                                  "one per env instance") from err
        served_id, instructions = getattr(state, "env_id", None), getattr(state, "instructions", "")
        if not (served_id and isinstance(served_id, str) and isinstance(instructions, str)):
            self._client.close()
            raise ConnectionError(f"{url} serves no ARLArena env (its state has no env_id or instructions as text)")
        self.served_id: str = served_id[:_MAX_ID_CHARS]  # it goes into error messages
        self._instructions = served_text(instructions, "instructions")
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
        return self._observe(_remote_call(self._client.reset, **request).observation)

    def step(self, action: str):
        if self._closed:
            raise EnvStateError("RemoteEnv.step() after close(): make a new env")
        text = "" if action is None else str(action)  # the env contract: any input, judged by the env
        result = _remote_call(self._client.step, ARLAction(text=text))
        reward = served_reward(result.reward)  # the reward as sent, before the model's coercion
        text, info = self._observe(result.observation)
        return text, reward, result.observation.terminated, result.observation.truncated, info

    def _observe(self, obs: ARLObservation) -> tuple[str, dict[str, Any]]:
        """The served observation's text and info as checked by ``served_text`` and ``served_info``; the info and
        anchor stay for ``task_description``, ``admissible_actions`` and ``anchor_key``."""
        text = served_text(obs.text, "observation")
        self._info, self._anchor = served_info(obs.info), served_anchor(obs.anchor)
        return text, dict(self._info)

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
