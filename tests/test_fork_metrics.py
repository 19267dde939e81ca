"""A script declares its own metrics and loss terms inside its blocks: a fork of grpo.py that adds a loss term
(``loss_term``), a count (``count``) and iteration statistics (``Update.statistic``) logs each one weighted as
declared, equal to a hand computation from the rows it trained on, without a line of ``arena_train`` edited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import needs_accelerate, two_process_launch

from arena_train.cli import EngineArgs
from arena_train.update import Update, count, loss_term

ROOT = Path(__file__).resolve().parents[1]
ADVANTAGES = "        spread_advantages(rows, segments, advantages)\n"
#: Block 8 of the fork, after GRPO's advantages: a turn bonus, two statistics and the rows for the hand check.
FORK_ADVANTAGES = ADVANTAGES + '''\
        for row in rows:
            row.advantage = row.advantage + 0.1 * row.turn
        update.statistic("fork/mean_turn", float(np.mean([r.turn for r in rows])), weight=len(rows))
        update.statistic("fork/most_rows", float(len(rows)), reduce="max")
        np.savez(os.path.join(args.run.output_dir, f"rank{rank}.npz"), adv=np.array([r.advantage for r in rows]),
                 tokens=np.array([len(r.response_ids) for r in rows]), turn=np.array([r.turn for r in rows]),
                 order=np.array(orders[0]), n_minibatches=n_minibatches)
'''
LOSS = "                    loss = pg_loss + args.kl_coef * kl_ref - args.entropy_coef * entropy_bonus\n"
IMPORTS = "from arena_train.rewards import segment_scores, spread_advantages\n"
#: Block 10 of the fork: the squared advantage as a loss term (no gradient: it tests the bookkeeping) and a count.
FORK_LOSS = '''\
                    adv_sq = agg_loss(batch["advantages"] ** 2 + 0.0 * logp, mask, args.loss_agg_mode, counts)
                    loss = pg_loss + args.kl_coef * kl_ref - args.entropy_coef * entropy_bonus + adv_sq
                    metrics.update(adv_sq=loss_term(adv_sq.detach()), long_rows=count((mask.sum(-1) > 3).sum()))
'''


def fork() -> str:
    text = (ROOT / "algos" / "grpo.py").read_text()
    assert text.count(ADVANTAGES) == 1 and text.count(LOSS) == 1 and text.count(IMPORTS) == 1
    text = text.replace(IMPORTS, IMPORTS + "from arena_train.update import count, loss_term\n")  # block 2
    return text.replace(ADVANTAGES, FORK_ADVANTAGES).replace(LOSS, FORK_LOSS)


def hand(dumps: list[dict]) -> dict[str, float]:
    """The fork's numbers from its rows: the loss term's token-mean over each mini-batch (every process's share of
    it), averaged over the mini-batches; the count summed over all rows; the row-weighted mean turn; the most rows."""
    n = int(dumps[0]["n_minibatches"])
    parts = [np.array_split(d["order"], n) for d in dumps]
    per_minibatch = []
    for k in range(n):
        adv = np.concatenate([d["adv"][p[k]] for d, p in zip(dumps, parts)])
        tokens = np.concatenate([d["tokens"][p[k]] for d, p in zip(dumps, parts)])
        per_minibatch.append(float(np.sum(adv ** 2 * tokens) / np.sum(tokens)))
    turns = np.concatenate([d["turn"] for d in dumps])
    return {"actor/adv_sq": float(np.mean(per_minibatch)),
            "actor/long_rows": float(sum(np.sum(d["tokens"] > 3) for d in dumps)),
            "fork/mean_turn": float(np.mean(turns)), "fork/most_rows": float(max(len(d["adv"]) for d in dumps))}


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=[pytest.mark.slow, needs_accelerate])])
def test_a_forks_loss_term_count_and_statistics_are_logged_as_declared(processes, tiny_model, tmp_path):
    script = tmp_path / "fork.py"
    script.write_text(fork())
    launch = [sys.executable, str(script)] if processes == 1 else two_process_launch(script)
    flags = ["--model-path", tiny_model, "--output-dir", str(tmp_path), "--run-name", "r", "--num-iterations", "1",
             "--num-groups", "2", "--group-size", "3", "--max-turns", "3", "--max-response-tokens", "6",
             "--mini-batch-size", "4", "--micro-batch-size", "2", "--eval-every", "0", "--checkpoint-every", "0",
             "--log-episodes", "0"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([*launch, *flags], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = json.loads((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()[-1])
    dumps = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(processes)]
    want = hand(dumps)
    assert sum(len(d["order"]) for d in dumps) > 4 * processes  # several mini-batches of several micro-batches
    assert want["actor/adv_sq"] > 0 and want["actor/long_rows"] > 0
    for key, value in want.items():
        assert logged[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (key, logged[key], value)


class OneProcess:
    """What ``Update`` needs of an accelerator, for one process (reductions are the identity)."""

    device, num_processes = "cpu", 1

    def reduce(self, t, reduction="sum"):
        return t

    def gather(self, t):
        return t


def test_statistics_reduce_as_declared_and_refuse_an_unknown_reduction():
    update = Update(OneProcess(), EngineArgs(), pad_id=0, max_len=1, other_engine=False, env_names=["a"])
    update.statistic("m/mean", 3.0, weight=5)
    update.statistic("m/sum", 2.0, reduce="sum")
    update.statistic("m/min", -1.0, reduce="min")
    assert update._reduced_statistics() == {"m/mean": 3.0, "m/sum": 2.0, "m/min": -1.0}
    assert update._reduced_statistics() == {}  # one iteration's: cleared once logged
    with pytest.raises(ValueError, match="reduce must be"):
        update.statistic("m/x", 1.0, reduce="median")
    assert loss_term(1.0).kind == "loss_term" and count(2).kind == "count"
