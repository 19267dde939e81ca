"""Turns that overlap (``--overlap-turns``, ``collect_rows(..., overlap=True)``): two cohorts of episodes alternate,
one generating while the other's envs step in the env workers (``GroupRollout.start_step``, ``EnvPool.submit_many``
/ ``collect``). With per-episode streams every episode sees the same prompts, streams and env answers as in the
lockstep rollout, so its rows are the same: tokens, rewards and stop reasons bit for bit, the behaviour log-probs
to float rounding (another generation batch); the failure policy counts and drops the same groups."""

from __future__ import annotations

import functools
import importlib.util
import time
from collections import defaultdict
from types import SimpleNamespace

import faulty_env  # noqa: F401  (registers Faulty-v0)
import numpy as np
import pytest
import torch

import wrappers
from arena_envs.pool import EnvError, EnvPool, LocalEnvs
from arena_train.cli import args_problem
from arena_train.episodes import TurnTap
from arena_train.rollout import RolloutConfig, collect_rows
from arena_train.streams import training_seed

SEED = training_seed(1, 4)
CONFIG = RolloutConfig(max_turns=4, max_prompt_tokens=1024, max_response_tokens=10, temperature=1.0)
GAMES = {"ARL/TextWorld-v0": dict(num_games=2)}


class Watched:
    """The backend, noting for each generate call how many episodes' envs were stepping meanwhile."""

    def __init__(self, backend, rollout):
        self.backend, self.rollout, self.stepping = backend, rollout, []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def generate_scored(self, prompts, *args, **kwargs):
        self.stepping.append(len(self.rollout._started))
        return self.backend.generate_scored(prompts, *args, **kwargs)


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model):
    from arena_train.models import load_model_and_tokenizer

    return load_model_and_tokenizer(tiny_model, torch.float32)


def play(model_and_tokenizer, env_id: str, overlap: bool, workers: int = 2, cache: str | None = None):
    """Rows, per-episode turns (recorded by a ``TurnTap``), stats and the envs stepping at each generate call of
    3 groups x 2 episodes of ``env_id``, sampled from per-episode streams."""
    from arena_train.backends import HFBackend

    model, tokenizer = model_and_tokenizer
    kwargs = {**GAMES.get(env_id, {}), **({"cache_dir": cache} if env_id in GAMES else {})}
    make = functools.partial(wrappers.make_env, env_id, history_length=2, prompt_style="compact", **kwargs)
    runner = EnvPool(make, 6, workers=workers) if workers else LocalEnvs(make)
    rollout = wrappers.GroupRollout(runner, 3, 2, env_id=env_id)
    tap = TurnTap(rollout)
    backend = Watched(HFBackend(model, tokenizer), rollout)
    stats: dict[str, float] = defaultdict(float)
    try:
        rows, episodes = collect_rows(backend, tokenizer, tap, [5, 8, 13], CONFIG, stats, sampling_seed=SEED,
                                      overlap=overlap)
    finally:
        rollout.close()
    turns = {i: [(t.turn, t.response, t.env_reward, t.done, t.action) for t in ts] for i, ts in tap.turns.items()}
    return rows, episodes, turns, dict(stats), backend.stepping


CASES = [("ARL/Sokoban-Mini-v0", None), ("ARL/TextWorld-v0", "textworld")]


