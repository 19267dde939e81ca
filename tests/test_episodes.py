"""Episode records (arena_train.episodes), the run's verdict (arena_train.verdict) and eval.evaluate --run: the
record helpers on their own, then one tiny algos/grpo.py run (seconds) whose records, verdict and final held-out
evaluation are checked, the last one reproduced episode by episode by ``eval.evaluate --run``."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from arena_train.episodes import (
    SCHEMA,
    TurnTap,
    clip_text,
    encode_records,
    new_messages,
    read_episodes,
    write_episodes,
)
from arena_train.rows import EPISODE_STOPS, TURN_STOPS
from arena_train.stats import clustered_proportion_ci, paired_difference_ci, proportion_ci

ROOT = Path(__file__).resolve().parents[1]
EVAL_EPISODES = 4
RUN = ["--num-iterations", "2", "--num-groups", "2", "--group-size", "3", "--max-turns", "3",
       "--max-response-tokens", "8", "--mini-batch-size", "8", "--micro-batch-size", "8", "--eval-every", "2",
       "--eval-episodes", str(EVAL_EPISODES), "--checkpoint-every", "0", "--log-episodes", "4", "--temperature", "1.0"]


# --- record helpers --------------------------------------------------------------------
def test_text_is_bounded_and_the_cut_is_marked():
    assert clip_text("abc", 5) == "abc"
    cut = clip_text("x" * 50, 10)
    assert cut.startswith("x" * 10) and "40 more characters cut" in cut and len(cut) < 50


def test_new_messages_leave_out_what_the_previous_prompt_showed():
    system, first, second = ({"role": "system", "content": "rules"}, {"role": "user", "content": "board 1"},
                             {"role": "user", "content": "board 2"})
    assert new_messages([system, first], None) == [system, first]
    assert new_messages([system, second], [system, first]) == [second]
    assert new_messages([system, first], [system, first]) == []
    assert new_messages([system, first, {"role": "assistant", "content": "up"}, second], [system, first]) == [
        {"role": "assistant", "content": "up"}, second]


class FakeRollout:
    """The part of wrappers.GroupRollout a tap touches: reset, step and the group of an episode."""

    group_size = 2

    def __init__(self):
        self.calls = 0

    def group_of(self, episode):
        return episode // self.group_size

    def reset(self, seeds, groups=None):
        self.calls += 1

    def step(self, responses, max_turns=None):
        return [SimpleNamespace(episode=i, turn=0, response=r, attempt=self.calls) for i, r in responses.items()]


def test_a_tap_keeps_the_last_attempt_of_a_replayed_group_and_forwards_the_rest():
    tap = TurnTap(FakeRollout())
    tap.reset([1, 2])
    tap.step({0: "a", 1: "b", 2: "c", 3: "d"})
    tap.reset([1, 2], groups=[1])  # group 1 (episodes 2, 3) replayed
    tap.step({2: "c2", 3: "d2"})
    assert {i: [t.response for t in ts] for i, ts in tap.turns.items()} == {0: ["a"], 1: ["b"], 2: ["c2"],
                                                                            3: ["d2"]}
    assert tap.group_size == 2 and tap.calls == 2  # everything else is the rollout's


def test_files_are_bounded_atomic_and_read_back(tmp_path):
    records = [{"schema": SCHEMA, "episode": k, "won": k % 2 == 0,
                "turns": [{"seen": [], "response": "y" * 1000}]} for k in range(10)]
    text, cut = encode_records(records, max_bytes=3500)
    assert cut == 8 and len(text.encode()) <= 3500  # the last 8 lose their texts; no episode is left out
    path = tmp_path / "episodes" / "eval_000000.jsonl"
    assert write_episodes(path, records, max_bytes=3500) == 10
    back = read_episodes(path)
    assert back[:2] == records[:2] and read_episodes(path.parent) == back
    assert [(r["episode"], r["won"]) for r in back] == [(r["episode"], r["won"]) for r in records]
    assert [r.get("cut") for r in back] == [None] * 2 + ["texts"] * 8 and back[2]["turns"][0]["response"] == ""
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    path.write_text(json.dumps({"schema": SCHEMA + 1}) + "\n")
    with pytest.raises(SystemExit, match="schema"):
        read_episodes(path)


# --- intervals -------------------------------------------------------------------------
def test_paired_gain_interval_stays_in_range_contains_the_gain_and_covers():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 40)
        pairs = [(rng.random() < 0.5, rng.random() < 0.5) for _ in range(n)]
        est = paired_difference_ci(pairs)
        assert -1 <= est.low <= est.mean <= est.high <= 1 and est.n == n
    assert paired_difference_ci([(True, True)] * 10).mean == 0.0
    assert paired_difference_ci([(False, True)] * 10).low > 0  # ten gains out of ten: the gain is positive
    # coverage of the true gain 0.2 (start 0.4, final 0.6, correlated pairs) near the nominal 95 %
    hits, trials = 0, 400
    for _ in range(trials):
        pairs = []
        for _ in range(60):
            before = rng.random() < 0.4
            after = before if rng.random() < 0.5 else rng.random() < 0.6
            pairs.append((before, after))
        # P(after) = 0.5 * P(before) + 0.5 * 0.6 = 0.5: the true gain is 0.1
        est = paired_difference_ci(pairs)
        hits += est.low <= 0.1 <= est.high
    assert 0.9 <= hits / trials <= 0.99


def test_success_with_several_samples_per_seed_stays_in_range():
    rng = random.Random(1)
    for _ in range(300):
        groups = [[float(rng.random() < 0.3) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 5))]
        est = clustered_proportion_ci(groups)
        assert 0 <= est.low <= est.mean <= est.high <= 1
    one_each = [[1.0], [0.0], [1.0], [0.0], [0.0]]
    single = clustered_proportion_ci(one_each)  # one episode per seed: Wilson over the episodes
    assert (single.mean, single.low, single.high) == pytest.approx(tuple(getattr(proportion_ci(2, 5), k)
                                                                         for k in ("mean", "low", "high")))
    # seeds that always win or always lose carry the information of one episode each, not four
    correlated = clustered_proportion_ci([[1.0] * 4, [0.0] * 4, [1.0] * 4, [0.0] * 4])
    naive = proportion_ci(8, 16)
    assert correlated.high - correlated.low > naive.high - naive.low


# --- a tiny training run ---------------------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tiny_model, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("episodes_run")
    cmd = [sys.executable, str(ROOT / "algos" / "grpo.py"), "--model-path", tiny_model, "--output-dir", str(out),
           "--run-name", "r", *RUN]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "r", proc.stdout


def test_a_run_records_training_and_every_held_out_episode(run_dir):
    folder, _ = run_dir
    names = sorted(p.name for p in (folder / "episodes").iterdir())
    assert names == ["eval_000000.jsonl", "eval_000002.jsonl", "train_000001.jsonl", "train_000002.jsonl"]
    train = read_episodes(folder / "episodes" / "train_000001.jsonl")
    assert len(train) == 4 and {r["source"] for r in train} == {"train"} and {r["iteration"] for r in train} == {1}
    assert [(r["group"], r["sample"]) for r in train] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    for record in train:
        assert record["env_id"] == "ARL/Sokoban-Mini-v0" and record["split"] == "train"
        assert record["stop"] in EPISODE_STOPS and record["length"] == len(record["turns"]) >= 1
        assert record["return"] == pytest.approx(sum(t["reward"] for t in record["turns"]))
        assert record["turns"][0]["seen"][0]["role"] == "system"  # the first turn shows the whole prompt
        for turn in record["turns"]:
            assert turn["stop"] in TURN_STOPS and isinstance(turn["advantage"], float)
            assert set(turn) >= {"response", "action", "format_ok", "action_valid", "reward"}
    for name in ("eval_000000.jsonl", "eval_000002.jsonl"):
        held_out = read_episodes(folder / "episodes" / name)
        assert sorted(r["task_seed"] for r in held_out) == [1_000_000_000 + k for k in range(EVAL_EPISODES)]
        assert all(r["split"] == "test" and r["turns"][0]["advantage"] is None for r in held_out)


def test_a_run_ends_with_its_verdict(run_dir):
    folder, output = run_dir
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [0, 1, 2] and "eval/success_rate" in metrics[0]
    verdict = json.loads((folder / "summary.json").read_text())["verdict"]
    assert (verdict["start"]["iteration"], verdict["final"]["iteration"]) == (0, 2)
    assert verdict["final"]["success"] == metrics[-1]["eval/success_rate"]
    assert verdict["gain"]["pairs"] == EVAL_EPISODES and -1 <= verdict["gain"]["low"] <= verdict["gain"]["high"] <= 1
    last = output.strip().splitlines()[-1]  # stdout (the progress bar is on stderr)
    assert last.startswith("verdict: held-out success start") and "paired, 4 task seeds" in last


def test_evaluate_run_reproduces_the_runs_final_evaluation(run_dir, tmp_path, capsys):
    from eval.evaluate import Args, main

    folder, _ = run_dir
    out = tmp_path / "episodes.jsonl"
    assert main(Args(run=folder, baselines=[], progress=False, episodes=out, max_turns=5)) == 0
    printed = capsys.readouterr().out
    assert f"settings from the run {folder}" in printed
    assert "note: --max-turns 5 differs from the run's 3" in printed
    assert main(Args(run=folder, baselines=[], progress=False, episodes=out)) == 0
    mine = {r["task_seed"]: r for r in read_episodes(out)}
    theirs = {r["task_seed"]: r for r in read_episodes(folder / "episodes" / "eval_000002.jsonl")}
    assert mine.keys() == theirs.keys()
    for seed, record in theirs.items():  # the same episodes, token for token
        assert mine[seed]["won"] == record["won"]
        assert [t["response"] for t in mine[seed]["turns"]] == [t["response"] for t in record["turns"]]


def test_evaluate_says_which_settings_it_used_and_refuses_k_over_samples(tiny_model, capsys):
    from eval.evaluate import Args, main

    assert main(Args(model=tiny_model, num_seeds=1, samples=2, k=[1, 4], progress=False)) == 2
    err = capsys.readouterr().err
    assert "--k 4" in err and "--samples 2" in err
    assert main(Args(model=tiny_model, num_seeds=1, baselines=[], decoding=["greedy"], max_turns=1,
                     progress=False)) == 0
    printed = capsys.readouterr().out
    assert "settings from the training scripts' cpu-tiny defaults" in printed and "prompt_style=compact" in printed


def test_a_run_record_without_some_settings_takes_the_training_defaults_for_them(run_dir, tmp_path):
    from eval.evaluate import Args, resolve_settings

    folder, _ = run_dir
    old = tmp_path / "old"
    old.mkdir()
    (old / "final").symlink_to(folder / "final")
    (old / "args.json").write_text(json.dumps({"env_id": ["ARL/Sokoban-Mini-v0"], "max_turns": 3, "seed": 5}))
    args, notes = resolve_settings(Args(run=old))
    assert (args.max_turns, args.seed, args.prompt_style, args.model) == (3, 5, "compact", str(old / "final"))
    assert "with the training defaults for" in notes[0] and "prompt_style" in notes[0]


def test_a_non_finite_number_is_written_as_null_not_a_crash(tmp_path):
    """An env that returns NaN or inf must not kill the run while its episodes are written (before a checkpoint)."""
    from arena_train.episodes import read_episodes, write_episodes

    record = {"schema": 1, "episode": 0, "env_return": float("nan"), "turns": [{"reward": float("inf")}],
              "won": False}
    path = tmp_path / "train_000001.jsonl"
    assert write_episodes(path, [record]) == 1
    back = read_episodes(path)
    assert back[0]["env_return"] is None and back[0]["turns"][0]["reward"] is None
