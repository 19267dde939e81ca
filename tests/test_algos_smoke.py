"""Smoke runs of every method script on Sokoban with a tiny model (subprocesses, CPU): 2 iterations each,
every method with its own options switched on, and every other copy of grpo.py under algos/ (a fork) with its
defaults; the scripts with process-crossing statistics also under ``accelerate launch`` with two processes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import method_scripts, needs_accelerate, two_process_launch

from arena_models import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--num-iterations", "2", "--num-groups", "2", "--group-size", "2", "--max-turns", "3",
         "--max-response-tokens", "8", "--mini-batch-size", "6", "--micro-batch-size", "4", "--eval-every", "0",
         "--eval-episodes", "2"]
#: Per method: options that exercise its own code paths, and metric keys it must log besides the common ones.
CASES = {
    "gspo": ([], []),
    "sapo": (["--use-seq-mask"], []),
    "cispo": (["--use-seq-mask"], []),
    "gigpo": (["--gigpo-mode", "mean_norm", "--similarity-thresh", "0.9"],
              ["rollout/step_adv_abs", "rollout/grouped_step_ratio"]),
    "empg": ([], ["rollout/empg_g_min", "rollout/empg_g_max"]),
    "rloo": ([], []),
    "dapo": (["--cold-start-steps", "1", "--max-num-gen-batches", "2", "--advantage", "gigpo",
              "--overlong-penalty-factor", "0.1", "--clip-ratio-high", "0.28"],
             ["rollout/gen_batches", "rollout/kept_groups", "rollout/informative_groups"]),
    "sampo": (["--cold-start-steps", "0", "--max-num-gen-batches", "2"],
              ["rollout/gen_batches", "rollout/kept_groups", "rollout/step_adv_abs"]),
    "ppo": (["--kl-in-reward", "--gamma", "0.99", "--lam", "0.95"],
            ["actor/value_loss", "actor/value_clipfrac", "actor/critic_grad_norm"]),
}
#: grpo.py has its own smoke tests (tests/test_grpo_smoke.py); a fork not in CASES runs with its defaults.
SCRIPTS = sorted(set(CASES) | set(method_scripts()) - {"grpo"})
COMMON_KEYS = ["rollout/success_rate", "rollout/valid_format_ratio", "rollout/num_rows", "actor/pg_loss",
               "actor/clipfrac_upper", "actor/clipfrac_lower", "actor/approx_kl", "actor/kl_ref", "actor/entropy",
               "actor/grad_norm", "actor/skipped_updates"]


def env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("model"), corpus=["Push every box (X) onto a target (O)."]))


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs_two_iterations(name, tiny, tmp_path):
    options, keys = CASES.get(name, ([], []))
    cmd = [sys.executable, str(ROOT / "algos" / f"{name}.py"), "--model-path", tiny, "--output-dir", str(tmp_path),
           "--run-name", "r", *SMALL, *options]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = read_metrics(tmp_path / "r")
    assert [m["iteration"] for m in lines] == [1, 2]
    for m in lines:
        missing = set(COMMON_KEYS + keys) - set(m)
        assert not missing, missing
        assert all(math.isfinite(v) for v in m.values()), m
        assert m["actor/skipped_updates"] == 0
    args = json.loads((tmp_path / "r" / "args.json").read_text())
    assert args["exp_name"] == name
    if name in ("dapo", "sampo"):  # groups are atomic: rows of whole groups of 2 episodes x 3 turns
        assert all(m["rollout/num_rows"] % 6 == 0 for m in lines)
        assert lines[0]["rollout/gen_batches"] == (1 if name == "dapo" else 2)  # dapo: cold start on iteration 1


@pytest.mark.slow
@needs_accelerate
@pytest.mark.parametrize("name", ["ppo", "empg", "sampo"])  # critic DDP + global whitening, gathers, per-rank sampling
def test_two_process_run_keeps_ranks_in_sync(name, tiny, tmp_path):
    options, _ = CASES[name]
    cmd = [*two_process_launch(ROOT / "algos" / f"{name}.py"), "--model-path", tiny, "--output-dir", str(tmp_path),
           "--run-name", "r", *SMALL, *options, "--learning-rate", "1e-3"]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["param_sync_error"] == 0.0
    assert [m["actor/skipped_updates"] for m in read_metrics(tmp_path / "r")] == [0, 0]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "sampo"])
def test_script_runs_on_swe_mini(name, tiny, tmp_path):
    """The repository-level env through the same scripts: multi-line command actions, sandboxed test runs."""
    options, _ = CASES.get(name, ([], []))
    cmd = [sys.executable, str(ROOT / "algos" / f"{name}.py"), "--model-path", tiny, "--output-dir", str(tmp_path),
           "--run-name", "r", "--env-id", "ARL/SWE-Mini-v0", *SMALL, *options]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = read_metrics(tmp_path / "r")
    assert [m["iteration"] for m in lines] == [1, 2]
    assert all(math.isfinite(v) for m in lines for v in m.values())
