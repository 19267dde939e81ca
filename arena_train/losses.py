"""Loss math every method shares: masked means, loss aggregation and the KL to the reference.

B = rows, T = padded response length; masks are 0/1 floats. ``agg_loss``'s ``counts`` (``update.MiniBatch.counts``)
make a micro-batch's value its exact share of the whole mini-batch's loss on all processes, so gradient
accumulation and data parallelism sum to the loss of one big batch (tests/test_reference_update.py).
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over entries where mask is 1 (0 if the mask is empty)."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str,
             counts: dict[str, float] | None = None) -> torch.Tensor:
    """Aggregate a (B, T) per-token loss to a scalar (ARLArena §3.1).

    token-mean: sum / #tokens; seq-mean-token-mean: sum of row means / #non-empty rows; seq-mean-token-sum:
    sum / #rows; seq-mean-token-sum-norm (Dr.GRPO): sum / (#rows * L_max), L_max a constant length.
    ``counts`` holds those denominators for the whole mini-batch on all processes (``loss_counts``), so that a
    micro-batch's value is its share of the mini-batch's loss; None = this batch is the whole mini-batch
    (L_max = its padded length T).
    """
    loss_mat = torch.where(mask > 0, loss_mat, torch.zeros_like(loss_mat))  # masked inf/nan must not leak
    row_len = mask.sum(-1)  # (B,)
    if counts is None:
        counts = {"tokens": float(mask.sum()), "rows": float(mask.shape[0]),
                  "nonempty_rows": float((row_len > 0).sum()), "max_len": float(mask.shape[-1])}
    if mode == "token-mean":
        return loss_mat.sum() / max(counts["tokens"], 1.0)
    if mode == "seq-mean-token-mean":
        return (loss_mat.sum(-1) / row_len.clamp(min=1.0)).sum() / max(counts["nonempty_rows"], 1.0)
    if mode == "seq-mean-token-sum":
        return loss_mat.sum() / max(counts["rows"], 1.0)
    if mode == "seq-mean-token-sum-norm":
        return loss_mat.sum() / (max(counts["rows"], 1.0) * counts["max_len"])
    raise ValueError(f"unknown loss_agg_mode {mode!r}")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate (B, T) between the policy and the reference (ARLArena §6.1).

    k1 = l - l_ref; k2 = (l - l_ref)^2 / 2; k3 = e^x - x - 1 with x = l_ref - l (clamped);
    a trailing '+' keeps the forward value of the estimator but uses k2's gradient.
    """
    if kind.endswith("+"):
        value = kl_penalty(logp, ref_logp, kind[:-1])
        k2 = kl_penalty(logp, ref_logp, "k2")
        return k2 + (value - k2).detach()
    diff = logp - ref_logp
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff.square()
    if kind == "k3":
        x = torch.clamp(-diff, -20.0, 20.0)
        return torch.clamp(torch.exp(x) - x - 1.0, -10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}")
