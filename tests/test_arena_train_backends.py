"""arena_train.backends: the transformers backend on a real tiny model; backend choice. (The vLLM backend is
tested against this one in tests/test_vllm_backend.py where vLLM imports.)"""

from __future__ import annotations

import copy
import warnings
from collections import defaultdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arena_train.backends import HFBackend, rollout_backend_name, sample_categorical, vllm_available
from arena_train.models import load_model_and_tokenizer
from arena_train.rollout import (
    EVAL_SEED_OFFSET,
    VAL_TEMPERATURE,
    VAL_TOP_K,
    VAL_TOP_P,
    RolloutConfig,
    collect_rows,
    encode_prompt,
)


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
    assert len({tuple(seq) for seq in out[0::3]}) == 4  # temperature 1 samples: a prompt's 4 responses differ
    eos = tokenizer.eos_token_id
    for seq in out:
        assert 0 < len(seq) <= 12 and eos not in seq[:-1]
        assert seq[-1] == eos or len(seq) == 12


def test_backends_report_why_each_response_stopped(hf):
    """HFBackend: the end token -> eos, the limit -> max_response_tokens; vLLM's finish_reason maps the same."""
    from types import SimpleNamespace

    from arena_train.backends import _vllm_stop_reason

    model, tokenizer, prompts = hf
    backend = HFBackend(model, tokenizer)
    for scored in (False, True):
        torch.manual_seed(0)
        out = (backend.generate_scored(prompts * 8, 6, 1.0, 1.0)[0] if scored
               else backend.generate(prompts * 8, 6, 1.0, 1.0, greedy=False))
        assert backend.last_stop_reasons == ["eos" if seq[-1] == tokenizer.eos_token_id else "max_response_tokens"
                                             for seq in out]
        assert "max_response_tokens" in backend.last_stop_reasons
    assert [_vllm_stop_reason(SimpleNamespace(outputs=[SimpleNamespace(finish_reason=r)])) for r in
            ("length", "stop")] == ["max_response_tokens", "eos"]


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


# --- sampling follows the (warped) softmax ---------------------------------------------------------------
#: Draws of the first new token per setting; bins with fewer expected draws are merged (normal approximation).
DRAWS, MIN_EXPECTED = 20_000, 25


@pytest.fixture(scope="module")
def peaked(hf):
    """The tiny model with its final norm scaled by 6, so that its first-token distribution is neither flat nor
    one-hot (p_max 0.17 at temperature 1, 0.54 at 0.7, a long tail): temperature, top-k and top-p then move the
    frequencies far beyond sampling noise. With the prompt and its next-token logits (a plain forward)."""
    model, tokenizer, prompts = hf
    model = copy.deepcopy(model).eval()
    with torch.no_grad():
        model.model.norm.weight.mul_(6.0)
        logits = model(input_ids=torch.tensor([prompts[0]])).logits[0, -1].float()
    return model, tokenizer, prompts[0], logits


