"""Env worker processes (``--env-workers``, arena_envs.pool.EnvPool) give the rows of the in-process envs, bit for
bit, on Sokoban-Mini, WebShop, TextWorld and ALFWorld; a training run gives the same metrics and weights."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

import wrappers
from arena_envs.pool import EnvPool, LocalEnvs
from arena_train.rollout import RolloutConfig, collect_rows

ROOT = Path(__file__).resolve().parents[1]
GAMES = {"ARL/TextWorld-v0": dict(num_games=2), "ARL/ALFWorld-v0": dict(games_per_task=1)}
CASES = [("ARL/Sokoban-Mini-v0", None), ("ARL/WebShop-v0", None), ("ARL/TextWorld-v0", "textworld"),
         ("ARL/ALFWorld-v0", "alfworld")]


def make(env_id: str, cache: str | None, split: str = "train"):
    kwargs = dict(GAMES.get(env_id, {}))
    if env_id in GAMES:
        kwargs["cache_dir"] = cache
    return wrappers.make_env(env_id, history_length=1, prompt_style="compact", split=split, **kwargs)


def rows_of(env_id: str, model, tokenizer, workers: int, cache: str) -> list[dict]:
    from arena_train.backends import HFBackend

    env_fn = functools.partial(make, env_id, cache)
    runner = EnvPool(env_fn, 4, workers=workers) if workers else LocalEnvs(env_fn)
    rollout = wrappers.GroupRollout(runner, 2, 2, env_id=env_id)
    torch.manual_seed(0)
    config = RolloutConfig(max_turns=3, max_prompt_tokens=1024, max_response_tokens=6, temperature=1.0)
    stats: dict[str, float] = defaultdict(float)
    try:
        rows, episodes = collect_rows(HFBackend(model, tokenizer), tokenizer, rollout, [5, 8], config, stats)
    finally:
        rollout.close()
    assert len(episodes) == 4 and not stats["env_errors"]
    return [{k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in asdict(r).items()} for r in rows]


@pytest.mark.parametrize("env_id,extra", CASES, ids=[e for e, _ in CASES])
def test_workers_give_the_in_process_rows(env_id, extra, tiny_model, tmp_path):
    if extra is not None and importlib.util.find_spec(extra) is None:
        pytest.skip(f"{env_id} needs the [{extra}] extra")
    from arena_train.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(tiny_model, torch.float32)
    cache = str(tmp_path)
    local = rows_of(env_id, model, tokenizer, 0, cache)
    assert local and all(r["prompt_ids"] for r in local)
    assert rows_of(env_id, model, tokenizer, 2, cache) == local


def test_a_pool_slot_reaches_its_env():
    env_fn = functools.partial(make, "ARL/Sokoban-Mini-v0", None)
    with EnvPool(env_fn, 3, workers=2) as pool:
        local = LocalEnvs(env_fn, 3)
        for runner in (pool, local):
            runner.reset_many({i: {"seed": 7 + i} for i in range(3)})
        assert [e.unwrapped.expert_action() for e in pool.envs] == [e.unwrapped.expert_action() for e in local.envs]
        assert pool.envs[1].unwrapped.dim_room == local.envs[1].unwrapped.dim_room
        with pytest.raises(AttributeError):
            assert pool.envs[0].unwrapped.no_such_thing is None
        assert pool.pid(0) != pool.pid(1) and pool.pid(0) == pool.pid(2)  # slot i on worker i % 2
        pids = [pool.pid(0), pool.pid(1)]
        local.close()
    assert not any(Path(f"/proc/{p}").exists() and Path(f"/proc/{p}/stat").read_text().split()[2] != "Z"
                   for p in pids)


def test_auto_workers_serve_the_native_engines_only():
    from arena_envs import auto_env_workers

    assert auto_env_workers("ARL/Sokoban-Mini-v0", 64) == 0 and auto_env_workers("ARL/WebShop-v0", 64) == 0
    assert 1 <= auto_env_workers("ARL/ALFWorld-v0", 64) <= os.cpu_count()
    assert auto_env_workers("ARL/TextWorld-v0", 1) == 1


def test_a_training_run_with_workers_equals_the_in_process_run(tiny_model, tmp_path):
    """Same metrics (timings aside) and the same final weights, bit for bit."""
    runs = {}
    for workers in ("0", "2"):
        cmd = [sys.executable, str(ROOT / "algos" / "grpo.py"), "--model-path", tiny_model, "--output-dir",
               str(tmp_path), "--run-name", f"w{workers}", "--num-iterations", "2", "--num-groups", "2",
               "--group-size", "2", "--max-turns", "3", "--max-response-tokens", "8", "--mini-batch-size", "8",
               "--micro-batch-size", "8", "--eval-every", "2", "--eval-episodes", "2", "--checkpoint-every", "0",
               "--torch-threads", "1", "--env-workers", workers]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [json.loads(x) for x in (tmp_path / f"w{workers}" / "metrics.jsonl").read_text().splitlines()]
        runs[workers] = [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in lines]
    assert runs["0"] == runs["2"] and len(runs["0"]) == 3  # iterations 0 (held-out only), 1, 2
    from safetensors.torch import load_file

    a, b = (load_file(tmp_path / w / "final" / "model.safetensors") for w in ("w0", "w2"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
