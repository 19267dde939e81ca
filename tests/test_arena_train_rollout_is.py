"""arena_train.rollout_is: mismatch statistics exact on hand-computed examples, and the properties of the
TIS / MIS weights (detached, 1 on a perfect match, bounded by the cap, masks respected, monotone in the cap,
MIS zeroes exactly the tokens above the cap)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arena_train.rollout_is import mismatch_stats, rollout_is_weights

SETTINGS = settings(max_examples=60, deadline=None)
MODES = ["none", "tis", "mis"]
LEVELS = ["token", "sequence"]


@st.composite
def logps(draw, max_rows=4, max_len=6):
    """(old_logp, rollout_logp, mask), all (B, T) float64; rows right-padded, at least one token each."""
    B, T = draw(st.integers(1, max_rows)), draw(st.integers(1, max_len))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    rollout = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4  # log-probs in (-4, 0]
    old = (rollout + torch.randn(B, T, generator=g, dtype=torch.float64) * draw(st.sampled_from([0.05, 0.5, 2.0])))
    mask = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        mask[b, :draw(st.integers(1, T))] = 1
    return old.clamp(max=0.0), rollout, mask


def test_stats_hand_computed():
    old = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.2)],
                        [math.log(0.1), 0.0, 0.0]], dtype=torch.float64)
    roll = torch.tensor([[math.log(0.5), math.log(0.6), math.log(0.3)],
                         [math.log(0.2), float("nan"), -float("inf")]], dtype=torch.float64)  # junk where masked
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float64)
    s = mismatch_stats(old, roll, mask)
    # |dp| = 0, 0.3, 0.1, 0.1; ratios 1, 1.5, 2/3, 1/2 -> three outside [0.8, 1.25]
    assert s["prob_diff_mean"].item() == pytest.approx(0.5 / 4)
    assert s["prob_diff_max"].item() == pytest.approx(0.3)
    assert s["ratio_out_frac"].item() == pytest.approx(3 / 4)
    assert s["log_ratio_mean"].item() == pytest.approx((math.log(1.5) + math.log(2 / 3) + math.log(0.5)) / 4)
    assert all(torch.isfinite(v) for v in s.values())


def test_stats_of_an_empty_mask_are_zero():
    x = torch.randn(2, 3)
    s = mismatch_stats(x, x + 1, torch.zeros(2, 3))
    assert all(v.item() == 0 for v in s.values())


def test_weights_hand_computed():
    # token ratios 2, 4, 0.5 on one row of 3 tokens; cap 3
    roll = torch.log(torch.tensor([[0.1, 0.2, 0.4]], dtype=torch.float64))
    old = torch.log(torch.tensor([[0.2, 0.8, 0.2]], dtype=torch.float64))
    mask = torch.ones(1, 3, dtype=torch.float64)
    tis = rollout_is_weights(old, roll, mask, "tis", cap=3.0)
    mis = rollout_is_weights(old, roll, mask, "mis", cap=3.0)
    torch.testing.assert_close(tis, torch.tensor([[2.0, 3.0, 0.5]], dtype=torch.float64))
    torch.testing.assert_close(mis, torch.tensor([[2.0, 0.0, 0.5]], dtype=torch.float64))
    # the sequence ratio is the product 2 * 4 * 0.5 = 4: truncated to 3, or the whole row masked
    torch.testing.assert_close(rollout_is_weights(old, roll, mask, "tis", 3.0, "sequence"), torch.full((1, 3), 3.0,
                               dtype=torch.float64))
    assert torch.all(rollout_is_weights(old, roll, mask, "mis", 3.0, "sequence") == 0)
    torch.testing.assert_close(rollout_is_weights(old, roll, mask, "mis", 5.0, "sequence"), torch.full((1, 3), 4.0,
                               dtype=torch.float64))


@SETTINGS
@given(logps(), st.sampled_from(MODES), st.sampled_from(LEVELS), st.floats(1.0, 10.0))
def test_weights_are_detached_bounded_and_zero_on_masked_tokens(data, mode, level, cap):
    old, roll, mask = data
    old = old.clone().requires_grad_(True)
    w = rollout_is_weights(old, roll, mask, mode, cap, level)
    assert not w.requires_grad and w.shape == old.shape
    assert torch.all(w >= 0) and torch.all(w <= max(cap, 1.0) + 1e-12)
    assert torch.all(w[mask == 0] == 0)


@SETTINGS
@given(logps(), st.sampled_from(MODES), st.sampled_from(LEVELS), st.floats(1.0, 10.0))
def test_weights_are_one_when_rollout_equals_trainer(data, mode, level, cap):
    _, roll, mask = data
    torch.testing.assert_close(rollout_is_weights(roll, roll, mask, mode, cap, level), mask)


@SETTINGS
@given(logps(), st.sampled_from(MODES), st.sampled_from(LEVELS), st.sampled_from([float("nan"), float("inf"), 50.0]))
def test_masked_tokens_never_matter(data, mode, level, junk):
    old, roll, mask = data
    w = rollout_is_weights(old, roll, mask, mode, 2.0, level)
    junk_old = torch.where(mask > 0, old, torch.full_like(old, junk))
    junk_roll = torch.where(mask > 0, roll, torch.full_like(roll, -junk))
    torch.testing.assert_close(rollout_is_weights(junk_old, junk_roll, mask, mode, 2.0, level), w)
    s, junk_s = mismatch_stats(old, roll, mask), mismatch_stats(junk_old, junk_roll, mask)
    for key in s:
        torch.testing.assert_close(junk_s[key], s[key])


@SETTINGS
@given(logps(), st.sampled_from(LEVELS), st.floats(1.0, 5.0), st.floats(0.0, 5.0))
def test_tis_is_monotone_in_the_cap_and_mis_zeroes_exactly_the_tokens_above_it(data, level, cap, more):
    old, roll, mask = data
    lo, hi = rollout_is_weights(old, roll, mask, "tis", cap, level), rollout_is_weights(old, roll, mask, "tis",
                                                                                        cap + more, level)
    assert torch.all(lo <= hi)
    log_ratio = ((old - roll) * mask).sum(-1, keepdim=True) if level == "sequence" else old - roll
    ratio = log_ratio.exp().expand_as(old)
    mis = rollout_is_weights(old, roll, mask, "mis", cap, level)
    inside = (ratio <= cap) & (mask > 0)
    torch.testing.assert_close(mis[inside], ratio[inside])
    assert torch.all(mis[~inside] == 0)
    assert torch.all(rollout_is_weights(old, roll, mask, "mis", cap + more, level)[inside] > 0)


def test_bad_arguments():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="cap"):
        rollout_is_weights(x, x, torch.ones(1, 2), "tis", cap=0.5)
    with pytest.raises(ValueError, match="mode"):
        rollout_is_weights(x, x, torch.ones(1, 2), "clip")
    with pytest.raises(ValueError, match="level"):
        rollout_is_weights(x, x, torch.ones(1, 2), "tis", level="turn")