def warped_softmax(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The sampling distribution written out: softmax at ``temperature``, then the ``top_k`` most likely tokens,
    then the fewest most likely tokens whose renormalised mass reaches ``top_p``, renormalised."""
    probs = (logits.double() / temperature).softmax(-1)
    order = probs.argsort(descending=True)
    keep = len(probs) if not top_k else top_k
    if top_p < 1.0:
        mass = probs[order[:keep]].cumsum(0) / probs[order[:keep]].sum()
        keep = int((mass < top_p).sum()) + 1
    out = torch.zeros_like(probs)
    out[order[:keep]] = probs[order[:keep]]
    return out / out.sum()


def max_z(freq: torch.Tensor, probs: torch.Tensor, n: int) -> float:
    """Largest |frequency - probability| in standard errors over the bins: each token expected >= MIN_EXPECTED
    times, the other tokens of nonzero probability together, and the tokens of probability 0 (any draw of one is
    an infinite deviation)."""
    big = probs * n >= MIN_EXPECTED
    tail = ~big & (probs > 0)
    bins = [(freq[big], probs[big]), (freq[tail].sum()[None], probs[tail].sum()[None])]
    worst = float("inf") if freq[probs == 0].sum() > 0 else 0.0
    for f, p in bins:
        se = (p * (1 - p) / n).sqrt()
        dev = (f - p).abs()
        worst = max(worst, float(torch.where(se > 0, dev / se.clamp(min=1e-300),
                                             torch.where(dev > 0, float("inf"), 0.0)).max()))
    return worst


SETTINGS = [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 10, 1.0), (1.0, 0, 0.5), (0.7, 20, 0.9)]


@pytest.mark.parametrize("temperature,top_k,top_p,seeded", [(*s, False) for s in SETTINGS] + [(0.7, 20, 0.9, True)])
def test_first_token_frequencies_follow_the_warped_softmax(peaked, temperature, top_k, top_p, seeded):
    """20,000 first tokens (fixed seed) within 5 standard errors of the warped softmax in every bin, never a token
    that top-k / top-p removed; the same frequencies are far (> 5 s.e.) from greedy decoding and, for the warped
    settings, from the plain softmax, so the check tells the distributions apart. ``seeded``: every row from a
    stream of its own (``seeds``), the same distribution."""
    model, tokenizer, prompt, logits = peaked
    torch.manual_seed(0)
    out = HFBackend(model, tokenizer, batch_size=DRAWS, top_k=top_k).generate(
        [prompt] * DRAWS, 1, temperature, top_p, greedy=False, seeds=list(range(DRAWS)) if seeded else None)
    freq = torch.bincount(torch.tensor([seq[0] for seq in out]), minlength=len(logits)).double() / DRAWS
    expected = warped_softmax(logits, temperature, top_k, top_p)
    assert max_z(freq, expected, DRAWS) <= 5
    assert max_z(freq, torch.nn.functional.one_hot(logits.argmax(), len(logits)).double(), DRAWS) > 5
    if (temperature, top_k, top_p) != (1.0, 0, 1.0):
        assert max_z(freq, warped_softmax(logits, 1.0, 0, 1.0), DRAWS) > 5


def test_sampling_is_reproducible_from_the_seed(hf):
    model, tokenizer, prompts = hf
    backend = HFBackend(model, tokenizer)
    runs = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        runs.append(backend.generate(prompts * 4, 8, 1.0, 1.0, greedy=False))
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_a_seeded_row_samples_the_same_tokens_whatever_its_batch(hf):
    """With ``seeds``, a row's sampled tokens depend on its prompt and seed only: alone, in a batch, at another
    position, beside other prompts, in batches of 2 without the shared prefill, they are the same; torch's global
    stream is neither read nor moved. Several seeds on one prompt give different responses (one stream each)."""
    model, tokenizer, prompts = hf
    backend = HFBackend(model, tokenizer)
    seeds = [11, 12, 13]

    def sample(backend, prompts, seeds):
        return backend.generate(prompts, 8, VAL_TEMPERATURE, VAL_TOP_P, False, VAL_TOP_K, seeds=seeds)

    torch.manual_seed(5)
    together = sample(backend, prompts, seeds)
    after = torch.rand(4)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(4))
    alone = [sample(backend, [p], [s])[0] for p, s in zip(prompts, seeds)]
    reordered = sample(backend, [prompts[0], *prompts[::-1]], [99, *seeds[::-1]])[1:][::-1]
    pairs = sample(HFBackend(model, tokenizer, batch_size=2, share_prompts=False), prompts, seeds)
    assert together == alone == reordered == pairs
    group = sample(backend, [prompts[1]] * 8, list(range(8)))
    assert len({tuple(r) for r in group}) > 4
    assert sample(backend, [prompts[1]], [3]) == [group[3]]
    with pytest.raises(ValueError, match="one seed per prompt"):
        sample(backend, prompts, seeds[:2])


def sokoban_group_rollout(num_groups: int, group_size: int):
    import wrappers

    return wrappers.GroupRollout(lambda: wrappers.make_env("ARL/Sokoban-Mini-v0", history_length=0,
                                                           prompt_style="compact"), num_groups, group_size)


def test_collect_rows_at_temperature_1_gives_a_group_distinct_responses(hf):
    """The G episodes of a group share their first prompt; at temperature 1 (no top-k / top-p) they must still
    sample G different responses, or every advantage of the group is 0."""
    model, tokenizer, _ = hf
    config = RolloutConfig(max_turns=1, max_prompt_tokens=4096, max_response_tokens=6, temperature=1.0)
    torch.manual_seed(0)
    rows, _ = collect_rows(HFBackend(model, tokenizer), tokenizer, sokoban_group_rollout(2, 8), [1, 2], config,
                           defaultdict(float))
    by_group = defaultdict(set)
    for r in rows:
        by_group[r.group].add(tuple(r.response_ids))
    assert len(by_group) == 2 and all(len(responses) >= 7 for responses in by_group.values())


def test_evaluation_rollouts_skip_the_scores_and_sample_the_same_tokens(hf):
    """On held-out seeds (evaluation) a scoring backend runs no log-prob / entropy work (``generate_scored`` is not
    called, rows keep no scores) and samples exactly what a non-scoring backend samples from the same seed."""
    model, tokenizer, _ = hf
    config = RolloutConfig(max_turns=2, max_prompt_tokens=4096, max_response_tokens=6, temperature=0.8, top_k=20)
    seeds = [EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + 1]
    scoring = HFBackend(model, tokenizer, score_rollouts=True)
    calls = []
    scoring.generate_scored = lambda *a, **k: calls.append(a) or HFBackend.generate_scored(scoring, *a, **k)
    results = []
    for backend in (scoring, HFBackend(model, tokenizer)):
        torch.manual_seed(2)
        rows, episodes = collect_rows(backend, tokenizer, sokoban_group_rollout(2, 2), seeds, config,
                                      defaultdict(float))
        results.append(([(r.episode, r.turn, r.response_ids) for r in rows], [e.env_return for e in episodes]))
        assert all(r.rollout_logp is None for r in rows)
    assert not calls and results[0] == results[1]
    torch.manual_seed(2)  # on training seeds the same backend scores its rows
    rows, _ = collect_rows(scoring, tokenizer, sokoban_group_rollout(2, 2), [1, 2], config, defaultdict(float))
    assert calls and all(r.rollout_logp is not None for r in rows)


# --- transformers' cache argument --------------------------------------------------------------------------
def test_generation_passes_no_deprecated_cache_argument(hf, monkeypatch):
    """transformers 5 warns on every forward given ``past_key_values`` and on every read of
    ``output.past_key_values`` (removed in 5.40): generation, with and without the shared prefill and scored, runs
    with those warnings turned into errors (the once-only log message included)."""
    import transformers.utils.generic as generic

    def fail_on_cache_name(message, *args, **kwargs):
        if "past_key_values" in str(message):
            raise AssertionError(message)

    monkeypatch.setattr(generic.logger, "warning_once", fail_on_cache_name)
    model, tokenizer, prompts = hf
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        for share in (False, True):
            backend = HFBackend(model, tokenizer, share_prompts=share)
            backend.generate(prompts * 2, 4, 1.0, 1.0, greedy=True)
            backend.generate_scored(prompts * 2, 4, 0.7, 0.9)
