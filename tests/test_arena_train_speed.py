"""The speed paths of arena_train compute the same numbers as the plain ones: shared prompt prefixes (KV cache
reuse, gradients included) in scoring, the update and generation, length-sorted token-budget micro-batches, and the
first mini-batch's old log-probs taken from the update's own forward pass."""

from __future__ import annotations

import copy
from collections import defaultdict

import numpy as np
import pytest
import torch
from conftest import load_script
from hypothesis import given, settings
from hypothesis import strategies as st

from arena_train import losses
from arena_train.batching import (
    fill_old_logp,
    first_minibatch,
    full_inputs,
    make_batch,
    score_rows,
    sequence_logprobs,
    shared_prefix_lengths,
    split_micro_batches,
)
from arena_train.models import load_model_and_tokenizer
from arena_train.rollout import Row


def row(prompt: list[int], response: list[int], group: int = 0, advantage: float = 0.0) -> Row:
    return Row(group=group, episode=0, turn=0, prompt_ids=prompt, response_ids=response, step_reward=0.0,
               format_penalty=0.0, format_ok=True, action_is_valid=True, anchor=None, won=False, advantage=advantage)


def random_rows(seed: int, vocab: int, n_groups: int = 3, group_size: int = 4) -> list[Row]:
    """Groups whose rows share a random-length prompt prefix, then differ (lengths vary, some responses empty)."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(n_groups):
        prefix = rng.integers(3, vocab, size=int(rng.integers(0, 30))).tolist()
        for _ in range(int(rng.integers(1, group_size + 1))):
            rest = rng.integers(3, vocab, size=int(rng.integers(1, 12))).tolist()
            response = rng.integers(3, vocab, size=int(rng.integers(0, 9))).tolist()
            rows.append(row(prefix + rest, response, group=g, advantage=float(rng.normal())))
    rng.shuffle(rows)
    return rows


@pytest.fixture(scope="module")
def model(tiny_model):
    torch.manual_seed(0)
    return load_model_and_tokenizer(tiny_model, torch.float32)[0]


# --- shared prefixes ---------------------------------------------------------------------------------
def test_shared_prefix_lengths_per_group_and_never_the_last_prompt_token():
    shared = list(range(3, 13))
    rows = [row(shared + [20], [1]), row(shared + [21, 22], [1]), row(shared, [1], group=1),
            row(shared, [2], group=1), row(shared + [5], [1], group=2)]
    assert shared_prefix_lengths(rows, min_prefix=4) == [10, 10, 9, 9, 0]  # group 2 has one row
    assert shared_prefix_lengths(rows, min_prefix=11) == [0] * 5


@pytest.mark.parametrize("seed", range(6))
def test_shared_prefix_batches_give_the_same_logprobs_entropies_and_gradients(model, seed):
    rows = random_rows(seed, model.config.vocab_size)
    model.train()
    results = []
    for share in (False, True):
        batch = make_batch(rows, 0, "cpu", share_prefix=share)
        assert ("prefix_ids" in batch) == (share and any(shared_prefix_lengths(rows)))
        logp, entropy = sequence_logprobs(model, batch, 0.7)
        mask = batch["mask"]
        loss = ((logp * batch["advantages"] + 0.1 * entropy) * mask).sum()
        grads = torch.autograd.grad(loss, [p for p in model.parameters()])
        results.append((logp * mask, entropy * mask, grads))
    (logp0, ent0, g0), (logp1, ent1, g1) = results
    torch.testing.assert_close(logp1, logp0, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ent1, ent0, atol=2e-5, rtol=1e-5)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_shared_prefix_with_gradient_checkpointing_splices_the_prefix_back(model):
    rows = random_rows(7, model.config.vocab_size)
    batch = make_batch(rows, 0, "cpu", share_prefix=True)
    assert "prefix_ids" in batch
    model.eval()
    with torch.no_grad():
        expected, _ = sequence_logprobs(model, make_batch(rows, 0, "cpu"), 1.0)
    model.gradient_checkpointing_enable()
    try:
        model.train()
        logp, _ = sequence_logprobs(model, batch, 1.0)
    finally:
        model.gradient_checkpointing_disable()
    torch.testing.assert_close(logp * batch["mask"], expected * batch["mask"], atol=2e-5, rtol=1e-5)


def test_full_inputs_splice_the_prefix_back_for_models_without_kv_reuse(model):
    """What PPO's critic runs on: the response positions see the same logits as in the plain batch."""
    rows = random_rows(7, model.config.vocab_size)
    shared, plain = make_batch(rows, 0, "cpu", share_prefix=True), make_batch(rows, 0, "cpu")
    assert "prefix_ids" in shared and full_inputs(plain).keys() == {"input_ids", "attention_mask", "position_ids"}
    T = plain["mask"].shape[1]
    model.eval()
    with torch.no_grad():
        got = model(**full_inputs(shared), logits_to_keep=T + 1).logits
        expected = model(**full_inputs(plain), logits_to_keep=T + 1).logits
    mask = plain["mask"][..., None].bool()
    torch.testing.assert_close(got[:, :-1] * mask, expected[:, :-1] * mask, atol=2e-5, rtol=1e-5)


