"""The failure policy (arena_train.rollout.collect_rows): an env that raises, a worker that dies or hangs ends its
episode as failed; the whole group is replayed once on the same task seed with a fresh env, else dropped, so a
group's baseline never holds a failed episode's zero-reward rows. Faults come from tests/faulty_env.py."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import faulty_env  # registers Faulty-v0
import numpy as np
import pytest

import wrappers
from arena_envs.pool import EnvPool, LocalEnvs
from arena_train.logger import stop_metrics
from arena_train.rollout import RolloutConfig, collect_rows

ROOT = Path(__file__).resolve().parents[1]
CONFIG = RolloutConfig(max_turns=4, max_prompt_tokens=512, max_response_tokens=8)
SEEDS = [11, 22, 33]
GROUP_SIZE = 3


class FakeBackend:
    """Seeded Sokoban moves (some malformed), so that episodes run several turns."""

    def __init__(self, tokenizer, seed: int = 0):
        texts = [wrappers.format_response(a) for a in ("up", "down", "left", "right")] + ["no tags"]
        self.choices = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        self.rng = np.random.default_rng(seed)

    def generate(self, prompts, max_new_tokens, temperature, top_p, greedy, top_k=None):
        return [list(self.choices[self.rng.integers(len(self.choices))]) for _ in prompts]


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture
def fault(monkeypatch, tmp_path):
    """Set the injected fault: fault(mode, seeds, step, once)."""

    def set_fault(mode: str, seeds: list[int], step: int = 2, once: bool = False) -> None:
        monkeypatch.setenv("ARL_FAULT", mode)
        monkeypatch.setenv("ARL_FAULT_SEEDS", ",".join(map(str, seeds)))
        monkeypatch.setenv("ARL_FAULT_STEP", str(step))
        if once:
            (tmp_path / "once").mkdir(exist_ok=True)
            monkeypatch.setenv("ARL_FAULT_ONCE", str(tmp_path / "once"))
        else:
            monkeypatch.delenv("ARL_FAULT_ONCE", raising=False)

    return set_fault


def make_faulty(split: str = "train", fault: dict[str, str] | None = None):
    return wrappers.make_env("faulty_env:Faulty-v0", history_length=0, prompt_style="compact", split=split,
                             fault=fault)


def collect(tokenizer, workers: int = 0, timeout: float | None = None):
    make = functools.partial(make_faulty, fault=faulty_env.fault_settings())  # this test's fault, also in workers
    runner = (EnvPool(make, len(SEEDS) * GROUP_SIZE, workers=workers, timeout=timeout)
              if workers else LocalEnvs(make))
    rollout = wrappers.GroupRollout(runner, len(SEEDS), GROUP_SIZE, env_id="faulty_env:Faulty-v0")
    stats: dict[str, float] = defaultdict(float)
    try:
        rows, episodes = collect_rows(FakeBackend(tokenizer), tokenizer, rollout, SEEDS, CONFIG, stats)
    finally:
        restarts = getattr(runner, "restarts", 0)
        rollout.close()
    return rows, episodes, stats, restarts


def groups_of(rows) -> set[int]:
    return {r.group for r in rows}


def assert_whole_groups(rows, episodes, groups: set[int]) -> None:
    """Every kept group has all its episodes, each played to its end, and no failed turn."""
    assert groups_of(rows) == groups and {e.group for e in episodes} == groups
    assert len(episodes) == GROUP_SIZE * len(groups) and all(e.done and e.stop != "env_error" for e in episodes)
    assert all(r.stop != "env_error" for r in rows)
    for e in episodes:  # an episode's rows are its turns, 0 .. length - 1
        assert sorted(r.turn for r in rows if r.episode == e.episode) == list(range(e.length))


@pytest.mark.parametrize("mode", ["raise", "reset"])
def test_a_failing_episode_drops_its_group(mode, tokenizer, fault):
    fault(mode, [22])
    rows, episodes, stats, _ = collect(tokenizer)
    assert_whole_groups(rows, episodes, {0, 2})  # group 1 (seed 22) failed twice: dropped
    # all 3 episodes of the group fail, on the first try and on the replay
    assert stats["env_errors"] == 6 and stats["retried_groups"] == 1 and stats["dropped_groups"] == 1
    metrics = stop_metrics(OneProcess(), stats)
    assert metrics["rollout/dropped_groups"] == 1 and metrics["stop/episode/env_error"] > 0


def test_a_group_that_fails_once_is_replayed_whole(tokenizer, fault):
    fault("raise", [22], step=2, once=True)
    rows, episodes, stats, _ = collect(tokenizer)
    assert_whole_groups(rows, episodes, {0, 1, 2})
    assert stats["env_errors"] == 1 and stats["retried_groups"] == 1 and stats["dropped_groups"] == 0


def test_a_killed_worker_is_restarted_and_its_group_replayed(tokenizer, fault):
    fault("exit", [33], step=1, once=True)
    rows, episodes, stats, restarts = collect(tokenizer, workers=2)
    assert_whole_groups(rows, episodes, {0, 1, 2})
    # the dead worker held other episodes too: they failed with it, their groups were replayed as well
    assert restarts == 1 and stats["retried_groups"] >= 1 and stats["dropped_groups"] == 0
    assert stats["env_errors"] >= 1


def test_a_hung_step_times_out(tokenizer, fault):
    fault("hang", [11], step=1)
    rows, episodes, stats, restarts = collect(tokenizer, workers=3, timeout=2.0)
    assert 0 not in groups_of(rows) and restarts >= 2  # the first try and the replay both hung: dropped
    assert stats["dropped_groups"] >= 1 and all(e.group != 0 for e in episodes)


def test_the_first_traceback_of_each_kind_is_printed_once(tokenizer, fault, capsys):
    from wrappers import groups

    groups._REPORTED.discard("RuntimeError")
    fault("raise", [11, 22])
    collect(tokenizer)
    err = capsys.readouterr().err
    assert err.count("env error in faulty_env:Faulty-v0") == 1 and "Traceback" in err
    collect(tokenizer)
    assert "injected fault" not in capsys.readouterr().err


class OneProcess:
    import torch

    device = torch.device("cpu")

    def reduce(self, t, reduction="sum"):
        return t


def test_evaluation_leaves_failed_episodes_out(fault):
    from eval.evaluate import evaluate_policy

    fault("raise", [5], step=1)
    result = evaluate_policy("Faulty-v0", "random", [4, 5, 6], samples=2, progress=False,
                             prompt_style="compact", env_kwargs={"split": "test"})
    assert result.failed_episodes == 2 and result.num_seeds == 2 and result.stops["stop/episode/env_error"] == 2 / 6


# --- a training run: the dropped group is absent from the gradient; repeated failures stop the run -------------
def run_script(tmp_path: Path, tiny: str, flags: list[str], env: dict[str, str], recorder: bool = False):
    base = ["--model-path", tiny, "--output-dir", str(tmp_path / "runs"), "--run-name", "r", "--env-id",
            "faulty_env:Faulty-v0", "--eval-split", "test", "--num-groups", "2", "--group-size", "3",
            "--max-turns", "3", "--max-response-tokens", "8", "--eval-every", "0", "--torch-threads", "1",
            "--mini-batch-size", "8", "--micro-batch-size", "3", *flags]
    if recorder:
        cmd = [sys.executable, str(ROOT / "tests" / "record_update.py"), "grpo", str(tmp_path / "rec"), *base]
    else:
        cmd = [sys.executable, str(ROOT / "algos" / "grpo.py"), *base]
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
                "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "RECORD_REAL_ROLLOUT": "1", **env}
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=600, cwd=ROOT)


def first_task_seed(iteration: int) -> int:
    from arena_train.rollout import task_seeds

    return task_seeds(1, iteration, 2, 0, 1)[0]


def test_the_dropped_group_is_absent_from_the_gradient(tiny_model, tmp_path):
    import torch
    from naive_update import reference_grads
    from test_reference_update import BASE, args_dict, optimizer_steps, relative_error

    # one optimizer step: its old log-probs come from the generation pass, a full forward's to float rounding,
    # which later off-policy steps would amplify past the tolerance
    flags = ["--mini-batch-size", "64", "--micro-batch-size", "3"]
    proc = run_script(tmp_path, tiny_model, [*BASE, *flags], {"ARL_FAULT": "raise", "ARL_FAULT_STEP": "1",
                                                    "ARL_FAULT_SEEDS": str(first_task_seed(1))}, recorder=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recorded = [torch.load(tmp_path / "rec" / "rank0.pt", weights_only=False)]
    rows = recorded[0]["rows"][0]
    assert rows and {r["group"] for r in rows} == {1}  # group 0 (the failing seed) left the update whole
    steps = optimizer_steps(recorded)
    got = recorded[0]["grads"]
    want = reference_grads("grpo", args_dict("grpo", flags), steps, tiny_model, applied=got)
    assert len(got) == len(want) == len(steps) == 1
    assert max(relative_error(g, w) for g, w in zip(got, want)) < 1e-5
    import json

    metrics = json.loads((tmp_path / "runs" / "r" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["rollout/dropped_groups"] == 1 and metrics["rollout/retried_groups"] == 1
    assert metrics["rollout/env_errors"] == 6  # all 3 episodes of the group fail on step 1, twice


def test_repeated_failures_stop_the_run_on_its_last_checkpoint(tiny_model, tmp_path):
    """In env workers (the in-process path stops the same way: FailureStreak reads only the pooled metrics)."""
    seeds = ",".join(str(first_task_seed(i)) for i in range(1, 5))
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = run_script(tmp_path, tiny_model, ["--num-iterations", "4", "--checkpoint-every", "1",
                                             "--max-env-failures", "2", "--env-workers", "1"],
                      {"ARL_FAULT": "raise", "ARL_FAULT_STEP": "1", "ARL_FAULT_SEEDS": seeds,
                       "ARL_FAULT_PIDS": str(pids)})
    assert proc.returncode == 1, proc.stderr[-3000:]
    message = proc.stderr.strip().splitlines()[-1]
    assert "2 consecutive iterations" in message and "faulty_env:Faulty-v0" in message
    assert "injected fault" in message
    run = tmp_path / "runs" / "r"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert (run / "checkpoints").exists() and not (run / "final").exists()
    alive = [p.name for p in pids.iterdir() if _alive(int(p.name))]  # the env workers ended with the run
    assert list(pids.iterdir()) and not alive


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
