"""A rollout engine in another precision than the trainer's (``--rollout-precision bf16``): it records the
log-probs of the distribution that drew its tokens, follows the trainer after every push, its gap to the
float32 trainer is logged in a real run, and the TIS / MIS weights remove the bias that gap puts in the policy
gradient (exactly, in expectation, while every ratio is under the cap)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

from arena_train.models import load_model_and_tokenizer
from arena_train.sharding import hf_backend
from eval.mismatch import Args as MismatchArgs
from eval.mismatch import gradient_bias, measure

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[1, 5, 7, 9, 11, 13], [1, 9, 4, 4, 8], [2, 3, 5, 8, 13, 21, 34]]


@pytest.fixture(scope="module")
def bf16_engine(tiny_model):
    policy, tokenizer = load_model_and_tokenizer(tiny_model, torch.float32)
    return policy, hf_backend(Accelerator(cpu=True), policy, tokenizer, torch.float32, precision="bf16")


@torch.no_grad()
def next_token_logprobs(model, prompt: list[int]) -> torch.Tensor:
    """(V,) log-softmax of ``model``'s next-token logits after ``prompt``, in float64."""
    return torch.log_softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1].double(), -1)


def test_a_bf16_engine_records_the_log_probs_of_its_own_distribution(bf16_engine):
    policy, backend = bf16_engine
    assert not backend.score_rollouts and next(backend.copy.parameters()).dtype == torch.bfloat16
    torch.manual_seed(0)
    for prompt in PROMPTS:  # one prompt per call: the prefill is a plain forward of the copy
        tokens, logps, entropies = backend.generate_scored([prompt], 4, 1.0, 1.0)
        engine = next_token_logprobs(backend.copy, prompt)
        trainer = next_token_logprobs(policy, prompt)
        first = tokens[0][0]
        assert logps[0][0] == pytest.approx(float(engine[first]), abs=1e-6)  # the distribution it sampled from
        assert len(logps[0]) == len(tokens[0]) == len(entropies[0])
        assert 1e-4 < float((engine - trainer).abs().max()) < 0.1  # bf16 rounding (float32's is ~1e-6)


def test_a_push_gives_the_engine_the_trained_weights(bf16_engine, tiny_model):
    policy, _ = bf16_engine
    trained, tokenizer = load_model_and_tokenizer(tiny_model, torch.float32)
    backend = hf_backend(Accelerator(cpu=True), trained, tokenizer, torch.float32, precision="bf16")
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    before = next_token_logprobs(backend.copy, PROMPTS[0])
    backend.push(trained)
    for name, p in trained.named_parameters():
        assert torch.equal(backend.copy.get_parameter(name), p.detach().to(torch.bfloat16)), name
    assert not torch.allclose(before, next_token_logprobs(backend.copy, PROMPTS[0]))


def test_importance_weights_remove_the_bias_of_the_engine_gap(bf16_engine):
    """``eval.mismatch.gradient_bias`` on the engine's and the trainer's next-token distributions: without
    weights the expected policy gradient is off; with TIS / MIS at a cap above every ratio it is the on-policy
    gradient to float64 rounding; a cap below some ratios leaves a smaller error than no correction here."""
    policy, backend = bf16_engine
    g = torch.Generator().manual_seed(0)
    for prompt in PROMPTS:
        log_pi, log_mu = next_token_logprobs(policy, prompt), next_token_logprobs(backend.copy, prompt)
        advantage = torch.randn(log_pi.shape, generator=g, dtype=torch.float64)
        ratio_max = float((log_pi - log_mu).exp().max())
        none = gradient_bias(log_pi, log_mu, advantage, "none", 1.0)
        assert none > 1e-4
        for mode in ("tis", "mis"):
            assert gradient_bias(log_pi, log_mu, advantage, mode, ratio_max * 1.01) < 1e-12
        assert gradient_bias(log_pi, log_mu, advantage, "tis", 1.0 + (ratio_max - 1.0) / 2) < none


def grpo_run(tiny: str, out: Path, *flags: str) -> list[dict]:
    cmd = [sys.executable, str(ROOT / "algos" / "grpo.py"), "--model-path", tiny, "--output-dir", str(out),
           "--run-name", "r", "--num-iterations", "2", "--num-groups", "2", "--group-size", "3", "--max-turns", "2",
           "--max-response-tokens", "6", "--eval-every", "0", "--checkpoint-every", "0", *flags]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in (out / "r" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("correction", ["none", "tis", "mis"])
def test_a_run_with_bf16_rollouts_logs_the_gap(correction, tiny_model, tmp_path):
    rows = grpo_run(tiny_model, tmp_path, "--rollout-precision", "bf16", "--rollout-is", correction)
    for row in rows:
        assert 0 < row["rollout_is/prob_diff_mean"] <= row["rollout_is/prob_diff_max"] < 0.5
        assert 0 <= row["rollout_is/ratio_out_frac"] < 0.5 and abs(row["rollout_is/log_ratio_mean"]) < 0.1
        assert row["rollout/push_time_s"] >= 0


def test_the_trainer_as_its_own_engine_logs_no_gap(tiny_model, tmp_path):
    rows = grpo_run(tiny_model, tmp_path)
    assert not any(key.startswith("rollout_is/") for row in rows for key in row)


def test_eval_mismatch_measures_the_gap_and_the_exact_correction(tiny_model):
    result = measure(MismatchArgs(model_path=Path(tiny_model), groups=1, group_size=2, max_response_tokens=4))
    assert result["rows"] > 0 and result["tokens"] > 0
    assert 0 < result["rollout_is/prob_diff_mean"] <= result["rollout_is/prob_diff_max"]
    assert result["bias/none_mean"] > 1e-4 and result["bias/tis_max"] < 1e-12 and result["bias/mis_max"] < 1e-12
