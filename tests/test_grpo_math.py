"""Property tests of grpo.py's math and of the loss math every script shares (arena_train.losses).

Against the invariants of docs/algorithms.md "Tested invariants" (items 1, 2, 6, 7, 8).

Gradients come from autograd in float64 and are compared with closed forms.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import load_script
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from arena_train import losses

grpo = load_script("grpo")
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def batch(draw, min_rows=1, max_rows=5, max_len=6, equal_lengths=False):
    """(values (B,T) float64, mask (B,T) right-padded with at least one token per row)."""
    B = draw(st.integers(min_rows, max_rows))
    T = draw(st.integers(1, max_len))
    lengths = [T] * B if equal_lengths else [draw(st.integers(1, T)) for _ in range(B)]
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.zeros(B, T, dtype=torch.float64)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    return values, mask


# ---- 1. aggregation ---------------------------------------------------------------------------
@SETTINGS
@given(batch(equal_lengths=True))
def test_agg_equal_lengths(data):
    x, m = data
    T = m.shape[1]
    tm = losses.agg_loss(x, m, "token-mean")
    torch.testing.assert_close(losses.agg_loss(x, m, "seq-mean-token-mean"), tm)
    torch.testing.assert_close(losses.agg_loss(x, m, "seq-mean-token-sum"), T * tm)


@SETTINGS
@given(batch(), st.sampled_from(MODES), st.sampled_from([float("nan"), float("inf"), 1e6]))
def test_agg_masked_entries_have_no_influence(data, mode, junk):
    x, m = data
    x1 = x.clone().requires_grad_(True)
    x2 = torch.where(m > 0, x, torch.full_like(x, junk)).requires_grad_(True)
    l1, l2 = losses.agg_loss(x1, m, mode), losses.agg_loss(x2, m, mode)
    torch.testing.assert_close(l1, l2)
    l1.backward(), l2.backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    assert torch.all(x1.grad[m == 0] == 0)


@SETTINGS
@given(batch(min_rows=2), st.sampled_from(MODES), st.randoms(use_true_random=False))
def test_agg_row_permutation_invariance(data, mode, rnd):
    x, m = data
    perm = list(range(x.shape[0]))
    rnd.shuffle(perm)
    torch.testing.assert_close(losses.agg_loss(x[perm], m[perm], mode), losses.agg_loss(x, m, mode))


@SETTINGS
@given(batch())
def test_agg_closed_form_gradients(data):
    x, m = data
    x = x.requires_grad_(True)
    losses.agg_loss(x, m, "token-mean").backward()
    torch.testing.assert_close(x.grad, m / m.sum())
    x.grad = None
    losses.agg_loss(x, m, "seq-mean-token-mean").backward()
    torch.testing.assert_close(x.grad, m / (m.shape[0] * m.sum(-1, keepdim=True)))


# ---- 2. PPO/GRPO clipped surrogate --------------------------------------------------------------
def surrogate_grad(data_ratio, adv, mask, eps_low, eps_high, c, mode="token-mean"):
    log_r = torch.log(data_ratio)
    old = torch.zeros_like(log_r)
    logp = log_r.clone().requires_grad_(True)
    loss, metrics = grpo.policy_loss(logp, old, adv, mask, eps_low, eps_high, c, mode)
    loss.backward()
    return logp.grad, metrics


@SETTINGS
@given(batch(), st.floats(0.05, 0.4), st.floats(0.05, 0.4), st.floats(1.5, 5.0), st.integers(0, 2**31 - 1))
def test_policy_loss_gradient_closed_form(data, eps_low, eps_high, c, seed):
    """d loss/d logp = (1/N) * (-A r) where the unclipped branch is active, else 0 (token-mean)."""
    adv_vals, m = data
    g = torch.Generator().manual_seed(seed)
    ratio = torch.exp(torch.randn(m.shape, generator=g, dtype=torch.float64) * 0.8)
    adv = adv_vals.round(decimals=1)  # includes exact zeros
    kinks = [(ratio - k).abs() < 1e-6 for k in (1 + eps_high, 1 - eps_low, c)]  # the gradient jumps there
    assume(not bool(((kinks[0] | kinks[1] | kinks[2]) & (m > 0)).any()))
    grad, metrics = surrogate_grad(ratio, adv, m, eps_low, eps_high, c)
    active = torch.where(adv > 0, ratio < 1 + eps_high, (ratio > 1 - eps_low) & (ratio < c)) & (adv != 0)
    expected = torch.where(active, -adv * ratio, torch.zeros_like(adv)) * m / m.sum()
    torch.testing.assert_close(grad, expected)
    for key in ("clipfrac_upper", "clipfrac_lower", "clipfrac_dual"):
        assert 0.0 <= float(metrics[key]) <= 1.0


@SETTINGS
@given(batch())
def test_policy_loss_on_policy_gradient_is_minus_advantage_over_ntok(data):
    adv, m = data
    grad, metrics = surrogate_grad(torch.ones_like(adv), adv, m, 0.2, 0.2, 3.0)
    torch.testing.assert_close(grad, -adv * m / m.sum())
    assert float(metrics["approx_kl"]) == 0.0 and float(metrics["clipfrac_upper"]) == 0.0


def test_policy_loss_named_regions():
    m = torch.ones(1, 5, dtype=torch.float64)
    ratio = torch.tensor([[1.5, 4.0, 2.0, 0.5, 1.1]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, -1.0, -1.0, 0.0]], dtype=torch.float64)
    grad, metrics = surrogate_grad(ratio, adv, m, 0.2, 0.2, 3.0)
    # A>0, r>1+eps: 0 | A<0, r>c: 0 (dual clip) | A<0, 1+eps<r<c: -A r/N | A<0, r<1-eps: 0 | A=0: 0
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, 2.0 / 5, 0.0, 0.0]], dtype=torch.float64))
    assert float(metrics["clipfrac_upper"]) == pytest.approx(1 / 5)
    assert float(metrics["clipfrac_dual"]) == pytest.approx(1 / 5)
    assert float(metrics["clipfrac_lower"]) == pytest.approx(1 / 5)


def test_token_mean_and_seq_mean_gradients_differ_for_unequal_lengths():
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    adv = torch.ones_like(m)
    g1, _ = surrogate_grad(torch.ones_like(m), adv, m, 0.2, 0.2, 3.0, "token-mean")
    g2, _ = surrogate_grad(torch.ones_like(m), adv, m, 0.2, 0.2, 3.0, "seq-mean-token-mean")
    assert not torch.allclose(g1, g2)
    torch.testing.assert_close(g2, -torch.tensor([[1 / 6, 1 / 6, 1 / 6], [1 / 2, 0, 0]], dtype=torch.float64))


# ---- 6. sequence masking ----------------------------------------------------------------------
@SETTINGS
@given(batch(), st.floats(0.0, 0.5), st.integers(0, 2**31 - 1))
def test_seq_mask_properties(data, delta, seed):
    adv_rows, m = data
    adv = adv_rows[:, :1].expand_as(m).clone()  # constant per row, as in GRPO
    g = torch.Generator().manual_seed(seed)
    logp = (torch.randn(m.shape, generator=g, dtype=torch.float64) * 0.5).requires_grad_(True)
    old = torch.zeros_like(m)
    masked = grpo.seq_mask(logp, old, adv, m, delta)
    assert not bool(masked[adv[:, 0] >= 0].any()), "rows with non-negative advantage are never masked"
    assert not bool(grpo.seq_mask(old, old, adv, m, delta).any()), "nothing is masked on-policy"
    loss, metrics = grpo.policy_loss(logp, old, adv, m, seq_mask_delta=delta)
    assert float(metrics["masked_seqs"]) == float(masked.sum())
    if masked.all():
        return
    loss.backward()
    assert torch.all(logp.grad[masked] == 0)
    # larger delta masks a subset
    assert bool((grpo.seq_mask(logp, old, adv, m, delta + 0.1) <= masked).all())


# ---- 7. KL estimators -------------------------------------------------------------------------
@SETTINGS
@given(st.lists(st.floats(-2, 0), min_size=1, max_size=8), st.lists(st.floats(-2, 0), min_size=1, max_size=8))
def test_kl_estimators(a, b):
    """Inside the clamp range of k3 (|l - l_ref| <= 2 keeps e^x - x - 1 < 10)."""
    n = min(len(a), len(b))
    logp = torch.tensor(a[:n], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor(b[:n], dtype=torch.float64)
    for kind in ("k2", "k3"):
        k = losses.kl_penalty(logp, ref, kind)
        assert torch.all(k >= -1e-12)  # k3 = e^x - x - 1 rounds to -1e-16 for |x| ~ 1e-9
        assert torch.all((k == 0) == (logp.detach() == ref)) or torch.all(k[logp.detach() == ref] == 0)
    (grad,) = torch.autograd.grad(losses.kl_penalty(logp, ref, "k3").sum(), logp)
    torch.testing.assert_close(grad, 1 - torch.exp(ref - logp.detach()))
    for base in ("k1", "k3"):
        plus = losses.kl_penalty(logp, ref, base + "+")
        torch.testing.assert_close(plus, losses.kl_penalty(logp, ref, base))
        (grad,) = torch.autograd.grad(plus.sum(), logp)
        torch.testing.assert_close(grad, logp.detach() - ref)
    assert torch.all(losses.kl_penalty(ref, ref, "k3") == 0)


def test_kl_k2_k3_positive_off_diagonal_and_k1_signed():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -1.0])
    assert torch.all(losses.kl_penalty(logp, ref, "k3") > 0) and torch.all(losses.kl_penalty(logp, ref, "k2") > 0)
    assert losses.kl_penalty(logp, ref, "k1").tolist() == [1.0, -1.0]
    with pytest.raises(ValueError):
        losses.kl_penalty(logp, ref, "k9")


# ---- 8. GRPO advantage ------------------------------------------------------------------------
@st.composite
def groups(draw):
    """scores (N,), group ids, episode ids: several groups, each with episodes of 1..4 rows."""
    scores, gids, eids, e = [], [], [], 0
    for g in range(draw(st.integers(1, 4))):
        for _ in range(draw(st.integers(1, 5))):
            n_rows = draw(st.integers(1, 4))
            value = draw(st.sampled_from([0.0, 10.0, -1.3, 2.5]))
            for _ in range(n_rows):
                scores.append(value - draw(st.sampled_from([0.0, 0.1])))
                gids.append(g), eids.append(e)
            e += 1
    return np.array(scores), np.array(gids), np.array(eids)


@SETTINGS
@given(groups())
def test_grpo_advantage_cross_steps(data):
    scores, gids, eids = data
    adv = grpo.compute_advantages(scores, gids, eids)
    for g in np.unique(gids):
        s, a = scores[gids == g], adv[gids == g]
        if len(s) == 1:
            assert a[0] == pytest.approx(s[0] / (1 + 1e-6))  # single sample: raw score
            continue
        assert a.sum() == pytest.approx(0.0, abs=1e-9)
        if np.all(s == s[0]):
            np.testing.assert_allclose(a, 0.0, atol=1e-9)  # exact up to the rounding of the group mean
        else:
            assert a.std(ddof=1) == pytest.approx(s.std(ddof=1) / (s.std(ddof=1) + 1e-6), rel=1e-9)
    # affine invariance (groups of > 1 row; a singleton keeps its raw score) and row-permutation equivariance
    multi = np.isin(gids, [g for g in np.unique(gids) if (gids == g).sum() > 1])
    np.testing.assert_allclose(grpo.compute_advantages(3 * scores + 7, gids, eids)[multi], adv[multi], rtol=1e-4,
                               atol=1e-5)
    perm = np.random.default_rng(0).permutation(len(scores))
    # a permuted group sums its scores in another order: its mean may differ in the last bit
    np.testing.assert_allclose(grpo.compute_advantages(scores[perm], gids[perm], eids[perm]), adv[perm], atol=1e-12)


@SETTINGS
@given(groups())
def test_grpo_advantage_vanilla(data):
    scores, gids, eids = data
    adv = grpo.compute_advantages(scores, gids, eids, cross_steps=False)
    for g in np.unique(gids):
        in_group = gids == g
        episodes = np.unique(eids[in_group])
        traj_adv = np.array([adv[eids == e].mean() for e in episodes])
        if len(episodes) > 1:
            # episodes with equal means leave a rounding-level std that eps = 1e-6 amplifies to ~1e-9
            assert traj_adv.sum() == pytest.approx(0.0, abs=1e-6)
    mean_only = grpo.compute_advantages(scores, gids, eids, norm_by_std=False)
    for g in np.unique(gids):
        if (gids == g).sum() > 1:
            np.testing.assert_allclose(mean_only[gids == g], scores[gids == g] - scores[gids == g].mean(), atol=1e-12)
