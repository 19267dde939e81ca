"""arena_train.batching: padded batches and response log-probs on a real tiny model."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arena_train.batching import make_batch, score_rows, sequence_logprobs
from arena_train.models import load_model_and_tokenizer
from arena_train.rollout import Row


def row(prompt: list[int], response: list[int], advantage=0.0) -> Row:
    return Row(group=0, episode=0, turn=0, prompt_ids=prompt, response_ids=response, step_reward=0.0,
               format_penalty=0.0, format_ok=True, action_is_valid=True, anchor=None, won=False, advantage=advantage)


token_lists = st.lists(st.integers(3, 200), min_size=1, max_size=7)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(token_lists, st.lists(st.integers(3, 200), max_size=5)), min_size=1, max_size=5))
def test_make_batch_aligns_responses_at_one_column(pairs):
    rows = [row(p, r, advantage=float(k)) for k, (p, r) in enumerate(pairs)]
    batch = make_batch(rows, pad_id=0, device="cpu")
    P = max(len(p) for p, _ in pairs)
    T = max(max(len(r) for _, r in pairs), 1)
    assert batch["input_ids"].shape == (len(rows), P + T) and batch["mask"].shape == (len(rows), T)
    for b, (p, r) in enumerate(pairs):
        assert batch["input_ids"][b, P - len(p):P].tolist() == p  # prompts left-padded, ending at column P
        assert batch["response_ids"][b, :len(r)].tolist() == r
        assert batch["mask"][b].tolist() == [1.0] * len(r) + [0.0] * (T - len(r))
        assert batch["attention_mask"][b].sum() == len(p) + len(r)
        assert batch["advantages"][b, :len(r)].tolist() == [float(b)] * len(r)
        positions = batch["position_ids"][b, P - len(p):P + len(r)].tolist()
        assert positions == list(range(len(p) + len(r)))  # positions count real tokens only


def test_make_batch_takes_per_token_advantages_and_logps():
    r = row([5, 6], [7, 8, 9], advantage=np.array([1.0, 2.0, 3.0]))
    r.old_logp, r.ref_logp = np.array([-1.0, -2.0, -3.0]), np.array([-0.5, -0.5, -0.5])
    batch = make_batch([r, row([5], [7])], pad_id=0, device="cpu")
    assert batch["advantages"][0].tolist() == [1.0, 2.0, 3.0]
    assert batch["old_logp"][0].tolist() == [-1.0, -2.0, -3.0] and batch["ref_logp"][1].tolist() == [0.0, 0.0, 0.0]


@pytest.fixture(scope="module")
def model(tiny_model):
    return load_model_and_tokenizer(tiny_model, torch.float32)[0].eval()


@torch.no_grad()
def reference_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """Log-probs of ``response`` after ``prompt`` from one unpadded forward pass."""
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sequence_logprobs_match_unpadded_forward_passes(model, temperature):
    rows = [row([11, 12, 13, 14, 15], [20, 21]), row([11], [30, 31, 32, 33]), row([40, 41, 42], [50])]
    with torch.no_grad():
        logp, entropy = sequence_logprobs(model, make_batch(rows, 0, "cpu"), temperature)
    vocab = model.config.vocab_size
    for b, r in enumerate(rows):
        n = len(r.response_ids)
        torch.testing.assert_close(logp[b, :n], reference_logprobs(model, r.prompt_ids, r.response_ids, temperature),
                                   atol=1e-5, rtol=1e-5)
        assert torch.all(entropy[b, :n] >= 0) and torch.all(entropy[b, :n] <= math.log(vocab) + 1e-4)


def test_score_rows_fills_every_row_whatever_the_micro_batch(model):
    prompts = [[11, 12], [13], [14, 15, 16], [17]]
    responses = [[20, 21, 22], [23], [24, 25], [26, 27, 28, 29]]
    results = []
    for micro_batch_size in (1, 3):
        rows = [row(p, r) for p, r in zip(prompts, responses)]
        stats: dict[str, float] = defaultdict(float)
        score_rows(model, model, rows, micro_batch_size=micro_batch_size, temperature=1.0, pad_id=0, device="cpu",
                   stats=stats)
        assert stats["time_score"] > 0
        for r in rows:
            assert r.old_logp.shape == r.ref_logp.shape == (len(r.response_ids),) and r.entropy > 0
            np.testing.assert_allclose(r.old_logp, r.ref_logp)  # the same model scores both
        results.append(rows)
    for a, b in zip(*results):
        np.testing.assert_allclose(a.old_logp, b.old_logp, atol=1e-5)
        np.testing.assert_allclose(a.old_logp, reference_logprobs(model, a.prompt_ids, a.response_ids, 1.0).numpy(),
                                   atol=1e-5)


def test_prefix_reuse_passes_no_deprecated_cache_argument(model, monkeypatch):
    """transformers 5 warns on every forward given ``past_key_values`` (removed in 5.40): the shared-prefix pass,
    forward and backward, runs with that warning turned into an error and still equals the plain pass."""
    import warnings

    import transformers.utils.generic as generic

    def fail_on_cache_name(message, *args, **kwargs):
        if "past_key_values" in str(message):
            raise AssertionError(message)

    monkeypatch.setattr(generic.logger, "warning_once", fail_on_cache_name)
    prefix = list(range(30, 42))
    rows = [row(prefix + [50 + k], [60 + k, 61]) for k in range(3)]  # one group sharing 12 prompt tokens
    shared = make_batch(rows, 0, "cpu", share_prefix=True)
    assert "prefix_ids" in shared
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        logp, _ = sequence_logprobs(model, shared, 1.0)
        logp.sum().backward()
    with torch.no_grad():
        plain, _ = sequence_logprobs(model, make_batch(rows, 0, "cpu"), 1.0)
    torch.testing.assert_close(logp.detach(), plain, atol=1e-5, rtol=1e-5)
