"""Every script's real update equals a naive reference of its math, however it is batched and distributed.

Each case runs one iteration of a method script (``tests/record_update.py``: the real loop on seeded synthetic
rows, its optimizer replaced by gradient-recording SGD) and recomputes every optimizer step's gradient with
``tests/naive_update.py`` (one batch, one process, a forward per row). The two must agree within 1e-5 relative,
for micro-batches of 1 row, 3 rows and the whole mini-batch, a padded-token budget, shared-prompt-prefix reuse
on and off, several mini-batches and epochs (so importance ratios move off 1 and clipping acts), step and
trajectory rows, rollout/trainer importance weights (TIS, MIS) against a disagreeing engine's log-probs, and two
processes that hold different numbers of rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import load_script, method_scripts, needs_accelerate, split_blocks, two_process_launch
from naive_update import reference_grads

from arena_models import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
RECORDER = Path(__file__).resolve().parent / "record_update.py"
#: One iteration: 2 groups x 3 episodes of up to 3 turns per process, SGD steps large enough to move the ratios.
BASE = ["--num-iterations", "1", "--num-groups", "2", "--group-size", "3", "--max-turns", "3",
        "--max-response-tokens", "8", "--eval-every", "0", "--checkpoint-every", "0", "--learning-rate", "0.3",
        "--max-grad-norm", "1e9", "--temperature", "0.9", "--kl-coef", "0.05", "--entropy-coef", "0.01",
        "--weight-decay", "0"]
TOLERANCE = 1e-5


def env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("model"), corpus=["Push every box (X) onto a target (O)."]))


def record(method: str, model: str, out: Path, flags: list[str], processes: int = 1) -> list[dict]:
    """Run the recorder; -> per process: rows, orders and recorded gradients."""
    argv = [str(out / "rec"), "--model-path", model, "--output-dir", str(out / "runs"), "--run-name", "r",
            *BASE, *flags]
    if processes == 1:
        cmd = [sys.executable, str(RECORDER), method, *argv]
    else:
        cmd = [*two_process_launch(RECORDER), method, *argv]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [torch.load(out / "rec" / f"rank{r}.pt", weights_only=False) for r in range(processes)]


def optimizer_steps(recorded: list[dict]) -> list[list[dict]]:
    """Per optimizer step, the rows of every process in it (group and episode ids keyed by process)."""
    per_rank = []
    for rank, rec in enumerate(recorded):
        rows = rec["rows"][0]
        for r in rows:
            r["gkey"], r["ekey"] = (rank, r["group"]), (rank, r["episode"])
        n_minibatches, orders = rec["orders"][0]
        per_rank.append([[rows[j] for j in part] for order in orders
                         for part in np.array_split(np.array(order, dtype=np.int64), n_minibatches)])
    return [sum(parts, []) for parts in zip(*per_rank)]


def args_dict(method: str, flags: list[str]) -> dict:
    from arena_train.cli import flat_args, parse_args

    script = load_script(method)
    return flat_args(parse_args(script.Args, script.GPU_PROFILE, [*BASE, *flags]))


def relative_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    got, want = torch.cat([g.flatten() for g in got]).double(), torch.cat([w.flatten() for w in want]).double()
    return float((got - want).norm() / want.norm())


def check(method: str, tiny: str, tmp_path: Path, flags: list[str], processes: int = 1,
          reference: str | None = None) -> None:
    """``method``'s recorded update against the naive one of ``reference`` (default: the method itself)."""
    recorded = record(method, tiny, tmp_path, flags, processes)
    steps = optimizer_steps(recorded)
    got = recorded[0]["grads"]
    want = reference_grads(reference or method, args_dict(method, flags), steps, tiny, applied=got)
    assert len(got) == len(want) == len(steps)
    for rec in recorded[1:]:  # every process stepped with the same (all-reduced) gradient
        assert all(relative_error(a, b) < 1e-7 for a, b in zip(rec["grads"], got))
    errors = [relative_error(g, w) for g, w in zip(got, want)]
    assert max(errors) < TOLERANCE, f"{method} {flags}: relative gradient errors {errors}"


#: Several mini-batches and two epochs: later steps run off-policy (ratios != 1, clipping and masks act).
MULTI = ["--mini-batch-size", "8", "--update-epochs", "2"]


@pytest.mark.parametrize("micro", ["1", "3", "64"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                 "seq-mean-token-sum-norm"])
def test_grpo_every_aggregation_and_micro_batch_size(agg, micro, tiny, tmp_path):
    check("grpo", tiny, tmp_path, ["--loss-agg-mode", agg, "--micro-batch-size", micro, *MULTI])


