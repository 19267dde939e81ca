"""Scaling a run: the DDP and FSDP2 Accelerate files (algos/configs) run grpo.py and sampo.py on two CPU processes
(gloo), and so does the ZeRO-3 file for grpo.py where DeepSpeed is installed: the same metrics and final weights
as DDP for the same seed. Without DeepSpeed the ZeRO-3 file is refused clearly. A LoRA run trains and saves a
merged HF folder; --dry-run states the memory plan."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import launch_config, needs_accelerate

from arena_train.memory import LORA_TARGETS

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
#: Wall-clock and throughput metrics differ between any two runs.
TIMING = ("perf/", "rollout/push_time_s")


def launch(config: str, script: str, model: str, out: Path) -> subprocess.CompletedProcess:
    return launch_config(config, script, model, out, env=ENV)


HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory, tiny_model):
    """script -> run folder of its DDP reference run (made once per script)."""
    runs: dict[str, Path] = {}

    def run(script: str) -> Path:
        if script not in runs:
            out = tmp_path_factory.mktemp(f"ddp_{script}")
            proc = launch("ddp", script, tiny_model, out)
            assert proc.returncode == 0, f"ddp: {proc.stderr[-4000:]}"
            runs[script] = out / "ddp"
        return runs[script]

    return run


@pytest.mark.slow
@needs_accelerate
@pytest.mark.parametrize(("script", "config"), [
    ("grpo", "fsdp2"), ("sampo", "fsdp2"),
    pytest.param("grpo", "zero3", marks=pytest.mark.skipif(not HAS_DEEPSPEED, reason="the deepspeed extra is absent"))])
def test_sharded_runs_agree_with_ddp(tmp_path, tiny_model, ddp_runs, script, config):
    from safetensors.torch import load_file

    proc = launch(config, script, tiny_model, tmp_path)
    assert proc.returncode == 0, f"{config}: {proc.stderr[-4000:]}"
    reference, sharded = ddp_runs(script), tmp_path / config
    ddp, other = ([json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
                  for run in (reference, sharded))
    assert len(ddp) == len(other) == 2
    for a, b in zip(ddp, other):
        compared = {key for key in a if not key.startswith(TIMING)}
        assert compared == {key for key in b if not key.startswith(TIMING)}
        for key in compared:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6, nan_ok=True), key
    summary = json.loads((sharded / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["param_sync_error"] == 0.0
    a, b = (load_file(run / "final" / "model.safetensors") for run in (reference, sharded))
    start = load_file(Path(tiny_model) / "model.safetensors")
    assert a.keys() == b.keys() == start.keys()  # tied head saved once, as transformers does
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert max((a[k] - start[k]).abs().max().item() for k in a) > 1e-4  # both trained


@needs_accelerate
@pytest.mark.skipif(HAS_DEEPSPEED, reason="DeepSpeed is installed")
def test_zero3_config_is_refused_without_deepspeed(tmp_path, tiny_model):
    proc = launch("zero3", "grpo", tiny_model, tmp_path)
    assert proc.returncode != 0 and "DeepSpeed is not installed" in proc.stderr


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "algos" / "grpo.py"), *args], env=ENV, capture_output=True,
                          text=True, timeout=400)


@pytest.mark.slow
def test_lora_run_trains_and_saves_a_merged_hf_folder(tmp_path, tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    proc = run_script("--model-path", tiny_model, "--lora-rank", "4", "--gradient-checkpointing", "--output-dir",
                      str(tmp_path), "--run-name", "lora", "--num-iterations", "2", "--num-groups", "2",
                      "--group-size", "2", "--max-turns", "2", "--max-response-tokens", "8", "--mini-batch-size", "8",
                      "--micro-batch-size", "2", "--eval-every", "0", "--learning-rate", "1e-2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in (tmp_path / "lora" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(line["actor/skipped_updates"] == 0 and line["actor/grad_norm"] > 0
                                   for line in lines)
    assert lines[0]["actor/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # one step per iteration; B = 0 at first
    final = tmp_path / "lora" / "final"
    assert not (final / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(final).state_dict()
    start = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    assert merged.keys() == start.keys()
    changed = {k for k in start if not torch.equal(merged[k], start[k])}
    assert changed and all(k.rsplit(".", 2)[-2] in LORA_TARGETS for k in changed)  # only adapted projections


def test_dry_run_states_the_plan_and_whether_it_fits():
    full = run_script("--profile", "gpu", "--dry-run")
    assert full.returncode == 1 and "Qwen/Qwen3-4B (4.02 B parameters), 1 process(es)" in full.stdout
    assert "does NOT fit" in full.stdout and "--lora-rank" in full.stdout
    lora = run_script("--profile", "gpu", "--dry-run", "--lora-rank", "64")
    assert lora.returncode == 0 and "LoRA r=64" in lora.stdout and "fits" in lora.stdout
    assert "rollout engine share" in lora.stdout and "2048 + 512" not in lora.stdout
