"""Wrappers that turn any ARLArena env into an LLM-facing, trainable env.

Standard stack, inner → outer (built by :func:`make_env`)::

    gym.make(env_id)          raw env (+ TimeLimit, EpisodeGuard): text obs, env reward, info schema
      → AnchorState           info["anchor"] = key of the RAW observation (GiGPO step groups)
      → FormatPenalty         raw LLM text → env action (projection); −penalty if malformed/invalid
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
from wrappers.projection import PROJECTIONS, Projected, project
from wrappers.prompt import STYLES, PromptHistory

__all__ = [
    "PROJECTIONS",
    "STYLES",
    "AnchorState",
    "EpisodeStats",
    "FormatPenalty",
    "GroupRollout",
    "ParsedResponse",
    "Projected",
    "PromptHistory",
    "Turn",
    "anchor_of",
    "format_response",
    "make_env",
    "parse_response",
    "project",
]


def make_env(env_id: str, history_length: int = 2, format_penalty: float = 0.1, prompt_style: str = "full",
             projection: str = "arlarena", **env_kwargs: Any) -> PromptHistory:
    """``gym.make(env_id, **env_kwargs)`` wrapped as AnchorState → FormatPenalty → PromptHistory.

    ``projection``: ``"arlarena"`` (the paper's per-env rules) or ``"strict"`` (see
    :mod:`wrappers.projection`); ``prompt_style``: ``"full"``, ``"compact"`` or ``"arlarena"``.
    ``env_kwargs`` go to ``gym.make`` (env kwargs, or ``max_episode_steps`` to change the limit).
    """
    if projection not in PROJECTIONS:  # before gym.make: a typo must not cost an env start-up
        raise ValueError(f"projection must be one of {PROJECTIONS}, got {projection!r}")
    if prompt_style not in STYLES:
        raise ValueError(f"prompt_style must be one of {STYLES}, got {prompt_style!r}")
    env = gym.make(env_id, **env_kwargs)
    return PromptHistory(FormatPenalty(AnchorState(env), penalty=format_penalty, projection=projection),
                         history_length=history_length, style=prompt_style)
