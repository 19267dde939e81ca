"""Training rows that do not depend on batching (``--episode-streams``): each training episode samples from its own
stream keyed by (run seed, iteration, task seed, sample, turn) (``arena_train.streams.training_seed``), so a row's
tokens are the same whatever the generation batch size, the env worker count or the number of processes. Off
(``--no-episode-streams``), training keeps the backend's own stream, and the rows depend on the batch."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from conftest import ALGOS, launch_config, needs_accelerate

import wrappers
from arena_envs.pool import EnvPool, LocalEnvs
from arena_train.cli import EngineArgs
from arena_train.rollout import RolloutConfig, collect_rows
from arena_train.streams import sampling_seed, training_seed

SOKOBAN = "ARL/Sokoban-Mini-v0"
TASKS = [5, 17, 23]
CONFIG = RolloutConfig(max_turns=4, max_prompt_tokens=512, max_response_tokens=12, temperature=1.0)


def test_training_seed_is_a_fixed_hash_of_run_seed_and_iteration():
    """Pinned: a change would change every run with episode streams. Each iteration gets streams of its own, and
    the held-out evaluation's keys (task seeds above EVAL_SEED_OFFSET) are untouched."""
    assert training_seed(0, 1) == 6362690505620692701
    seeds = {training_seed(s, i) for s in range(3) for i in range(1, 5)}
    assert len(seeds) == 12 and all(0 <= s < 2**63 for s in seeds)
    assert sampling_seed(0, 1_000_000_000, 0, 0) == 4208853605806107461  # evaluation's stream, as before
    assert EngineArgs().episode_streams is True  # on by default


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model):
    from arena_train.models import load_model_and_tokenizer

    return load_model_and_tokenizer(tiny_model, torch.float32)


def rows_of(model_and_tokenizer, batch_size: int, workers: int, seed: int | None) -> list[tuple]:
    """(episode, turn, prompt, response, reward, stop) of every row of 3 groups x 2 Sokoban episodes, sampled."""
    from arena_train.backends import HFBackend

    model, tokenizer = model_and_tokenizer
    make = functools.partial(wrappers.make_env, SOKOBAN, history_length=2, prompt_style="compact")
    runner = EnvPool(make, 6, workers=workers) if workers else LocalEnvs(make)
    rollout = wrappers.GroupRollout(runner, len(TASKS), 2, env_id=SOKOBAN)
    torch.manual_seed(0)  # the backend's own stream (seed None) starts alike in every call
    try:
        rows, _ = collect_rows(HFBackend(model, tokenizer, batch_size=batch_size), tokenizer, rollout, TASKS, CONFIG,
                               defaultdict(float), sampling_seed=seed)
    finally:
        rollout.close()
    return [(r.episode, r.turn, r.prompt_ids, r.response_ids, r.step_reward, r.stop) for r in rows]


def test_rows_do_not_depend_on_batch_size_or_env_workers(model_and_tokenizer):
    seed = training_seed(3, 2)
    rows = rows_of(model_and_tokenizer, 256, 0, seed)
    assert len({tuple(r[3]) for r in rows}) > 3 and max(r[1] for r in rows) > 0  # sampled, several turns
    assert rows_of(model_and_tokenizer, 1, 0, seed) == rows  # one prompt per generate batch
    assert rows_of(model_and_tokenizer, 4, 2, seed) == rows  # other batches, envs in 2 worker processes
    # the premise: without episode streams the batch changes the tokens; another iteration samples anew
    assert rows_of(model_and_tokenizer, 1, 0, None) != rows_of(model_and_tokenizer, 256, 0, None)
    assert [r[3] for r in rows_of(model_and_tokenizer, 256, 0, training_seed(3, 3))] != [r[3] for r in rows]


def train_records(tiny_model: str, out: Path, processes: int, *flags: str) -> dict[tuple[int, int, int], str]:
    """Iteration 1 of grpo.py (2 groups x 2 episodes, 3 turns, episode records on) in 1 process, or in 2 under
    ``accelerate launch``: (task seed, sample, turn) -> response of every recorded training episode (the main
    process records its own groups)."""
    if processes == 1:
        cmd = [sys.executable, str(ALGOS / "grpo.py"), "--model-path", tiny_model, "--output-dir", str(out),
               "--run-name", "ddp", "--num-iterations", "1", "--num-groups", "2", "--group-size", "2",
               "--max-turns", "2", "--max-response-tokens", "8", "--mini-batch-size", "2", "--micro-batch-size",
               "1", "--eval-every", "0", "--eval-episodes", "2", "--learning-rate", "1e-3"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run([*cmd, "--temperature", "1.0", *flags], env=env, capture_output=True, text=True,
                              timeout=400)
    else:
        proc = launch_config("ddp", "grpo", tiny_model, out, "--num-iterations", "1", "--temperature", "1.0", *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for path in sorted((out / "ddp" / "episodes").glob("*.jsonl"))
               for line in path.read_text().splitlines()]
    return {(r["task_seed"], r["sample"], t["turn"]): t["response"] for r in records if r["source"] == "train"
            for t in r["turns"]}


@needs_accelerate
@pytest.mark.slow
def test_a_training_run_samples_the_same_rows_in_one_and_two_processes(tiny_model, tmp_path):
    """``--episode-streams`` reaches the scripts' rollouts (``Run.iterations`` sets each iteration's streams): the
    episodes that rank 0 of a 2-process run plays get the responses the 1-process run gave them."""
    one = train_records(tiny_model, tmp_path / "one", 1, "--episode-streams")
    two = train_records(tiny_model, tmp_path / "two", 2, "--episode-streams")
    assert two and len(one) > len(two) and all(one[key] == response for key, response in two.items())
