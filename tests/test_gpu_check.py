"""``benchmarks/gpu_check.py``: its ``--smoke`` run on CPU (every stage of the GPU check, so the check cannot rot
before a GPU runs it), and the stage runner's promises: a failed stage is recorded and the next one runs, the
report is rewritten after every stage, a spent budget skips what is left."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"




gpu_check = load_benchmark("gpu_check")


@pytest.mark.slow
def test_smoke_runs_every_stage_and_reports(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": str(ROOT), "ARENA_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path), "--threads", "1",
                           "--budget-s", "900"], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    assert list(stages) == ["machine", "train", "perf", "mismatch", "larger"]
    assert {n: s["status"] for n, s in stages.items()} == {"machine": "ok", "train": "ok", "perf": "ok",
                                                           "mismatch": "ok", "larger": "skipped"}
    assert stages["machine"]["result"]["matmul_tflops"] > 0
    train = stages["train"]["result"]
    assert [r["run"] for r in train["runs"]] == ["grpo-Sokoban-Mini-v0-tiny", "sampo-Sokoban-Mini-v0-tiny"]
    for run in train["runs"]:
        assert run["checks"] == {"iterations": True, "finite_loss_and_grad_norm": True, "checkpoint_written": True,
                                 "resume_continues": True}
    assert train["distinct_responses"]["distinct"] >= 2
    perf = stages["perf"]["result"]["runs"]
    assert [r["run"] for r in perf] == [r["run"] for r in train["runs"]]
    for run in perf:
        assert run["peak_gib"] > 0 and run["plan_gib"] > 0 and run["peak_kind"] == "RSS"
        for it in run["iterations"]:
            assert it["rollout_tokens_per_s"] > 0 and it["update_tokens_per_s"] > 0 and 0 < it["update_mfu"]
    assert [it["iteration"] for it in perf[0]["iterations"]] == [1, 2]  # the --resume run added iteration 2
    for stats in stages["mismatch"]["result"]["rollout_is"]:
        assert stats and all(math.isfinite(v) for v in stats.values())
    text = (tmp_path / "report.md").read_text()
    assert "| grpo-Sokoban-Mini-v0-tiny | 2 |" in text and "| larger | skipped |" in text


def test_a_failed_stage_is_recorded_and_the_next_one_runs(tmp_path):
    seen = {}

    def fails(budget):
        raise gpu_check.StageError("out of memory", {"measured": 1.5})

    def reads_the_report(budget):  # the report on disk already holds the failed stage
        seen.update(json.loads((tmp_path / "report.json").read_text()))
        return {"budget": budget}

    def not_here(budget):
        raise gpu_check.Skipped("needs a GPU")

    report = {"stages": []}
    stages = {"a": lambda b: {"x": 1}, "b": fails, "c": reads_the_report, "d": not_here}
    failed = gpu_check.run_stages(stages, {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4}, 100.0, tmp_path, report)
    assert failed == 1
    assert [(s["name"], s["status"]) for s in report["stages"]] == [("a", "ok"), ("b", "failed"), ("c", "ok"),
                                                                    ("d", "skipped")]
    b = report["stages"][1]
    assert b["error"] == "StageError: out of memory" and b["result"] == {"measured": 1.5}
    assert [(s["name"], s["status"]) for s in seen["stages"]] == [("a", "ok"), ("b", "failed")]
    # c gets its own 30 s plus nearly all that a and b left of their 10 + 20 s
    assert 55 < report["stages"][2]["result"]["budget"] <= 60
    assert json.loads((tmp_path / "report.json").read_text()) == json.loads(json.dumps(report))
    assert "| b | failed |" in (tmp_path / "report.md").read_text()


def test_a_spent_budget_keeps_the_first_stage_and_skips_the_rest(tmp_path):
    report = {"stages": []}
    stages = {"machine": lambda b: {"gpu": None}, "train": lambda b: pytest.fail("ran past the budget")}
    assert gpu_check.run_stages(stages, {"machine": 0.5, "train": 0.5}, 0.0, tmp_path, report) == 0
    assert [s["status"] for s in report["stages"]] == ["ok", "skipped"]
    assert report["stages"][1]["error"] == "the budget is spent"


def test_iteration_perf_shares_and_mfu():
    m = {"iteration": 3, "perf/time_rollout_s": 6.0, "perf/time_score_s": 2.0, "perf/time_update_s": 4.0,
         "perf/rollout_tokens_per_s": 100.0, "perf/update_tokens_per_s": 1000.0}
    out = gpu_check.iteration_perf(m, params=10**9, peak_tflops=600.0)
    assert (out["share_generate_env"], out["share_score"], out["share_update"]) == (0.4, 0.2, 0.4)
    assert out["time_s"] == 10.0
    assert out["update_mfu"] == pytest.approx(6 * 10**9 * 1000.0 / 600e12)
