"""``FormatPenalty``: turn raw policy text into an env action, penalising bad output."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from wrappers.parsing import parse_response


class FormatPenalty(gym.Wrapper):
    """Parse the response; execute only well-formed actions; subtract ``penalty`` on failure.

    A malformed response reaches the env as ``""``, which every env treats as an
    invalid action (no move), so garbage can never be executed as a legal move. The
    returned reward is ``env_reward - penalty`` when the format is bad or the env
    reports ``action_is_valid=False`` (ARLArena's invalid-action penalty, 0.1).
    info adds ``format_ok``, ``action`` (extracted or None), ``env_reward`` and
    ``format_penalty`` (0.0 or ``penalty``).
    """

    def __init__(self, env: gym.Env, penalty: float = 0.1):
        super().__init__(env)
        if penalty < 0:
            raise ValueError(f"penalty must be >= 0, got {penalty}")
        self.penalty = float(penalty)

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        info.update(format_ok=True, action=None, env_reward=0.0, format_penalty=0.0)
        return obs, info

    def step(self, action: Any):
        parsed = parse_response(action)
        obs, reward, terminated, truncated, info = self.env.step(parsed.action if parsed.format_ok else "")
        if not parsed.format_ok:
            info["action_is_valid"] = False
        penalty = self.penalty if not (parsed.format_ok and info.get("action_is_valid", True)) else 0.0
        info.update(format_ok=parsed.format_ok, action=parsed.action, env_reward=float(reward),
                    format_penalty=penalty)
        return obs, float(reward) - penalty, terminated, truncated, info
