"""End to end: a run resumed with nothing given again continues its recorded recipe, bit for bit as the straight
run, and its args.json keeps the start values with the change appended (algos/grpo.py, tiny model, CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
GRPO = ROOT / "algos" / "grpo.py"
#: A tiny run; evaluation off, a checkpoint every iteration.
SMALL = ["--num-groups", "2", "--group-size", "2", "--max-turns", "2", "--max-response-tokens", "4",
         "--mini-batch-size", "8", "--micro-batch-size", "8", "--eval-every", "0", "--checkpoint-every", "1"]
#: Recipe values away from the script's defaults: a resume that fell back to the defaults would train another run.
RECIPE = ["--kl-coef", "0.05", "--learning-rate", "3e-4", "--temperature", "0.7", "--entropy-coef", "0.01"]


def grpo(out: Path, model: str, *argv: str) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(GRPO), "--model-path", model, "--output-dir", str(out), "--run-name",
                           "r", *argv], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def logged(out: Path) -> list[str]:
    """The metric lines without wall times, as JSON text (exact floats)."""
    lines = [json.loads(line) for line in (out / "r" / "metrics.jsonl").read_text().splitlines()]
    return [json.dumps({k: v for k, v in m.items() if not k.startswith("perf/")}) for m in lines]


def weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "r" / "final" / "model.safetensors"))


@pytest.mark.slow
def test_a_run_resumed_with_nothing_given_again_trains_as_the_straight_run(tiny_model, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    grpo(straight, tiny_model, *SMALL, *RECIPE, "--num-iterations", "3")
    grpo(split, tiny_model, *SMALL, *RECIPE, "--num-iterations", "2")
    start = json.loads((split / "r" / "args.json").read_text())
    grpo(split, tiny_model, "--resume", "--num-iterations", "3")  # only the length: a flag that may change mid-run
    assert logged(straight) == logged(split) and len(logged(split)) == 3
    a, b = weights(straight), weights(split)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    record = json.loads((split / "r" / "args.json").read_text())
    assert {k: v for k, v in record.items() if k != "changes"} == start and start["kl_coef"] == 0.05
    assert record["changes"] == [{"from_iteration": 3, "changed": {"num_iterations": {"run": 2, "now": 3}}}]