@pytest.mark.parametrize("flags", [
    ["--micro-batch-size", "64", "--micro-batch-tokens", "60"],  # a padded-token budget
    ["--micro-batch-size", "3", "--gradient-checkpointing"],  # prefixes spliced in instead of reused
    ["--micro-batch-size", "3", "--use-seq-mask", "--seq-mask-delta", "1e-4"],  # GRPO_SM
    ["--micro-batch-size", "3", "--no-norm-adv-by-std", "--loss-agg-mode", "seq-mean-token-sum-norm"],  # Dr.GRPO
    ["--micro-batch-size", "3", "--rollout-is", "tis", "--rollout-is-cap", "1.2"],
    ["--micro-batch-size", "3", "--rollout-is", "mis", "--rollout-is-cap", "1.2"],
    ["--micro-batch-size", "3", "--row-layout", "trajectory"],
    ["--micro-batch-size", "3", "--row-layout", "trajectory", "--loss-agg-mode", "seq-mean-token-sum-norm"],
], ids=["token-budget", "no-prefix-reuse", "seq-mask", "dr-grpo", "rollout-tis", "rollout-mis", "trajectory",
        "trajectory-dr-grpo"])
def test_grpo_paths(flags, tiny, tmp_path):
    check("grpo", tiny, tmp_path, [*flags, *MULTI])
    if "--rollout-is" in flags:  # the disagreement is measured and logged (noise of 0.3 nats per token)
        import json

        last = json.loads((tmp_path / "runs" / "r" / "metrics.jsonl").read_text().splitlines()[-1])
        assert last["rollout_is/ratio_out_frac"] > 0.3 and last["rollout_is/prob_diff_max"] > 0
        assert last["rollout_is/prob_diff_mean"] > 0


#: Per method: flags that switch on its own paths (with several micro-batches, mini-batches and epochs).
METHODS = {
    "gspo": ["--clip-ratio-low", "0.03", "--clip-ratio-high", "0.04"],
    "sapo": ["--use-seq-mask", "--seq-mask-delta", "1e-4"],
    "cispo": ["--use-seq-mask", "--seq-mask-delta", "1e-4"],
    "gigpo": ["--loss-agg-mode", "seq-mean-token-mean"],
    "empg": [],
    "dapo": ["--cold-start-steps", "0", "--max-num-gen-batches", "2", "--advantage", "gigpo"],
    "sampo": ["--cold-start-steps", "0", "--max-num-gen-batches", "2"],
    "rloo": [],
    "ppo": ["--critic-lr", "0.01"],
}


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_matches_its_reference(method, tiny, tmp_path):
    check(method, tiny, tmp_path, [*METHODS[method], "--micro-batch-size", "3", *MULTI])


#: The blocks that make a script's update: advantage estimator, policy loss, extra models, collection, scores and
#: advantages, the loss's normaliser, the micro-batch's loss (not the docstring, Args fields or extra metrics).
MATH_BLOCKS = slice(2, 9)
FORKS = [name for name in method_scripts() if name not in ("grpo", *METHODS)]


def family(name: str) -> str | None:
    """The known method whose update blocks are ``name``'s, character for character (None: its math is new, and
    the naive reference cannot know it)."""
    mine = split_blocks((ROOT / "algos" / f"{name}.py").read_text())[1][MATH_BLOCKS]
    return next((m for m in ("grpo", *METHODS)
                 if split_blocks((ROOT / "algos" / f"{m}.py").read_text())[1][MATH_BLOCKS] == mine), None)


@pytest.mark.parametrize("name", FORKS)
def test_a_fork_matches_its_familys_reference(name, tiny, tmp_path):
    """A copy of a script under a new name whose update blocks are a known method's: that method's reference."""
    if (known := family(name)) is None:
        pytest.skip(f"{name}.py has update blocks of its own: no naive reference of them to check against")
    check(name, tiny, tmp_path, [*METHODS.get(known, []), "--micro-batch-size", "3", *MULTI], reference=known)


@pytest.mark.slow
@needs_accelerate
@pytest.mark.parametrize("method,flags", [
    ("grpo", ["--micro-batch-size", "2"]),  # prefix reuse where one process has a row fewer: used to hang
    ("grpo", ["--micro-batch-size", "3", "--loss-agg-mode", "seq-mean-token-mean", "--use-seq-mask",
              "--seq-mask-delta", "1e-4"]),
    ("sampo", ["--micro-batch-size", "3", "--cold-start-steps", "0"]),
    ("empg", ["--micro-batch-size", "3"]),
    ("ppo", ["--micro-batch-size", "2", "--critic-lr", "0.01"]),  # a padding micro-batch on one process: used to crash
], ids=["grpo", "grpo-st-sm", "sampo", "empg", "ppo"])
def test_two_processes_with_unequal_rows(method, flags, tiny, tmp_path):
    check(method, tiny, tmp_path, [*flags, *MULTI], processes=2)


@pytest.mark.slow
@needs_accelerate
@pytest.mark.parametrize("name", FORKS)
def test_a_fork_matches_its_familys_reference_on_two_processes(name, tiny, tmp_path):
    if (known := family(name)) is None:
        pytest.skip(f"{name}.py has update blocks of its own: no naive reference of them to check against")
    check(name, tiny, tmp_path, [*METHODS.get(known, []), "--micro-batch-size", "2", *MULTI], processes=2,
          reference=known)
