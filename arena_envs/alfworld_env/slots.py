"""One slot's ALFWorld game: the first of a fixed seed sequence that ALFWorld's planner solves.

A slot (split, task type, k) tries seeds in its own range; a game counts when the planner solves it from
the initial state (never already a goal state) in at most ``max_steps`` and its plan wins on replay. The
planner runs in a child process stopped after ``PLANNER_TIMEOUT_S``, a guard against pathological
searches. :mod:`games` builds missing slots through here and :mod:`build` fills caches and the committed
records; this module imports neither (no import circle).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import tempfile
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

from arena_envs.alfworld_env.engine import make_engine, planner_plan
from arena_envs.alfworld_env.generator import TASK_TYPES, floor_plans, generate, load_scene, task_candidates
from arena_envs.alfworld_env.trial import game_logic, write_trial

#: split -> (floor plans, seed offset); valid_seen uses the train floor plans with other seeds.
SPLITS = {"train": ("train", 0), "valid_seen": ("train", 1_000_000), "valid_unseen": ("unseen", 2_000_000)}
#: Seeds tried per slot: slot k of a task type tries seeds offset + k * ATTEMPTS + 1 ... (disjoint per slot).
ATTEMPTS = 100
#: Slots committed per task type and split (the rest is generated on first use).
COMMITTED_PER_TASK = 2
PLANNER_TIMEOUT_S = 300.0


def validate(game_file: str, engine, max_steps: int = 50) -> list[str] | None:
    """The planner's plan if it is non-empty, at most ``max_steps`` long and wins on replay."""
    engine.load(game_file)
    state = engine.reset()
    if state["won"]:
        return None
    plan = planner_plan(engine)
    if not plan or len(plan) > max_steps:
        return None
    for command in plan:
        if command not in state["admissible_commands"]:
            return None
        state, _, done = engine.step(command)
    return plan if state["won"] else None


def validate_bounded(game_file: str, timeout_s: float = PLANNER_TIMEOUT_S) -> list[str] | None:
    """``validate`` in a forked child; ``None`` if it fails or does not finish within ``timeout_s``.

    A plain ``os.fork`` with a pipe, not ``multiprocessing``: env workers (``arena_envs.pool``) are daemonic
    processes, which ``multiprocessing`` forbids to start children, and they are where an uncached game of a
    training rollout gets generated."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the plan, pickled, then exit without the parent's atexit handlers
        status = 1
        try:
            os.close(read_fd)
            with os.fdopen(write_fd, "wb") as out:
                out.write(pickle.dumps(validate(game_file, make_engine(expert=False))))
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    deadline, data = time.monotonic() + timeout_s, b""
    try:
        while (left := deadline - time.monotonic()) > 0 and select.select([read_fd], [], [], left)[0]:
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:  # the child closed its end: done (an empty reply = it failed)
                return pickle.loads(data) if data else None
            data += chunk
        return None  # the planner is still searching
    finally:
        os.close(read_fd)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@lru_cache(maxsize=None)
def scenes_for(floor_plan_split: str, task_type: str) -> tuple[int, ...]:
    """Floor plans of a split that support ``task_type`` (e.g. heat needs a microwave)."""
    return tuple(n for n in floor_plans(floor_plan_split) if task_candidates(load_scene(n), task_type))


def build_game(split: str, task_type: str, k: int) -> dict:
    """The validated game of slot (split, task type, k): ``{slot, problem, traj_data, walkthrough}``."""
    scenes_name, offset = SPLITS[split]
    scenes = scenes_for(scenes_name, task_type)
    ti = list(TASK_TYPES.values()).index(task_type)
    logic = game_logic()
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(1, ATTEMPTS + 1):
            seed = offset + k * ATTEMPTS + attempt
            scene = scenes[np.random.default_rng([ti, seed]).integers(len(scenes))]
            problem, traj_data = generate(scene, task_type, seed)
            plan = validate_bounded(str(write_trial(Path(tmp) / str(seed), problem, traj_data, None, logic)))
            if plan:
                return {"slot": [task_type, k], "problem": problem, "traj_data": traj_data, "walkthrough": plan}
    raise RuntimeError(f"ALFWorld {split} {task_type} slot {k}: no solvable game in {ATTEMPTS} seeds")