@pytest.mark.parametrize("env_id,extra", CASES, ids=[e for e, _ in CASES])
def test_overlapped_rows_are_the_lockstep_rows(env_id, extra, model_and_tokenizer, tmp_path):
    if extra is not None and importlib.util.find_spec(extra) is None:
        pytest.skip(f"{env_id} needs the [{extra}] extra")
    cache = str(tmp_path / "games")
    rows, episodes, turns, stats, stepping = play(model_and_tokenizer, env_id, False, cache=cache)
    o_rows, o_episodes, o_turns, o_stats, o_stepping = play(model_and_tokenizer, env_id, True, cache=cache)
    exact = ("group", "episode", "turn", "prompt_ids", "response_ids", "step_reward", "format_penalty", "format_ok",
             "action_is_valid", "anchor", "won", "stop", "env_return")
    assert [[getattr(r, k) for k in exact] for r in o_rows] == [[getattr(r, k) for k in exact] for r in rows]
    assert max(r.turn for r in rows) > 0 and len(rows) > len(episodes)  # several turns were played
    for a, b in zip(o_rows, rows):  # the behaviour log-probs of another generation batch: float rounding
        np.testing.assert_allclose(a.rollout_logp, b.rollout_logp, rtol=0, atol=1e-5)
        assert abs(a.rollout_entropy - b.rollout_entropy) < 1e-5
    assert o_episodes == episodes and o_turns == turns and o_stats == stats
    # lockstep generates with no env stepping; overlapped, a cohort generates while the other's envs step
    assert set(stepping) == {0} and max(o_stepping) > 0


def test_overlap_in_process_plays_the_same_rows(model_and_tokenizer):
    """In-process envs step at ``start_step`` (nothing to overlap with), with the same rows."""
    rows = play(model_and_tokenizer, "ARL/Sokoban-Mini-v0", False, workers=0)[0]
    o_rows = play(model_and_tokenizer, "ARL/Sokoban-Mini-v0", True, workers=0)[0]
    assert [(r.episode, r.turn, r.response_ids, r.step_reward) for r in o_rows] == [
        (r.episode, r.turn, r.response_ids, r.step_reward) for r in rows]


class SeededMoves:
    """A Sokoban move (or a malformed answer) chosen by each request's stream seed: a backend whose answers depend
    on the episode's stream only, as the model's do."""

    def __init__(self, tokenizer):
        texts = [wrappers.format_response(a) for a in ("up", "down", "left", "right")] + ["no tags"]
        self.choices = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    def generate(self, prompts, max_new_tokens, temperature, top_p, greedy, top_k=None, seeds=None):
        return [list(self.choices[s % len(self.choices)]) for s in seeds]


def faulty_rows(tokenizer, fault: dict[str, str], overlap: bool, timeout: float | None = None, workers: int = 2):
    make = functools.partial(wrappers.make_env, "faulty_env:Faulty-v0", history_length=0, prompt_style="compact",
                             fault=fault)
    runner = EnvPool(make, 9, workers=workers, timeout=timeout)
    rollout = wrappers.GroupRollout(runner, 3, 3, env_id="faulty_env:Faulty-v0")
    stats: dict[str, float] = defaultdict(float)
    try:
        rows, episodes = collect_rows(SeededMoves(tokenizer), tokenizer, rollout, [11, 22, 33], CONFIG, stats,
                                      sampling_seed=SEED, overlap=overlap)
    finally:
        rollout.close()
    return [(r.episode, r.turn, r.response_ids, r.step_reward, r.stop) for r in rows], episodes, dict(stats)


@pytest.mark.parametrize("once", [False, True], ids=["dropped", "replayed"])
def test_the_failure_policy_holds_under_overlap(once, model_and_tokenizer, tmp_path):
    """An env that raises on step 2 of task seed 22: its group is replayed (and dropped if it fails again), with the
    counts and the kept rows of the lockstep rollout. Failing once, the first of the group's episodes to reach the
    fault fails; one worker steps them in a fixed order (slot order within a batch, batches in the order sent), so
    it is the same episode, and the discarded first try generates as many tokens, in both modes."""
    tokenizer = model_and_tokenizer[1]
    results = []
    for overlap in (False, True):
        fault = {"ARL_FAULT": "raise", "ARL_FAULT_SEEDS": "22", "ARL_FAULT_STEP": "2"}
        if once:
            (tmp_path / str(overlap)).mkdir()
            fault["ARL_FAULT_ONCE"] = str(tmp_path / str(overlap))
        results.append(faulty_rows(tokenizer, fault, overlap, workers=1 if once else 2))
    (rows, episodes, stats), (o_rows, o_episodes, o_stats) = results
    assert o_rows == rows and o_episodes == episodes and o_stats == stats
    assert stats["retried_groups"] == 1 and stats["dropped_groups"] == (0 if once else 1)
    assert {e.group for e in episodes} == ({0, 1, 2} if once else {0, 2})


