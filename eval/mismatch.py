"""How far a bf16 rollout engine is from the float32 trainer on a checkpoint, and what TIS / MIS do about it.

    python -m eval.mismatch --model-path runs/mini_arena/seed1/bc [--env-id ARL/Sokoban-Mini-v0 --groups 8]

Plays sampled episodes with the bf16 engine the scripts use under ``--rollout-precision bf16`` (recording the
log-prob of every token it drew), scores the same tokens with the float32 trainer, and prints the ``rollout_is/*``
statistics a run would log. Then the effect of the correction, exactly rather than by sampling: at the first
response token of every row, the expected policy gradient with respect to the trainer's logits z,
E_{x~μ}[w(x) A(x) ∇_z log π(x)], against the on-policy Σ_x π(x) A(x) (e_x − π), for a seeded random advantage
A per vocabulary token (μ: the engine's next-token distribution, π: the trainer's). Its relative error is the
bias the engine gap puts into an update: none (w = 1) against TIS / MIS at ``--cap``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import tyro


@dataclass
class Args:
    model_path: Path
    """a checkpoint folder (e.g. the mini-arena's BC start)"""
    env_id: str = "ARL/Sokoban-Mini-v0"
    groups: int = 8
    """groups of --group-size sampled episodes"""
    group_size: int = 8
    temperature: float = 1.0
    max_response_tokens: int = 12
    cap: float = 2.0
    """the TIS / MIS cap (the scripts' --rollout-is-cap default)"""
    seed: int = 1


def gradient_bias(log_pi: torch.Tensor, log_mu: torch.Tensor, advantage: torch.Tensor,
                  mode: str, cap: float) -> float:
    """Relative error of the expected one-token policy gradient (w.r.t. the trainer's logits) when tokens come
    from μ instead of π; all inputs (V,) float64; ``mode`` none, tis or mis (``arena_train.rollout_is``)."""
    from arena_train.rollout_is import rollout_is_weights

    pi, mu = log_pi.exp(), log_mu.exp()
    score = torch.eye(len(pi), dtype=pi.dtype) - pi  # row x: ∇_z log π(x) = e_x − π   (V, V)
    true = (pi * advantage) @ score
    ones = torch.ones(1, len(pi), dtype=pi.dtype)
    w = ones[0] if mode == "none" else rollout_is_weights(log_pi[None], log_mu[None], ones, mode, cap)[0]
    return float(((mu * w * advantage) @ score - true).norm() / true.norm())


@torch.no_grad()
def measure(args: Args) -> dict[str, float]:
    from collections import defaultdict

    import numpy as np
    from accelerate import Accelerator

    import wrappers
    from arena_train.batching import score_rows
    from arena_train.models import load_model_and_tokenizer
    from arena_train.rollout import RolloutConfig, collect_rows
    from arena_train.rollout_is import mismatch_stats
    from arena_train.sharding import hf_backend

    torch.manual_seed(args.seed)
    policy, tokenizer = load_model_and_tokenizer(str(args.model_path), torch.float32)
    engine = hf_backend(Accelerator(cpu=True), policy.eval(), tokenizer, torch.float32, precision="bf16")
    rollout = wrappers.GroupRollout(lambda: wrappers.make_env(args.env_id, prompt_style="compact"), args.groups,
                                    args.group_size)
    config = RolloutConfig(max_turns=10, max_prompt_tokens=512, max_response_tokens=args.max_response_tokens,
                           temperature=args.temperature)
    rows, _ = collect_rows(engine, tokenizer, rollout, list(range(args.seed * 1000, args.seed * 1000 + args.groups)),
                           config, defaultdict(float))
    score_rows(policy, None, rows, micro_batch_size=64, temperature=args.temperature, pad_id=tokenizer.pad_token_id,
               device="cpu", stats=defaultdict(float), use_rollout_logp=False)
    old = torch.tensor(np.concatenate([r.old_logp for r in rows]), dtype=torch.float64)[None]
    roll = torch.tensor(np.concatenate([r.rollout_logp for r in rows]), dtype=torch.float64)[None]
    out = {f"rollout_is/{k}": float(v) for k, v in mismatch_stats(old, roll, torch.ones_like(old)).items()}
    out.update(rows=len(rows), tokens=old.shape[1])
    g = torch.Generator().manual_seed(args.seed)
    biases: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        ids = torch.tensor([r.prompt_ids])
        log_pi = torch.log_softmax(policy(input_ids=ids).logits[0, -1].double() / args.temperature, -1)
        log_mu = torch.log_softmax(engine.copy(input_ids=ids).logits[0, -1].double() / args.temperature, -1)
        advantage = torch.randn(log_pi.shape, generator=g, dtype=torch.float64)
        for mode in ("none", "tis", "mis"):
            biases[mode].append(gradient_bias(log_pi, log_mu, advantage, mode, args.cap))
    for mode, values in biases.items():
        out[f"bias/{mode}_mean"], out[f"bias/{mode}_max"] = float(np.mean(values)), float(np.max(values))
    return out


def main() -> None:
    args = tyro.cli(Args)
    result = measure(args)
    print(f"bf16 engine vs float32 trainer on {args.model_path} ({args.env_id}, T = {args.temperature}): "
          f"{result['rows']} rows, {result['tokens']} sampled tokens")
    for key, value in result.items():
        if key not in ("rows", "tokens"):
            print(f"  {key:28s} {value:.3g}")


if __name__ == "__main__":
    main()