# --- micro-batches -----------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 10)), min_size=1, max_size=30), st.integers(1, 8),
       st.integers(0, 200))
def test_micro_batches_partition_the_rows_within_both_caps(lengths, max_rows, max_tokens):
    rows = [row([3] * p, [4] * r) for p, r in lengths]
    batches = split_micro_batches(rows, max_rows, max_tokens)
    assert sorted(map(id, (r for b in batches for r in b))) == sorted(map(id, rows))
    for b in batches:
        widths = [len(r.prompt_ids) + len(r.response_ids) for r in b]
        assert len(b) <= max_rows and widths == sorted(widths, reverse=True)
        assert max_tokens == 0 or len(b) == 1 or widths[0] * len(b) <= max_tokens


def test_micro_batches_reject_zero_rows():
    with pytest.raises(ValueError, match="max_rows"):
        split_micro_batches([row([3], [4])], 0)


def test_score_rows_results_do_not_depend_on_micro_batching_or_prefix_sharing(model):
    model.eval()
    scored = []
    for micro_batch_size, tokens in ((1, 0), (5, 0), (64, 120)):
        rows = random_rows(3, model.config.vocab_size)
        score_rows(model, model, rows, micro_batch_size=micro_batch_size, temperature=1.0, pad_id=0, device="cpu",
                   stats=defaultdict(float), micro_batch_tokens=tokens)
        scored.append(rows)
    for other in scored[1:]:
        for a, b in zip(scored[0], other):
            np.testing.assert_allclose(a.old_logp, b.old_logp, atol=2e-5)
            np.testing.assert_allclose(a.ref_logp, b.ref_logp, atol=2e-5)
            assert a.entropy == pytest.approx(b.entropy, abs=2e-5)


# --- the first mini-batch's old log-probs from its own forward -------------------------------------------------
def grpo_loss(grpo, model, rows: list[Row], temperature: float) -> torch.Tensor:
    """GRPO's micro-batch loss (clipped surrogate, k3 KL, entropy bonus) on ``rows``, as the scripts compute it."""
    batch = make_batch(rows, 0, "cpu", share_prefix=True)
    logp, entropy = sequence_logprobs(model, batch, temperature)
    fill_old_logp(batch, logp, rows)
    mask = batch["mask"]
    pg_loss, _ = grpo.policy_loss(logp, batch["old_logp"], batch["advantages"], mask)
    kl = losses.agg_loss(losses.kl_penalty(logp, batch["ref_logp"], "k3"), mask, "token-mean")
    return pg_loss + 0.01 * kl - 0.001 * losses.agg_loss(entropy, mask, "token-mean")


@pytest.mark.parametrize("seed", range(5))
def test_old_logp_from_the_first_minibatch_forward_gives_the_same_losses_gradients_and_rows(tiny_model, seed):
    """Two mini-batches, two optimizer steps: with old log-probs from a scoring pass for every row vs from the
    first mini-batch's own forward (``skip_policy``), the same losses, gradients and rows' old log-probs."""
    grpo = load_script("grpo")
    runs = []
    for reuse in (False, True):
        torch.manual_seed(0)
        policy = load_model_and_tokenizer(tiny_model, torch.float32)[0]
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.05)
        rows = random_rows(100 + seed, policy.config.vocab_size, n_groups=4)
        orders = [np.random.default_rng(seed).permutation(len(rows)).tolist()]
        first = first_minibatch(orders, 2)
        policy.eval()
        score_rows(policy, policy, rows, micro_batch_size=64, temperature=0.5, pad_id=0, device="cpu",
                   stats=defaultdict(float), skip_policy=first if reuse else frozenset())
        assert all((r.stored("old_logp") is None) == (reuse and j in first) for j, r in enumerate(rows))
        policy.train()
        losses, grads = [], []
        for share in np.array_split(np.array(orders[0]), 2):
            optimizer.zero_grad()
            loss = grpo_loss(grpo, policy, [rows[j] for j in share], 0.5)
            loss.backward()
            losses.append(loss.detach())
            grads.append([p.grad.clone() for p in policy.parameters()])
            optimizer.step()
        runs.append((losses, grads, [r.old_logp for r in rows]))
    (losses0, grads0, old0), (losses1, grads1, old1) = runs
    for a, b in zip(losses1, losses0):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for step1, step0 in zip(grads1, grads0):
        for a, b in zip(step1, step0):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    for a, b in zip(old1, old0):  # written back into the rows, for later epochs
        np.testing.assert_allclose(a, b, atol=2e-5)


