"""The collapse alarm inside a real script run (``--on-collapse``): it fires, logs, stops on a healthy checkpoint
or rolls back to one with a smaller learning rate, and a resumed run keeps its decisions.

The tiny model's alarms are induced by hair-trigger thresholds on the KL to the reference (above 1.0001 x its
running median for one iteration): at a large learning rate that KL wanders, so the alarm fires within a few
iterations once its warm-up and history are in. The last test collapses a BC start for real (100x the learning
rate): the valid format falls to 0 at the first update on every seed tried.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from arena_models import build_tiny_model
from arena_train.checkpoint import verify_checkpoint

ROOT = Path(__file__).resolve().parents[1]
RUN = ["--num-groups", "2", "--group-size", "3", "--max-turns", "2", "--max-response-tokens", "6", "--eval-every",
       "0", "--checkpoint-every", "1", "--learning-rate", "5e-3", "--kl-coef", "0", "--collapse-warmup", "4",
       "--collapse-min-history", "4", "--collapse-kl-floor", "0", "--collapse-kl-factor", "1.0001",
       "--collapse-patience", "1"]


def env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("model"), corpus=["Push every box (X) onto a target (O)."]))


def run(tiny: str, out: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "algos" / "grpo.py"), "--model-path", tiny, "--output-dir", str(out),
           "--run-name", "r", *RUN, *flags]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def events(out: Path) -> list[dict]:
    return json.loads((out / "r" / "summary.json").read_text())["stability/events"]


def test_warn_logs_and_goes_on(tiny, tmp_path):
    proc = run(tiny, tmp_path, "--num-iterations", "14", "--on-collapse", "warn")
    fired = events(tmp_path)
    assert fired and all(e["action"] == "warn" and e["signal"] == "kl_blowup" for e in fired)
    assert fired[0]["iteration"] > 4  # nothing during the warm-up
    assert "collapse alarm at iteration" in proc.stdout + proc.stderr
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 14 and any(x.get("stability/kl_blowup") == 1.0 for x in lines)  # the run went on


def test_stop_ends_on_the_last_healthy_checkpoint(tiny, tmp_path):
    run(tiny, tmp_path, "--num-iterations", "14", "--on-collapse", "stop")
    first = events(tmp_path)[0]
    assert first["action"] == "stop" and first["checkpoint"] is not None and first["checkpoint"] + 1 < first["onset"]
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == first["iteration"] < 14  # the run ended at the alarm
    checkpoints = tmp_path / "r" / "checkpoints"
    newest = checkpoints / json.loads((checkpoints / "latest.json").read_text())["dir"]
    assert newest.name == f"iter_{first['iteration']:06d}"
    verify_checkpoint(newest)  # whole, with its manifest
    healthy = checkpoints / f"iter_{first['checkpoint']:06d}"
    # the final checkpoint holds the healthy weights
    assert (newest / "model.safetensors").read_bytes() == (healthy / "model.safetensors").read_bytes()


def test_rollback_restores_and_lowers_the_learning_rate_then_stops(tiny, tmp_path):
    # 24 iterations: the KL wanders around its running median, so each iteration after the history is rebuilt
    # may fire; seeds 1-6 measured the rollback at iterations 5-9 and the second alarm at 11-15
    run(tiny, tmp_path, "--num-iterations", "24", "--on-collapse", "rollback", "--max-rollbacks", "1",
        "--rollback-lr-scale", "0.5")
    fired = events(tmp_path)
    actions = [e["action"] for e in fired]
    assert actions[0] == "rollback" and "stop" in actions  # the second alarm is over the allowance
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["stability/rollbacks"] == 1 and summary["stability/lr_scale"] == 0.5
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert any("stability/rollback" in x for x in lines)
    assert any(x.get("stability/lr_scale") == 0.5 for x in lines)
    state = torch.load(sorted((tmp_path / "r" / "checkpoints").glob("iter_*"))[-1] / "optimizer.bin",
                       weights_only=False)
    assert state["param_groups"][0]["lr"] == pytest.approx(5e-3 * 0.5)


# ---- a real collapse on the mini-arena's env: a BC start, then 100x the CPU learning rate -------------------------
COLLAPSE = ["--num-groups", "4", "--group-size", "4", "--max-turns", "10", "--max-response-tokens", "8",
            "--learning-rate", "1e-2", "--temperature", "0.7", "--kl-coef", "0", "--checkpoint-every", "1",
            "--eval-every", "0"]


@pytest.fixture(scope="module")
def bc_start(tmp_path_factory) -> str:
    """A short behaviour cloning of the tiny model on Sokoban-Mini (algos/sft.py, the expert's 6-token responses,
    which fit the 8 tokens of COLLAPSE): valid format ~0.9."""
    out = tmp_path_factory.mktemp("bc")
    cmd = [sys.executable, str(ROOT / "algos" / "sft.py"), "--output-dir", str(out / "bc"), "--num-steps", "150",
           "--num-episodes", "300", "--eval-every", "150", "--eval-episodes", "20", "--max-response-tokens", "8",
           "--teacher", "expert"]
    proc = subprocess.run(cmd, env={**env(), "ARENA_CACHE": str(out / "cache")}, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(out / "bc")


def run_collapse(bc: str, out: Path, *flags: str) -> list[dict]:
    cmd = [sys.executable, str(ROOT / "algos" / "grpo.py"), "--model-path", bc, "--output-dir", str(out),
           "--run-name", "r", *COLLAPSE, *flags]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(x) for x in (out / "r" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_induced_collapse_on_the_mini_arena(bc_start, tmp_path):
    """Without an action the valid format falls from ~0.9 to 0 and stays there; the alarm fires at the end of its
    5-iteration warm-up; stop ends on the start weights; rollback (rate x0.03) brings the format back."""
    lines = run_collapse(bc_start, tmp_path / "warn", "--num-iterations", "12", "--on-collapse", "warn")
    start = lines[0]["rollout/valid_format_ratio"]
    assert start >= 0.7 and all(x["rollout/valid_format_ratio"] < 0.1 for x in lines[3:])  # the collapse
    fired = events(tmp_path / "warn")
    assert fired and fired[0]["iteration"] <= 6 and {e["signal"] for e in fired} >= {"format_drop"}

    run_collapse(bc_start, tmp_path / "stop", "--num-iterations", "12", "--on-collapse", "stop")
    first = events(tmp_path / "stop")[0]
    assert first["action"] == "stop" and first["iteration"] <= 6 and first["checkpoint"] == 0
    checkpoints = tmp_path / "stop" / "r" / "checkpoints"
    newest = checkpoints / json.loads((checkpoints / "latest.json").read_text())["dir"]
    verify_checkpoint(newest)
    assert (newest / "model.safetensors").read_bytes() == (checkpoints / "iter_000000" / "model.safetensors"
                                                           ).read_bytes()  # the pre-collapse weights

    lines = run_collapse(bc_start, tmp_path / "rollback", "--num-iterations", "16", "--on-collapse", "rollback",
                         "--rollback-lr-scale", "0.03")
    assert events(tmp_path / "rollback")[0]["action"] == "rollback"
    after = [x["rollout/valid_format_ratio"] for x in lines if x.get("stability/lr_scale") == pytest.approx(0.03)]
    assert len(after) >= 5 and min(after[1:]) >= 0.8 * start  # the format is back and stays
