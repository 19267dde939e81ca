"""arena_train.backends: the transformers backend on a real tiny model; backend choice. (The vLLM backend is
tested against this one in tests/test_vllm_backend.py where vLLM imports.)"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arena_train.backends import HFBackend, rollout_backend_name, sample_categorical, vllm_available
from arena_train.models import load_model_and_tokenizer
from arena_train.rollout import encode_prompt


@pytest.fixture(scope="module")
def hf(tiny_model):
    model, tokenizer = load_model_and_tokenizer(tiny_model, torch.float32)
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": text}], 64)[0]
               for text in ("Push every box.", "Push every box (X) onto a target (O).", "box")]
    return model, tokenizer, prompts


def test_generate_stops_at_the_end_token_and_keeps_it(hf):
    model, tokenizer, prompts = hf
    torch.manual_seed(0)
    out = HFBackend(model, tokenizer).generate(prompts * 4, 12, 1.0, 1.0, greedy=False)
    assert len(out) == 12
    eos = tokenizer.eos_token_id
    for seq in out:
        assert 0 < len(seq) <= 12 and eos not in seq[:-1]
        assert seq[-1] == eos or len(seq) == 12


def test_greedy_is_deterministic_and_batch_chunking_keeps_the_order(hf):
    model, tokenizer, prompts = hf
    whole = HFBackend(model, tokenizer).generate(prompts, 8, 0.7, 0.9, greedy=True)
    assert whole == HFBackend(model, tokenizer).generate(prompts, 8, 0.7, 0.9, greedy=True)
    alone = [HFBackend(model, tokenizer).generate([p], 8, 1.0, 1.0, greedy=True)[0] for p in prompts]
    assert HFBackend(model, tokenizer, batch_size=1).generate(prompts, 8, 1.0, 1.0, greedy=True) == alone


def test_generate_restores_the_training_mode(hf):
    model, tokenizer, prompts = hf
    model.train()
    HFBackend(model, tokenizer).generate(prompts[:1], 2, 1.0, 1.0, greedy=True)
    assert model.training
    model.eval()
    backend = HFBackend(model, tokenizer)
    assert backend.push(model) == {}  # generates with the trained model itself: nothing to push


def test_backend_choice():
    assert rollout_backend_name("hf") == "hf" and rollout_backend_name("vllm") == "vllm"
    expected = "vllm" if torch.cuda.is_available() and vllm_available() else "hf"
    assert rollout_backend_name("auto") == expected
    assert isinstance(vllm_available(), bool)


# --- the decoding loop -------------------------------------------------------------------------------------
@pytest.mark.parametrize("share", [False, True])
def test_greedy_decoding_gives_the_tokens_of_transformers_generate(hf, share):
    """The backend's own loop against ``generate`` on left-padded prompts of different lengths (repeats included,
    so the shared prefill is used): the same tokens, cut after the end token."""
    model, tokenizer, prompts = hf
    prompts = prompts + prompts[:2]
    ours = HFBackend(model, tokenizer, share_prompts=share).generate(prompts, 10, 1.0, 1.0, greedy=True)
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), tokenizer.pad_token_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, L - len(p):], attn[b, L - len(p):] = torch.tensor(p), 1
    ref = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=10, do_sample=False, top_k=0,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)[:, L:].tolist()
    eos = tokenizer.eos_token_id
    assert ours == [seq[:seq.index(eos) + 1] if eos in seq else seq for seq in ref]


def test_top_k_1_and_a_tiny_top_p_sample_the_greedy_tokens(hf):
    model, tokenizer, prompts = hf
    greedy = HFBackend(model, tokenizer).generate(prompts, 10, 1.0, 1.0, greedy=True)
    torch.manual_seed(0)
    assert HFBackend(model, tokenizer, top_k=1).generate(prompts, 10, 0.7, 1.0, greedy=False) == greedy
    assert HFBackend(model, tokenizer).generate(prompts, 10, 1.3, 1e-6, greedy=False) == greedy


@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=12).filter(lambda p: sum(p) > 1e-3), st.integers(0, 99))
@settings(max_examples=30, deadline=None)
def test_sample_categorical_draws_each_index_with_its_probability(weights, seed):
    """Frequencies over 20,000 draws (fixed seed) within 5 standard errors of the normalised weights."""
    probs = torch.tensor(weights, dtype=torch.float32)
    n = 20_000
    torch.manual_seed(seed)
    draws = sample_categorical(probs.expand(n, -1))
    expected = (probs / probs.sum()).double()
    freq = torch.bincount(draws, minlength=len(weights)).double() / n
    assert torch.all((freq - expected).abs() <= 5 * (expected * (1 - expected) / n).sqrt() + 1e-9)


@given(st.lists(st.sampled_from([0.0, 0.0, 1e-30, 0.2, 1.0]), min_size=1, max_size=10).filter(lambda p: sum(p) > 0),
       st.sampled_from([0.0, 1.0 - 2.0 ** -53, 0.5]))
@settings(max_examples=60, deadline=None)
def test_sample_categorical_never_draws_an_index_of_probability_zero(weights, u):
    """Even with the uniform number at the ends of its range (0, and just below 1), where rounding could land on
    an index of probability 0."""
    probs = torch.tensor([weights], dtype=torch.float32)
    real_rand = torch.rand
    try:
        torch.rand = lambda shape, dtype=None, device=None: torch.full(shape, u, dtype=dtype, device=device)
        index = int(sample_categorical(probs)[0])
    finally:
        torch.rand = real_rand
    assert probs[0, index] > 0
