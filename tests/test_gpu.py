"""The recipe on a GPU (skipped without CUDA): ``grpo.py`` and ``sampo.py`` with ``--profile gpu --rollout-backend
hf --mixed-precision bf16`` on Sokoban and WebShop, on a random-initialised Qwen3-0.6B built from its config, groups
reduced to 4 x 8 (``benchmarks/gpu_check.py``'s stage 2, with its checks): the run ends with finite loss and grad
norm, writes a checkpoint, ``--resume`` continues with the next iteration, a group of the trained policy's
responses to one prompt holds distinct responses, and every iteration logs its throughput."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import load_benchmark

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def context(tmp_path_factory):
    gpu_check = load_benchmark("gpu_check")
    return gpu_check.Context(gpu_check.Args(out=tmp_path_factory.mktemp("gpu")), on_gpu=True)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["ARL/Sokoban-v0", "ARL/WebShop-v0"])
@pytest.mark.parametrize("script", ["grpo", "sampo"])
def test_recipe_runs_resumes_and_samples_distinct_responses(context, script, env_id):
    gpu_check = load_benchmark("gpu_check")
    record = gpu_check.check_run(context, script, env_id, timeout=600)  # raises on a failed check
    assert record["checks"] == {"iterations": True, "finite_loss_and_grad_norm": True, "checkpoint_written": True,
                                "resume_continues": True}
    assert [m["iteration"] for m in record["metrics"]] == [1, 2, 3]
    for m in record["metrics"]:
        assert m["rollout/num_rows"] > 0 and m["actor/skipped_updates"] == 0
        for key in ("perf/rollout_tokens_per_s", "perf/update_tokens_per_s", "perf/time_update_s"):
            assert math.isfinite(m[key]) and m[key] > 0, key
    assert record["first"]["peak_kind"] == "cuda allocated" and record["first"]["peak_gib"] > 0
    group = gpu_check.distinct_group(context, record)
    assert group["group_size"] == 8 and group["distinct"] >= 2
