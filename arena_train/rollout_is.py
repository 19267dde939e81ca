"""Rollout/trainer mismatch: how far the rollout engine's token probabilities are from the trainer's, and the
importance weights that correct the policy gradient for it.

The rollout engine (vLLM, bf16 kernels, a stale weight push) samples from π_rollout while the loss assumes the
samples came from π_old, the trainer's own scoring of the same weights. The gap biases every update, and a
growing gap is a collapse signal (docs/evaluation.md, "The in-run alarm"). B = rows, T = padded response
length; masks are 0/1 floats; log-probs are of the sampled tokens at the sampling temperature.

Definitions follow TRL's ``GRPOTrainer`` (``vllm_importance_sampling_mode`` / ``vllm_importance_sampling_clip_max``,
TRL 1.16): the weight is ρ = π_old / π_rollout, per token, or per sequence as the product of its tokens' ratios
(``exp`` of the summed log-ratio, no length normalisation) applied to every token of the row.

- TIS (truncated, ``token_truncate`` / ``sequence_truncate``): w = min(ρ, cap).
- MIS (masked, ``token_mask`` / ``sequence_mask``): w = ρ where ρ ≤ cap, 0 where ρ > cap; a kept token keeps its
  ratio, as in TRL (verl's rejection-sampling mask instead drops the token and applies no weight).

Only the upper bound is used, as TRL's default (``clip_min=None``): a token the trainer finds *less* likely than
the rollout did already gets a small weight, so a lower cut would only throw away signal.
"""

from __future__ import annotations

from typing import Literal

import torch

#: ratio band of ``ratio_out_frac``: a token outside it differs by more than 25 % between the two engines
RATIO_BAND = (0.8, 1.25)
#: log-ratios are clamped before ``exp`` so one wild token cannot overflow a sequence product
MAX_LOG_RATIO = 20.0


def mismatch_stats(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Detached scalars over the tokens where ``mask`` is 1, all (B, T) inputs; ``rollout_is/<key>`` in the log.

    prob_diff_mean / prob_diff_max: mean / max of |p_rollout − p_old| (probabilities, not log-probs: a log gap
    on a token of probability 1e-6 moves nothing); ratio_out_frac: share of tokens whose p_old / p_rollout is
    outside ``RATIO_BAND``; log_ratio_mean: mean of log p_old − log p_rollout (> 0: the trainer likes the
    samples more than the engine that drew them). All 0 when the mask is empty.
    """
    with torch.no_grad():
        keep = mask > 0
        n = keep.sum().clamp(min=1)
        old = torch.where(keep, old_logp, torch.zeros_like(old_logp))  # masked junk (nan, -inf) never leaks
        roll = torch.where(keep, rollout_logp, torch.zeros_like(rollout_logp))
        prob_diff = (old.exp() - roll.exp()).abs() * keep
        log_ratio = (old - roll) * keep
        ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()
        outside = ((ratio < RATIO_BAND[0]) | (ratio > RATIO_BAND[1])) & keep
        return {
            "prob_diff_mean": prob_diff.sum() / n,
            "prob_diff_max": prob_diff.max() if prob_diff.numel() else prob_diff.sum(),
            "ratio_out_frac": outside.sum() / n,
            "log_ratio_mean": log_ratio.sum() / n,
        }


def rollout_is_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                       mode: Literal["none", "tis", "mis"] = "tis", cap: float = 3.0,
                       level: Literal["token", "sequence"] = "token") -> torch.Tensor:
    """Detached importance weights (B, T) that multiply the per-token policy loss; 0 on masked tokens.

    ``mode`` none: 1 everywhere (no correction); tis: min(ρ, cap); mis: ρ·[ρ ≤ cap]. ``level`` token: ρ per
    token; sequence: one ρ per row, the product over its tokens (B, 1), broadcast to its tokens. ``cap`` ≥ 1 so
    that an exact match (ρ = 1) is never cut.
    """
    if cap < 1.0:
        raise ValueError(f"rollout IS cap must be >= 1 (got {cap})")
    with torch.no_grad():
        keep = mask > 0
        if mode == "none":
            return keep.to(old_logp.dtype)
        log_ratio = torch.where(keep, old_logp - rollout_logp, torch.zeros_like(old_logp))  # (B, T)
        if level == "sequence":
            log_ratio = log_ratio.sum(-1, keepdim=True)  # (B, 1)
        elif level != "token":
            raise ValueError(f"unknown rollout IS level {level!r}")
        ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()  # (B, T) or (B, 1)
        if mode == "tis":
            weight = ratio.clamp(max=cap)
        elif mode == "mis":
            weight = torch.where(ratio <= cap, ratio, torch.zeros_like(ratio))
        else:
            raise ValueError(f"unknown rollout IS mode {mode!r}")
        return weight.expand_as(old_logp) * keep


def rollout_correction(batch: dict[str, torch.Tensor], mask: torch.Tensor, mode: str, cap: float,
                       other_engine: bool = False) -> tuple[torch.Tensor | None, dict[str, float]]:
    """A micro-batch's rollout/trainer correction: (per-token weights (B, T) of the policy loss, 1 on rows the
    rollout did not score, or None for mode 'none'; that batch's ``mismatch_stats``). ``other_engine``: the
    rollout's log-probs come from another engine or precision (the backend's ``score_rollouts`` is False), so the
    gap is measured even without a correction; mode 'none' on the trainer's own engine gives (None, {})."""
    if mode == "none" and not other_engine:
        return None, {}
    scored = mask * batch["has_rollout_logp"][:, None].to(mask.dtype)
    stats = {k: float(v) for k, v in mismatch_stats(batch["old_logp"], batch["rollout_logp"], scored).items()}
    if mode == "none":
        return None, stats
    weights = rollout_is_weights(batch["old_logp"], batch["rollout_logp"], scored, mode, cap)
    return torch.where(scored > 0, weights, torch.ones_like(mask)), stats


def pooled_mismatch(accelerator, values: dict[str, list[float]]) -> dict[str, float]:
    """``rollout_is/<key>`` of an iteration from its micro-batches' statistics on every process (the maximum for
    ``*_max``, else the mean); every process must hold values."""
    import numpy as np

    out = {}
    for key, per_batch in values.items():
        top = key.endswith("_max")
        pooled = accelerator.gather(torch.tensor([max(per_batch) if top else float(np.mean(per_batch))],
                                                 device=accelerator.device))
        out[f"rollout_is/{key}"] = float(pooled.max() if top else pooled.mean())
    return out
