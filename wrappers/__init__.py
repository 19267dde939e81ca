"""Wrappers that turn any ARLArena env into an LLM-facing, trainable env.

Standard stack, inner → outer (built by :func:`make_env`)::

    gym.make(env_id)          raw env (+ TimeLimit): text obs, env reward, info schema
      → AnchorState           info["anchor"] = key of the RAW observation (GiGPO step groups)
      → FormatPenalty         raw LLM text → parsed action; −penalty if malformed/invalid
      → PromptHistory         obs := chat prompt (task, last k steps, obs, actions, format)

Why this order: ``AnchorState`` must see the raw observation (a key of the prompt
would differ with history and step count, so identical states would never group);
``FormatPenalty`` must be below ``PromptHistory`` so the history shows the action
the env actually received (``info["action"]``), not the raw response text.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

import arena_envs  # noqa: F401  (registers the ARL/* ids)
from wrappers.anchor import AnchorState, anchor_of
from wrappers.format_penalty import FormatPenalty
from wrappers.groups import EpisodeStats, GroupRollout, Turn
from wrappers.parsing import ParsedResponse, format_response, parse_response
from wrappers.prompt import PromptHistory

__all__ = [
    "AnchorState", "FormatPenalty", "PromptHistory", "GroupRollout", "Turn", "EpisodeStats",
    "ParsedResponse", "parse_response", "format_response", "anchor_of", "make_env",
]


def make_env(env_id: str, history_length: int = 2, format_penalty: float = 0.1, prompt_style: str = "full",
             **env_kwargs: Any) -> PromptHistory:
    """``gym.make(env_id, **env_kwargs)`` wrapped as AnchorState → FormatPenalty → PromptHistory.

    ``env_kwargs`` go to ``gym.make`` (env kwargs, or ``max_episode_steps`` to change the limit).
    """
    env = gym.make(env_id, **env_kwargs)
    return PromptHistory(FormatPenalty(AnchorState(env), penalty=format_penalty),
                         history_length=history_length, style=prompt_style)
