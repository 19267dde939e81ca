"""Rows are complete or loud: ``score_rows`` leaves the update's first mini-batch to the update's own forward pass,
and reading such a row's ``old_logp`` or ``entropy`` before it is filled raises ``RowNotScored`` (naming the call
that fills it) instead of returning the placeholder None / 0.0; ``score_all(rows)`` fills them with the same numbers
as scoring every row up front, and a fork of grpo.py whose advantage reads them gets the up-front run's result."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from arena_train.batching import fill_old_logp, make_batch, score_all, score_rows
from arena_train.models import load_model_and_tokenizer
from arena_train.rows import Row, RowNotScored

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[11, 12], [13], [14, 15, 16], [17], [18, 19], [21]]
RESPONSES = [[20, 21, 22], [23], [24, 25], [26, 27, 28, 29], [30], [31, 32]]
FIRST = {1, 4}  # the update's first mini-batch (``first_minibatch``)


def rows() -> list[Row]:
    return [Row(group=0, episode=k, turn=0, prompt_ids=p, response_ids=r, step_reward=0.0, format_penalty=0.0,
                format_ok=True, action_is_valid=True, anchor=None, won=False)
            for k, (p, r) in enumerate(zip(PROMPTS, RESPONSES))]


@pytest.fixture(scope="module")
def model(tiny_model):
    return load_model_and_tokenizer(tiny_model, torch.float32)[0].eval()


def score(model, batch: list[Row], skip=frozenset()) -> None:
    score_rows(model, model, batch, micro_batch_size=2, temperature=0.9, pad_id=0, device="cpu",
               stats=defaultdict(float), skip_policy=skip)


def test_rows_left_for_the_update_raise_until_score_all(model):
    left = rows()
    score(model, left, FIRST)
    for j, r in enumerate(left):
        if j in FIRST:
            for name in ("old_logp", "entropy"):
                with pytest.raises(RowNotScored, match=re.escape("score_all(rows)")):
                    getattr(r, name)
            assert "<not scored yet>" in repr(r)  # printing such a row still works
        else:
            assert r.old_logp is not None and r.entropy > 0
    up_front = rows()
    score(model, up_front)
    score_all(left)
    for a, b in zip(left, up_front):
        np.testing.assert_allclose(a.old_logp, b.old_logp, atol=1e-5)
        assert a.entropy == pytest.approx(b.entropy, abs=1e-5)
    assert all(make_batch(left, 0, "cpu")["has_old_logp"])  # the update takes these old log-probs


def test_the_update_fills_old_logp_but_not_entropy(model):
    """The update's first forward gives the old log-probs (kept by a later ``score_all``); entropy stays loud."""
    left = rows()
    score(model, left, FIRST)
    first = [left[j] for j in sorted(FIRST)]
    batch = make_batch(first, 0, "cpu")
    assert not batch["has_old_logp"].any()
    fill_old_logp(batch, torch.full(batch["mask"].shape, -2.5), first)
    assert all(np.all(r.old_logp == -2.5) for r in first)
    with pytest.raises(RowNotScored, match="entropy"):
        _ = first[0].entropy
    score_all(left)
    assert all(np.all(r.old_logp == -2.5) and r.entropy > 0 for r in first)  # the update's numbers stay


def test_rows_never_scored_keep_their_defaults():
    r = rows()[0]
    assert r.old_logp is None and r.entropy == 0.0
    score_all([r])  # nothing was left for later: nothing to do
    assert r.old_logp is None


#: Block 8 of the fork: GRPO's advantage, shaped by each row's old entropy and mean old log-prob.
FORK_ADVANTAGE = '''\
        score_all(rows)  # every row's old_logp and entropy now, the first mini-batch's included
        segments = segment_scores(rows, args.reward_density)
        spread_advantages(rows, segments, compute_advantages(segments.score, segments.group, segments.episode))
        for row in rows:
            row.advantage = row.advantage + 0.5 * row.entropy + 0.1 * float(np.mean(row.old_logp))
        np.save(os.path.join(args.run.output_dir, "advantages.npy"),
                np.array([[r.episode, r.turn, r.entropy, np.mean(r.old_logp), r.advantage] for r in rows]))
'''
SKIP = "skip_policy=first_minibatch(orders, n_minibatches)"


def fork(text: str, up_front: bool) -> str:
    """grpo.py's ``text`` with the entropy-shaped advantage block; ``up_front``: every row scored before it."""
    head, rest = text.split("        # ALGO LOGIC: scores and advantages of the rows (into `row.advantage`)\n")
    _, tail = rest.split("        # END ALGO LOGIC\n", 1)
    text = f"{head}        # ALGO LOGIC: entropy-shaped advantages\n{FORK_ADVANTAGE}        # END ALGO LOGIC\n{tail}"
    imports = "from arena_train.rewards import segment_scores, spread_advantages\n"  # block 2: its imports
    assert text.count(imports) == 1
    text = text.replace(imports, "from arena_train.batching import score_all\n" + imports)
    assert text.count(SKIP) == 1
    return text.replace(SKIP, "skip_policy=frozenset()") if up_front else text


def test_fork_reading_entropy_and_old_logp_equals_scoring_every_row_up_front(tiny_model, tmp_path):
    """The same fork twice: the skeleton as is (score_all fills the first mini-batch's rows) and with every row
    scored up front. Rollouts are seeded alike, so the advantages must agree row by row."""
    flags = ["--model-path", tiny_model, "--run-name", "r", "--num-iterations", "1", "--num-groups", "2",
             "--group-size", "3", "--max-turns", "3", "--max-response-tokens", "6", "--mini-batch-size", "4",
             "--micro-batch-size", "3", "--eval-every", "0", "--checkpoint-every", "0", "--log-episodes", "0"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "CUDA_VISIBLE_DEVICES": ""}
    procs, grpo = [], (ROOT / "algos" / "grpo.py").read_text()  # one reading: both forks of the same text
    for name in ("lazy", "up_front"):
        (tmp_path / name).mkdir()
        script = tmp_path / name / "entropy_fork.py"
        script.write_text(fork(grpo, name == "up_front"))
        procs.append(subprocess.Popen([sys.executable, str(script), *flags, "--output-dir", str(tmp_path / name)],
                                      env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    lazy, up_front = (np.load(tmp_path / name / "advantages.npy") for name in ("lazy", "up_front"))
    assert lazy.shape == up_front.shape and len(lazy) > 4  # more than one mini-batch: some rows were left
    np.testing.assert_array_equal(lazy[:, :2], up_front[:, :2])  # the same rows in the same order
    assert np.all(lazy[:, 2] > 0)  # every entropy filled, none the 0.0 placeholder
    np.testing.assert_allclose(lazy[:, 2:], up_front[:, 2:], rtol=0, atol=1e-5)