def test_a_hung_step_under_overlap_times_out_and_drops_its_group(model_and_tokenizer):
    """Seed 11 hangs on its first step: its worker is killed and restarted, with the other cohort's batch pending
    on it; the group of seed 11 fails on both tries and is dropped, the run goes on."""
    fault = {"ARL_FAULT": "hang", "ARL_FAULT_SEEDS": "11", "ARL_FAULT_STEP": "1"}
    rows, episodes, stats = faulty_rows(model_and_tokenizer[1], fault, True, timeout=2.0)
    assert stats["dropped_groups"] >= 1 and 0 not in {e.group for e in episodes}
    assert all(stop != "env_error" for *_, stop in rows)


def test_a_worker_answers_its_pending_batches_in_order():
    """Two batches pending on one worker: collecting the later one first keeps the earlier one's answers for it."""
    make = functools.partial(wrappers.make_env, "ARL/Sokoban-Mini-v0", prompt_style="compact")
    with EnvPool(make, 2, workers=1) as pool:
        pool.reset_many({0: {"seed": 3}, 1: {"seed": 4}})
        first = pool.submit_many({0: wrappers.format_response("up")})
        second = pool.submit_many({1: wrappers.format_response("left")})
        assert set(pool.collect(second)) == {1} and set(pool.collect(first)) == {0}
        pending = pool.submit_many({0: wrappers.format_response("down")})
        assert pool.pid(0) > 0  # a call reads its own answer after the worker's pending batches
        assert set(pool.collect(pending)) == {0}


def test_a_timeout_fails_every_batch_pending_on_the_worker():
    fault = {"ARL_FAULT": "hang", "ARL_FAULT_SEEDS": "3", "ARL_FAULT_STEP": "1"}
    make = functools.partial(wrappers.make_env, "faulty_env:Faulty-v0", prompt_style="compact", fault=fault)
    with EnvPool(make, 2, workers=1, timeout=1.0) as pool:
        pool.reset_many({0: {"seed": 3}, 1: {"seed": 4}})
        first = pool.submit_many({0: "up"})
        second = pool.submit_many({1: "up"})
        start = time.monotonic()
        results = pool.collect(second)
        assert isinstance(results[1], EnvError) and results[1].kind == "timeout"
        assert pool.collect(first)[0].kind == "timeout" and pool.restarts == 1
        assert time.monotonic() - start < 30


def test_overlap_needs_streams_workers_and_step_rows(model_and_tokenizer):
    tokenizer = model_and_tokenizer[1]
    rollout = wrappers.GroupRollout(lambda: wrappers.make_env("ARL/Sokoban-Mini-v0"), 1, 2)
    with pytest.raises(ValueError, match="per-episode streams"):
        collect_rows(SeededMoves(tokenizer), tokenizer, rollout, [1], CONFIG, defaultdict(float), overlap=True)
    with pytest.raises(ValueError, match="'step' row layout"):
        collect_rows(SeededMoves(tokenizer), tokenizer, rollout, [1], RolloutConfig(4, 512, 8, row_layout="trajectory"),
                     defaultdict(float), sampling_seed=SEED, overlap=True)
    flags = dict(env_id="ARL/TextWorld-v0", overlap_turns=True, episode_streams=True, env_workers=2)
    assert args_problem(SimpleNamespace(**flags)) is None
    assert "drop --no-episode-streams" in args_problem(SimpleNamespace(**{**flags, "episode_streams": False}))
    assert "needs env workers" in args_problem(SimpleNamespace(**{**flags, "env_workers": 0}))
    sokoban = {**flags, "env_id": "ARL/Sokoban-Mini-v0", "env_workers": -1}  # auto: in-process for Sokoban
    assert "needs env workers" in args_problem(SimpleNamespace(**sokoban))
    assert args_problem(SimpleNamespace(**{**flags, "env_workers": -1})) is None  # auto: workers for TextWorld
    assert "'step' row layout" in args_problem(SimpleNamespace(**{**flags, "row_layout": "trajectory"}))