def test_first_minibatch_is_the_first_share_of_the_first_order():
    assert first_minibatch([[4, 2, 0, 1, 3], [0, 1, 2, 3, 4]], 2) == {4, 2, 0}
    assert first_minibatch([[3, 1, 2, 0]], 1) == {0, 1, 2, 3}  # on-policy: every row
    assert first_minibatch([[]], 3) == set()


#: (script, options): on-policy updates (one mini-batch, several micro-batches), EMPG's entropies before the
#: update, PPO's KL-in-reward (every row's old log-probs before the update) with several mini-batches.
SCRIPT_CASES = [("grpo", ["--mini-batch-size", "64"]), ("empg", ["--mini-batch-size", "64"]),
                ("ppo", ["--mini-batch-size", "4", "--kl-in-reward"])]


@pytest.mark.slow
@pytest.mark.parametrize("name,options", SCRIPT_CASES, ids=[c[0] for c in SCRIPT_CASES])
def test_scripts_take_the_first_minibatch_old_logp_from_its_forward(name, options, tiny_model, tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "algos" / f"{name}.py"
    cmd = [sys.executable, str(script), "--model-path", tiny_model, "--output-dir", str(tmp_path), "--run-name", "r",
           "--num-iterations", "2", "--num-groups", "2", "--group-size", "3", "--max-turns", "2",
           "--max-response-tokens", "6", "--micro-batch-size", "4", "--eval-every", "0", "--checkpoint-every", "0",
           *options]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [m["actor/skipped_updates"] for m in lines] == [0, 0]
    if name == "grpo":  # on-policy, no scoring pass: the ratio is exactly 1 in the forward pass
        assert all(m["actor/approx_kl"] == 0.0 and m["actor/clipfrac_upper"] == 0.0 for m in lines)


# --- generation: identical prompts prefilled once ----------------------------------------------------------
@pytest.mark.parametrize("greedy", [True, False])
def test_generation_with_shared_prompts_gives_the_same_tokens(model, tiny_model, greedy):
    """Groups of identical prompts of different lengths (left padding), as on a first turn: the same tokens with
    and without the shared prefill (sampled: the same seed)."""
    from arena_train.backends import HFBackend

    _, tokenizer = load_model_and_tokenizer(tiny_model, torch.float32)
    rng = np.random.default_rng(0)
    distinct = [rng.integers(3, model.config.vocab_size, size=n).tolist() for n in (5, 17, 30)]
    instructions = rng.integers(3, model.config.vocab_size, size=12).tolist()
    later_turns = [instructions + rng.integers(3, model.config.vocab_size, size=6).tolist() for _ in range(5)]
    for prompts in ([p for p in distinct for _ in range(4)] + [distinct[0]],  # identical prompts, padded
                    later_turns + later_turns[:2],  # one length: common leading columns, and duplicates
                    later_turns + [distinct[1]]):  # nothing in common, nothing repeated
        outputs = []
        for share in (False, True):
            torch.manual_seed(1)
            outputs.append(HFBackend(model, tokenizer, share_prompts=share).generate(prompts, 12, 1.0, 1.0, greedy))
        assert outputs[0] == outputs[1]
        assert all(len(o) > 0 for o in outputs[1])
        repeats = [(a, b) for a in range(len(prompts)) for b in range(a) if prompts[a] == prompts[b]]
        if repeats:  # identical prompts: the same tokens greedy, other tokens sampled
            assert greedy == all(outputs[1][a] == outputs[1][b] for a, b in repeats)


# --- the rollout's own log-probs in place of the policy's scoring pass ---------------------------------------
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.6, 20, 0.95), (1.4, 5, 1.0)])
def test_scored_generation_gives_the_scoring_pass_log_probs_and_entropies(model, tiny_model, temperature, top_k,
                                                                          top_p):
    """``generate_scored``'s per-token log-probs and entropies (at the sampling temperature, before top-k / top-p)
    agree with ``score_rows`` on the same rows to float rounding; its tokens are ``generate``'s (same seed)."""
    from arena_train.backends import HFBackend

    _, tokenizer = load_model_and_tokenizer(tiny_model, torch.float32)
    rng = np.random.default_rng(3)
    shared = rng.integers(3, model.config.vocab_size, size=10).tolist()
    prompts = [shared + rng.integers(3, model.config.vocab_size, size=int(n)).tolist() for n in (1, 4, 9, 9, 15)]
    prompts += prompts[:2]  # repeats: the shared prefill
    backend = HFBackend(model, tokenizer, top_k=top_k)
    torch.manual_seed(5)
    tokens, logps, entropies = backend.generate_scored(prompts, 12, temperature, top_p)
    torch.manual_seed(5)
    assert backend.generate(prompts, 12, temperature, top_p, greedy=False) == tokens
    assert tokens[5:] != tokens[:2]  # the repeated prompts sample other tokens
    rows = [row(p, t, group=g) for g, (p, t) in enumerate(zip(prompts, tokens))]
    score_rows(model, None, rows, micro_batch_size=4, temperature=temperature, pad_id=tokenizer.pad_token_id,
               device="cpu", stats=defaultdict(float))
    for r, lp, h in zip(rows, logps, entropies):
        assert len(lp) == len(r.response_ids) == len(h)
        np.testing.assert_allclose(lp, r.old_logp, atol=2e-5)
        assert r.entropy == pytest.approx(float(np.mean(h)) if h else 0.0, abs=2e-5)


