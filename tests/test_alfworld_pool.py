"""Worker-process pool on ALFWorld: parallel episodes equal in-process ones; a killed worker is reported as a crash
and restarted."""

from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("alfworld", reason="ALFWorld needs the [alfworld] extra")

import gymnasium as gym  # noqa: E402

import arena_envs  # noqa: E402,F401
from arena_envs.pool import EnvError, EnvPool  # noqa: E402


def test_pool_matches_in_process_env_and_survives_a_crash(tmp_path):
    cache = str(tmp_path)
    local = gym.make("ARL/ALFWorld-v0", games_per_task=1, cache_dir=cache)
    with EnvPool("ARL/ALFWorld-v0", 2, games_per_task=1, cache_dir=cache) as pool:
        for i, seed in enumerate((4, 9)):
            obs, info = pool.reset(i, seed=seed)
            assert (obs, info) == local.reset(seed=seed)
        expert = {i: pool.call(i, "expert_action") for i in range(2)}
        results = pool.step(expert)
        assert set(results) == {0, 1} and all(r[4]["action_is_valid"] for r in results.values())

        os.kill(pool.pid(1), signal.SIGKILL)
        results = pool.step({0: "look", 1: "look"})
        assert isinstance(results[1], EnvError) and results[1].kind == "crash"
        assert not isinstance(results[0], EnvError) and pool.restarts == 1

        obs, info = pool.reset(1, seed=9)  # the restarted worker plays on
        assert obs == local.reset(seed=9)[0]
        assert pool.step({1: pool.call(1, "expert_action")})[1][4]["action_is_valid"]
    local.close()
