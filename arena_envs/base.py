"""The common text-environment API every ARLArena env implements.

Observations and actions are plain ``str``. Envs must accept *any* string as an
action (LLM output can be empty, huge, unicode or adversarial) and report it as
invalid instead of raising. ``info`` always carries the keys in ``INFO_KEYS``.

The call-order contract, enforced here for every env (with or without gymnasium's wrappers): ``step`` before
``reset``, after the episode ended (``terminated`` or ``truncated``) or after ``close`` raises ``EnvStateError``;
``reset`` starts a new episode at any time except after ``close``. Raising, rather than returning a zero reward,
makes a rollout loop that forgot to reset fail at once instead of training on rewards of a finished episode.
"""

from __future__ import annotations

import re
import string
from typing import Any

import gymnasium as gym
from gymnasium import spaces

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
    #: "new" (never reset), "running", "ended" (terminated or truncated) or "closed"; class-level so a subclass
    #: that sets up its engine before ``super().__init__`` is covered too.
    _phase = "new"

    def __init__(self, render_mode: str | None = None, charset: frozenset[str] = CHARSET):
        self.render_mode = render_mode
        self.observation_space = text_space(charset)
        self.action_space = text_space(charset)
        self._last_obs = ""

    # --- to implement -------------------------------------------------------------
    def _reset(self, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        """Start a new episode from ``self.np_random``; return (obs, info)."""
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
            why = {"new": "before reset()", "ended": "after the episode ended", "closed": "after close()"}[self._phase]
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