def test_rows_scored_by_the_rollout_skip_the_policy_pass_but_not_the_reference(model):
    """Rows with ``rollout_logp`` take it as ``old_logp`` (and its entropy) without a policy forward; rows without
    it and the reference's log-probs still come from forward passes."""
    rows = random_rows(11, model.config.vocab_size)
    for k, r in enumerate(rows):
        if k % 2 == 0:
            r.rollout_logp = np.full(len(r.response_ids), -1.5, dtype=np.float32)
            r.rollout_entropy = 0.25
    calls = {"policy": 0, "ref": 0}
    policy, ref = model, copy.deepcopy(model)
    hooks = [m.register_forward_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
             for m, name in ((policy, "policy"), (ref, "ref"))]
    score_rows(policy, ref, rows[0::2], micro_batch_size=4, temperature=1.0, pad_id=0, device="cpu",
               stats=defaultdict(float))
    assert calls == {"policy": 0, "ref": calls["ref"]} and calls["ref"] > 0
    assert all(np.all(r.old_logp == -1.5) and r.entropy == 0.25 and r.ref_logp is not None for r in rows[0::2])
    score_rows(policy, ref, rows, micro_batch_size=4, temperature=1.0, pad_id=0, device="cpu",
               stats=defaultdict(float))
    for h in hooks:
        h.remove()
    assert calls["policy"] > 0 and all(r.old_logp is not None for r in rows)
    assert all(np.all(r.old_logp == -1.5) for r in rows[0::2]) and not any(np.all(r.old_logp == -1.5)
                                                                            for r in rows[1::2] if r.response_ids)


def test_collect_rows_keeps_the_rollout_scores_of_each_response(tiny_model):
    """On the Sokoban env every sampled row holds the backend's log-prob per response token (negative, finite)
    and its mean entropy, whether or not they may stand in for the trainer's (``score_rollouts``); greedy
    rollouts (evaluation) leave them unset."""
    import wrappers
    from arena_train.backends import HFBackend
    from arena_train.rollout import RolloutConfig, collect_rows

    policy, tokenizer = load_model_and_tokenizer(tiny_model, torch.float32)
    config = RolloutConfig(max_turns=3, max_prompt_tokens=4096, max_response_tokens=6, temperature=0.8)
    for score, greedy in ((True, False), (True, True), (False, False)):
        rollout = wrappers.GroupRollout(lambda: wrappers.make_env("ARL/Sokoban-Mini-v0"), 2, 2)
        rows, _ = collect_rows(HFBackend(policy, tokenizer, score_rollouts=score), tokenizer, rollout, [1, 2],
                               config, defaultdict(float), greedy=greedy)
        assert rows
        if not greedy:
            assert all(len(r.rollout_logp) == len(r.response_ids) and np.all(r.rollout_logp <= 0)
                       and np.isfinite(r.rollout_logp).all() and r.rollout_entropy > 0 for r in rows)
        else:
            assert all(r.rollout_logp is None for r in rows)
