"""The common text-environment API every ARLArena env implements.

Observations and actions are plain ``str``. Envs must accept *any* string as an
action (LLM output can be empty, huge, unicode or adversarial) and report it as
invalid instead of raising. ``info`` always carries the keys in ``INFO_KEYS``.

The call-order contract, enforced here for every env (with or without gymnasium's wrappers): ``step`` before
``reset``, after a ``reset`` that raised, after the episode ended (``terminated`` or ``truncated``, by the env or by
the registered step limit) or after ``close`` raises ``EnvStateError``; ``reset`` starts a new episode at any time
except after ``close``, and a ``reset`` that raised leaves the env as usable as before. Raising, rather than
returning a zero reward, makes a rollout loop that forgot to reset fail at once instead of training on rewards of a
finished episode. gymnasium's ``TimeLimit`` truncates above the env, so every registered id carries
:class:`EpisodeGuard` above it, which tells the env that its episode ended.

Reset options are a dict (or ``None``) of the keys the env names in ``reset_options``; anything else raises
``TypeError`` (not a dict, a value of the wrong type) or ``ValueError`` (an unknown key, a value out of range) naming
the key.
"""

from __future__ import annotations

import importlib
import numbers
import re
import string
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
from gymnasium import spaces
from gymnasium.utils import RecordConstructorArgs

#: Characters every env's text is drawn from. gymnasium's default Text charset is
#: alphanumeric only, which rejects any real observation (spaces, newlines, punctuation).
CHARSET = frozenset(string.printable) | frozenset("√—–’“”…°×÷·")
MAX_TEXT_LENGTH = 1_000_000

#: Code points no observation carries: C0/C1 controls but tab and newline (carriage return, escapes, NUL), format
#: characters (Unicode category Cf: bidi embeddings and isolates U+202A-202E/U+2066-2069, zero-width characters,
#: U+FEFF, soft hyphen, tag characters U+E0001/U+E0020-E007F), the line and paragraph separators U+2028/2029 and lone
#: surrogates. Text with these can reorder, hide or split what a reader sees, or forge lines in logs and prompts.
#: A table rather than a per-character ``unicodedata`` scan (one pass of ``re``); ``tests/test_env_hostile_text.py``
#: checks it against this Python's Unicode database (the Unicode 15 additions are included already).
HIDDEN_RANGES = ((0x0, 0x8), (0xB, 0x1F), (0x7F, 0x9F), (0xAD, 0xAD), (0x600, 0x605), (0x61C, 0x61C), (0x6DD, 0x6DD),
                 (0x70F, 0x70F), (0x890, 0x891), (0x8E2, 0x8E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x2028, 0x202E),
                 (0x2060, 0x2064), (0x2066, 0x206F), (0xD800, 0xDFFF), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB),
                 (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
                 (0xE0001, 0xE0001), (0xE0020, 0xE007F))
_HIDDEN = re.compile("[" + "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in HIDDEN_RANGES) + "]")
#: Largest observation ``step`` returns unless an env sets its own ``max_observation_chars``.
MAX_OBSERVATION_CHARS = 16_384
TRUNCATION_NOTE = " [... observation truncated]"

#: Keys present in every ``info`` dict returned by ``reset`` and ``step``.
INFO_KEYS = ("won", "admissible_actions", "action_is_valid", "task")


class EnvStateError(RuntimeError):
    """``step`` or ``reset`` called in a state where it has no meaning (the message says what to call)."""


def extra_error(extra: str, what: str, missing: str | None = None) -> ModuleNotFoundError:
    """The one-line error for an optional extra that is not installed (raise it ``from None``)."""
    lacking = f" (no module {missing!r})" if missing else ""
    return ModuleNotFoundError(f"{what} needs the optional [{extra}] extra{lacking}: pip install -e \".[{extra}]\"",
                               name=missing)


def require_extra(extra: str, packages: tuple[str, ...], what: str) -> None:
    """Raise :func:`extra_error` unless every package of ``extra`` imports (checked before an engine starts)."""
    for package in packages:
        try:
            importlib.import_module(package)
        except ImportError:
            raise extra_error(extra, what, package) from None


def int_option(options: Mapping[str, Any], key: str, low: int | None = None, high: int | None = None) -> int | None:
    """``options[key]`` as an int (``None`` when absent or ``None``); ``TypeError`` unless it is an integer (``bool``
    is not), ``ValueError`` outside ``[low, high)``, both naming the key."""
    value = options.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"reset option {key!r} must be an integer, got {type(value).__name__} {str(value)[:60]!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value >= high):
        raise ValueError(f"reset option {key!r} must be in [{low}, {high}), got {value}")
    return value


def clean_observation(text: str) -> str:
    """``text`` without the code points of ``HIDDEN_RANGES`` (every env's observations)."""
    return _HIDDEN.sub("", text)


