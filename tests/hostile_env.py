"""Sokoban-Mini whose replies break the env contract, to be served as a hostile server would
(tests/test_env_server_hostile.py; ``--env-id hostile_env:Hostile-v0``).

``mode`` (a ``gym.make`` keyword, so a server passes it with its env kwargs while the trainer's own copy of the env
stays honest): ``"huge"`` makes every observation ``HUGE_OBSERVATION`` (20 MB of text starting with U+202E) and
every info hostile (``HOSTILE_INFO``: 5,000 admissible actions of 1,000 characters, a task with bidi controls,
a NaN score), and ``reset(options={"fail": True})`` raises a ``ValueError`` of that text; ``"huge_steps"``
sends that observation from every step, after an honest first one; ``"nan"`` pays a NaN
reward on step ``step`` of the episodes of the task seeds ``seeds``.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym

import arena_envs  # noqa: F401  (registers ARL/Sokoban-Mini-v0)

HUGE_OBSERVATION = "\u202e" + "#" * 20_000_000
HOSTILE_INFO = {"admissible_actions": ["up" * 500] * 5_000, "task": "push\u2066 the box\u202e", "score": float("nan")}


class HostileEnv(gym.Wrapper):
    def __init__(self, split: str = "train", mode: str = "", seeds: Sequence[int] = (), step: int = 1):
        super().__init__(gym.make("ARL/Sokoban-Mini-v0", split=split).unwrapped)
        self.mode, self.seeds, self.nan_step = mode, set(seeds), step
        self.seed, self.steps = None, 0

    def reset(self, *, seed=None, options=None):
        if self.mode == "huge" and options == {"fail": True}:
            raise ValueError(HUGE_OBSERVATION)  # the server sends it to the client as the error's message
        self.seed, self.steps = seed, 0
        obs, info = self.env.reset(seed=seed, options=options)
        return self._obs(obs), self._info(info)

    def step(self, action):
        self.steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.mode == "nan" and self.seed in self.seeds and self.steps == self.nan_step:
            reward = float("nan")
        huge = self.mode in ("huge", "huge_steps")
        return HUGE_OBSERVATION if huge else obs, reward, terminated, truncated, self._info(info)

    def _obs(self, obs: str) -> str:
        return HUGE_OBSERVATION if self.mode == "huge" else obs

    def _info(self, info: dict) -> dict:
        return {**info, **HOSTILE_INFO} if self.mode == "huge" else info


gym.register(id="Hostile-v0", entry_point=HostileEnv, max_episode_steps=10, disable_env_checker=True)
