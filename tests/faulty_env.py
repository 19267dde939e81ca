"""Sokoban-Mini with injected faults, for the failure-policy tests (``--env-id faulty_env:Faulty-v0``).

The fault is set by environment variables, so that it reaches a training script's process and env workers alike:
``ARL_FAULT`` = ``raise`` (a ``RuntimeError``), ``exit`` (the process dies: a crashed worker), ``hang`` (sleeps
an hour: a timeout) or ``reset`` (``reset`` raises); ``ARL_FAULT_SEEDS`` = the task seeds that fail
(comma-separated); ``ARL_FAULT_STEP`` = the step (1-based) that fails; ``ARL_FAULT_ONCE`` = a folder: each seed
fails only once (a marker file per seed), so a retry succeeds; ``ARL_FAULT_PIDS`` = a folder that receives an
empty file named after the process id of every process that makes an env.

An env reads these variables when it is made, unless ``fault`` gives them: a worker forked from a fork server that
an earlier test started inherits that server's environment, not the test's, so in-process tests pass ``fault``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import gymnasium as gym

import arena_envs  # noqa: F401  (registers ARL/Sokoban-Mini-v0)


def fault_settings() -> dict[str, str]:
    """The fault set in this process's environment (the ``ARL_FAULT*`` variables)."""
    return {k: v for k, v in os.environ.items() if k.startswith("ARL_FAULT")}


class FaultyEnv(gym.Wrapper):
    def __init__(self, split: str = "train", fault: dict[str, str] | None = None):
        super().__init__(gym.make("ARL/Sokoban-Mini-v0", split=split).unwrapped)
        self.seed, self.steps = None, 0
        self.fault = fault_settings() if fault is None else dict(fault)
        if self.fault.get("ARL_FAULT_PIDS"):  # where the envs live (their processes must end with the run)
            (Path(self.fault["ARL_FAULT_PIDS"]) / str(os.getpid())).touch()

    def _fault_due(self) -> bool:
        seeds = {int(s) for s in self.fault.get("ARL_FAULT_SEEDS", "").split(",") if s}
        if self.seed not in seeds:
            return False
        once = self.fault.get("ARL_FAULT_ONCE")
        if once:
            try:  # atomic: of the episodes racing in several workers, exactly one fails
                os.close(os.open(Path(once) / str(self.seed), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return False
        return True

    def _fault(self) -> None:
        mode = self.fault.get("ARL_FAULT", "raise")
        if mode == "exit":
            os._exit(3)
        if mode == "hang":
            time.sleep(3600)
        raise RuntimeError(f"injected fault on task seed {self.seed}")

    def reset(self, *, seed=None, options=None):
        self.seed, self.steps = seed, 0
        if self.fault.get("ARL_FAULT") == "reset" and self._fault_due():
            self._fault()
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if (self.fault.get("ARL_FAULT") != "reset" and self.steps == int(self.fault.get("ARL_FAULT_STEP", "1"))
                and self._fault_due()):
            self._fault()
        return self.env.step(action)


gym.register(id="Faulty-v0", entry_point=FaultyEnv, max_episode_steps=10)