def bound_observation(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, the cut marked."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - len(TRUNCATION_NOTE))] + TRUNCATION_NOTE[: limit]


def text_space(charset: frozenset[str] = CHARSET) -> spaces.Text:
    """A Text space wide enough for LLM-facing text (empty strings allowed)."""
    return spaces.Text(max_length=MAX_TEXT_LENGTH, min_length=0, charset=charset)


class TextEnv(gym.Env[str, str]):
    """Base class: text in, text out, a fixed ``info`` schema and an expert oracle.

    Subclasses implement ``_reset`` and ``_step`` (returning the env-specific part of
    ``info``), ``task_description`` and ``expert_action``; this class fills in the
    mandatory info keys so that no env can forget one.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    #: the longest observation ``step`` returns (characters); the env's own caps keep its observations shorter,
    #: this one holds whatever path a hostile action takes
    max_observation_chars = MAX_OBSERVATION_CHARS
    #: the keys ``reset(options=...)`` accepts; ``None``: not declared (any key passes to ``_reset``)
    reset_options: tuple[str, ...] | None = None
    #: "new" (never reset), "failed" (the last reset raised), "running", "ended" (terminated or truncated) or
    #: "closed"; class-level so a subclass that sets up its engine before ``super().__init__`` is covered too.
    _phase = "new"

    def __init__(self, render_mode: str | None = None, charset: frozenset[str] = CHARSET):
        self.render_mode = render_mode
        self.observation_space = text_space(charset)
        self.action_space = text_space(charset)
        self._last_obs = ""

    # --- to implement -------------------------------------------------------------
    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Start a new episode from ``self.np_random``; return (obs, info). ``options`` is a dict of declared keys."""
        raise NotImplementedError

    def _step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply ``action``; info must contain at least ``won`` and ``action_is_valid``."""
        raise NotImplementedError

    def task_description(self) -> str:
        """The natural-language goal of the current episode (goes into the prompt)."""
        raise NotImplementedError

    def admissible_actions(self) -> list[str] | None:
        """Legal actions in the current state, or ``None`` if the action set is open."""
        return None

    def expert_action(self) -> str:
        """A good next action from the current state (behaviour-cloning oracle)."""
        raise NotImplementedError

    # --- gymnasium API ------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self._phase == "closed":
            raise EnvStateError(f"{type(self).__name__}.reset() after close(): make a new env")
        self._phase = "failed"  # until the new episode stands: a step must not act on a half-reset state
        options = self._check_options(options)
        super().reset(seed=seed)
        obs, info = self._reset(options)
        obs = clean_observation(obs)
        self._phase = "running"
        info.setdefault("won", False)
        info.setdefault("action_is_valid", True)
        self._last_obs = obs
        return obs, self._complete_info(info)

    def step(self, action: str):
        if self._phase != "running":
            why = {"new": "before reset()", "failed": "after a reset() that raised", "ended": "after the episode ended",
                   "closed": "after close()"}[self._phase]
            hint = "make a new env" if self._phase == "closed" else "call reset() to start an episode"
            raise EnvStateError(f"{type(self).__name__}.step() {why}: {hint}")
        if not isinstance(action, str):
            action = "" if action is None else str(action)
        obs, reward, terminated, truncated, info = self._step(action)
        obs = bound_observation(clean_observation(obs), self.max_observation_chars)
        if terminated or truncated:
            self._phase = "ended"
        self._last_obs = obs
        return obs, float(reward), bool(terminated), bool(truncated), self._complete_info(info)

    def end_episode(self) -> None:
        """End the running episode from outside (a step limit above the env, :class:`EpisodeGuard`): the next
        ``step`` raises ``EnvStateError`` until ``reset``."""
        if self._phase == "running":
            self._phase = "ended"

    def _check_options(self, options: Any) -> dict[str, Any]:
        if options is None:
            return {}
        if not isinstance(options, Mapping):
            raise TypeError(f"{type(self).__name__}.reset(options=...) must be a dict or None, "
                            f"got {type(options).__name__}")
        unknown = [k for k in options if self.reset_options is not None and k not in self.reset_options]
        if unknown:
            raise ValueError(f"unknown reset option(s) {sorted(map(str, unknown))} for {type(self).__name__}; "
                             f"accepted: {list(self.reset_options)}")
        return dict(options)

    def close(self):
        """Subclasses that hold an engine release it and then call ``super().close()``."""
        self._phase = "closed"
        super().close()

    def render(self) -> str | None:
        return self._last_obs if self.render_mode == "ansi" else None

    def _complete_info(self, info: dict[str, Any]) -> dict[str, Any]:
        info["won"] = bool(info.get("won", False))
        info["action_is_valid"] = bool(info.get("action_is_valid", True))
        info.setdefault("admissible_actions", self.admissible_actions())
        info.setdefault("task", self.task_description())
        return info


class EpisodeGuard(gym.Wrapper, RecordConstructorArgs):
    """Holds the env contract above gymnasium's wrappers; every registered id has it outermost of ``gym.make``.

    A truncation by ``TimeLimit`` (or any wrapper below) is told to the env (:meth:`TextEnv.end_episode`), so a
    further step raises ``EnvStateError`` instead of playing on and being paid. A ``reset`` that raises re-arms
    the reset check of gymnasium's ``PassiveEnvChecker`` that has not yet seen a reset: gymnasium 1.4 marks it done
    before the env runs, and its first ``step`` then fails on the missing reset data (``TypeError: cannot unpack
    non-iterable NoneType``), which would leave an env whose first reset raised broken for good.
    """

    def __init__(self, env: gym.Env):
        RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        try:
            return self.env.reset(seed=seed, options=options)
        except BaseException:
            _rearm_reset_checks(self.env)
            raise

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            end = getattr(self.env.unwrapped, "end_episode", None)
            if callable(end):
                end()
        return obs, reward, terminated, truncated, info


def _rearm_reset_checks(env: gym.Env) -> None:
    while isinstance(env, gym.Wrapper):
        if (isinstance(env, gym.wrappers.PassiveEnvChecker) and getattr(env, "checked_reset", False)
                and not getattr(env, "checked_step", True) and getattr(env, "_previous_data", ()) is None):
            env.checked_reset = False
        env = env.env
