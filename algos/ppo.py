# ALGO LOGIC: module docstring (what this method is and how it differs from grpo.py)
"""PPO for multi-turn LLM agents — a copy of grpo.py with a token-level critic and GAE.

Method (Schulman et al., PPO arXiv 1707.06347, GAE arXiv 1506.02438; ARLArena §4.4; the "biased"
PPO baseline of the Practitioner's Guide, arXiv 2510.01132): the critic is a separate copy of the
policy checkpoint with a zero-initialised scalar head per token (``AutoModelForTokenClassification``),
its own AdamW parameter group (``--critic-lr``, default 10x the policy's) and its own gradient clipping. Each row (one turn) is a
GAE segment: the row's score (episode return minus its format penalty) sits on its last response
token, V = 0 after it, and A_t = delta_t + gamma * lam * A_{t+1} runs over the response tokens;
advantages are whitened over the whole batch (all processes). The value loss is clipped
(``--value-clip`` 0.5). The KL to the reference goes into the loss (default, ARLArena's recipe) or,
with ``--kl-in-reward``, into the token rewards (PPO style). Policy loss is grpo.py's clipped
surrogate.

Differs from grpo.py only inside ``# ALGO LOGIC`` blocks: ``diff algos/grpo.py algos/ppo.py``.

    python algos/sft.py && python algos/ppo.py                    # CPU demo, tiny model, minutes
    accelerate launch algos/ppo.py --profile gpu --model-path <BC checkpoint of Qwen3-4B>
"""
# END ALGO LOGIC

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
import tyro

#: Values for the profile-dependent ``Args`` fields left unset (``None``) on the command line.
PROFILES: dict[str, dict[str, Any]] = {
    # Finishes in minutes on one CPU thread: tiny BC model from `python algos/sft.py`, compact prompt.
    # Rollouts at T=0.5 stay near the greedy policy of an under-trained BC model (README "Mini-arena").
    "cpu-tiny": dict(env_id="ARL/Sokoban-Mini-v0", model_path="checkpoints/sft-sokoban-tiny", num_iterations=30,
                     num_groups=8, group_size=8, max_turns=10, history_length=0, prompt_style="compact",
                     max_prompt_tokens=512, max_response_tokens=16, temperature=0.5, learning_rate=1e-4,
                     mini_batch_size=128, micro_batch_size=128, update_epochs=1, rollout_backend="hf",
                     mixed_precision="no", eval_every=10, eval_episodes=100, checkpoint_every=10),
    # ARLArena's shared recipe (§1.3): BC'd Qwen3-4B, 16 groups x 8, lr 1e-6, mini-batch 256, bf16, vLLM.
    "gpu": dict(env_id="ARL/Sokoban-v0", model_path="Qwen/Qwen3-4B", temperature=1.0, num_iterations=200,
                num_groups=16, group_size=8, max_turns=15, history_length=2, prompt_style="full", max_prompt_tokens=2048, max_response_tokens=512,
                learning_rate=1e-6, mini_batch_size=256, micro_batch_size=8, update_epochs=1,
                rollout_backend="auto", mixed_precision="bf16", eval_every=10, eval_episodes=128,
                checkpoint_every=10),
}
#: Loss aggregation modes (ARLArena §3.1); ``--loss-agg`` is the short flag.
LossAgg = Annotated[Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"],
                    tyro.conf.arg(aliases=("--loss-agg",))]
#: Sequence masking switch (ARLArena §3.8); ``--seq-mask`` is the short flag.
SeqMask = Annotated[bool, tyro.conf.arg(aliases=("--seq-mask",))]
#: Per-micro-batch metrics that are counts (summed over the iteration), not averages.
COUNT_METRICS = ("masked_seqs",)
#: Task seeds >= this are held out for evaluation; training seeds stay below.
EVAL_SEED_OFFSET = 1_000_000_000


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (the script name)"""
    profile: Literal["cpu-tiny", "gpu"] = "cpu-tiny"
    """fills every field left unset (None): cpu-tiny = minutes on a laptop, gpu = ARLArena's recipe"""
    env_id: str | None = None
    """registered ARLArena env id (cpu-tiny: ARL/Sokoban-Mini-v0, gpu: ARL/Sokoban-v0)"""
    model_path: str | None = None
    """HF hub id or local folder ('tiny', 'smollm2' = offline models from arena_models)"""
    num_iterations: int | None = None
    """number of rollout + update iterations"""
    num_groups: int | None = None
    """task instances (groups) per iteration, over all processes"""
    group_size: int | None = None
    """episodes per group G (same task seed)"""
    max_turns: int | None = None
    """turn budget per episode"""
    history_length: int | None = None
    """past (observation, action) pairs shown in the prompt"""
    prompt_style: str | None = None
    """prompt template of the wrappers: 'full' (ARLArena) or 'compact' (tiny models)"""
    max_prompt_tokens: int | None = None
    """prompts longer than this keep their last tokens"""
    max_response_tokens: int | None = None
    """new tokens generated per turn"""
    temperature: float | None = None
    """sampling temperature of training rollouts (log-probs use the same temperature)"""
    top_p: float = 1.0
    """nucleus sampling of training rollouts"""
    learning_rate: float | None = None
    """AdamW learning rate (constant)"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradient clipping threshold (total norm)"""
    kl_coef: float = 0.01
    """coefficient of the KL-to-reference loss (0 = logged only)"""
    kl_estimator: Literal["k1", "k2", "k3", "k1+", "k3+"] = "k3"
    """KL estimator (k3 = low_var_kl; '+' = straight-through with k2 gradient)"""
    entropy_coef: float = 0.001
    """coefficient of the entropy bonus"""
    format_penalty: float = 0.1
    """subtracted from a row's score when its format or action is invalid"""
    mini_batch_size: int | None = None
    """rows per optimizer step (per process)"""
    micro_batch_size: int | None = None
    """rows per forward/backward pass (gradient accumulation inside a mini-batch)"""
    update_epochs: int | None = None
    """passes over each rollout batch"""
    rollout_backend: str | None = None
    """'auto' (vLLM if importable and on GPU), 'vllm' or 'hf' (transformers generate)"""
    vllm_gpu_memory_utilization: float = 0.35
    """GPU memory fraction given to vLLM's engine"""
    mixed_precision: str | None = None
    """Accelerate mixed precision: 'no', 'bf16' or 'fp16'"""
    gradient_checkpointing: bool = False
    """trade compute for memory in the update"""
    seed: int = 1
    """seed of everything (tasks, sampling, init)"""
    torch_threads: int = 1
    """CPU threads per process (1 avoids OpenMP contention on shared machines)"""
    output_dir: str = "runs"
    """runs/<run_name>/ receives metrics.jsonl, TensorBoard events, checkpoints and the final model"""
    run_name: str | None = None
    """defaults to <env>__<exp_name>__<seed>"""
    checkpoint_every: int | None = None
    """save model, optimizer, RNG states every N iterations (0 = only at the end)"""
    resume: bool = False
    """continue from the latest checkpoint of run_name"""
    eval_every: int | None = None
    """greedy evaluation on held-out seeds every N iterations (0 = never)"""
    eval_episodes: int | None = None
    """held-out episodes per evaluation"""
    track: bool = False
    """also log to Weights & Biases"""
    wandb_project: str = "arlarena"
    """W&B project"""
    # ALGO LOGIC: algorithm hyper-parameters
    clip_ratio_low: float = 0.2
    """PPO clip epsilon below 1"""
    clip_ratio_high: float = 0.2
    """PPO clip epsilon above 1"""
    clip_ratio_c: float = 3.0
    """dual-clip bound c (> 1) on the ratio for negative advantages"""
    loss_agg_mode: LossAgg = "token-mean"
    """loss aggregation (seq-mean-token-mean = GRPO_ST)"""
    use_seq_mask: SeqMask = False
    """GRPO_SM: drop negative-advantage rows whose mean log(pi_old/pi) exceeds seq_mask_delta"""
    seq_mask_delta: float = 3e-3
    """sequence-masking threshold delta"""
    gamma: float = 1.0
    """GAE discount over the response tokens of a row (verl default)"""
    lam: float = 1.0
    """GAE lambda"""
    critic_lr: float | None = None
    """AdamW learning rate of the critic (None = 10 x --learning-rate: 1e-5 for the gpu profile, as verl)"""
    value_clip: float = 0.5
    """value-loss clip range around the rollout-time values"""
    kl_in_reward: bool = False
    """put kl_coef * KL(old || ref) into the token rewards instead of the loss"""
    # END ALGO LOGIC


def resolve_args(args: Args) -> Args:
    """Fill profile-dependent fields left unset and validate."""
    for key, value in PROFILES[args.profile].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.run_name is None:
        args.run_name = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}"
    for key in ("num_groups", "group_size", "max_turns", "mini_batch_size", "micro_batch_size", "update_epochs"):
        if getattr(args, key) < 1:
            raise SystemExit(f"--{key.replace('_', '-')} must be >= 1")
    return args


# ---------------------------------------------------------------------------------------------
# Pure math. B = rows, T = padded response length, V = vocabulary. Masks are 0/1 floats.
# ---------------------------------------------------------------------------------------------
def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over entries where mask is 1 (0 if the mask is empty)."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Aggregate a (B, T) per-token loss to a scalar (ARLArena §3.1).

    token-mean: sum / #tokens; seq-mean-token-mean: mean over non-empty rows of row means;
    seq-mean-token-sum: mean over rows of row sums; seq-mean-token-sum-norm: sum / T.
    """
    loss_mat = torch.where(mask > 0, loss_mat, torch.zeros_like(loss_mat))  # masked inf/nan must not leak
    if mode == "token-mean":
        return loss_mat.sum() / mask.sum().clamp(min=1.0)
    row_len = mask.sum(-1)  # (B,)
    if mode == "seq-mean-token-mean":
        nonempty = row_len > 0
        row_mean = loss_mat.sum(-1) / row_len.clamp(min=1.0)
        return (row_mean * nonempty).sum() / nonempty.sum().clamp(min=1)
    if mode == "seq-mean-token-sum":
        return loss_mat.sum(-1).mean()
    if mode == "seq-mean-token-sum-norm":
        return loss_mat.sum() / mask.shape[-1]
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


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (...,) of the categorical distributions given by logits (..., V)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


# ALGO LOGIC: advantage estimator
def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (ARLArena §4.4): (B, T) rewards, values, mask -> (advantages, returns).

    Reverse scan: delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}; tokens with
    mask 0 pass V_next and A_next through unchanged; V = 0 after the last position. returns = A + V
    (the critic's target). Not whitened.
    """
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        next_value = torch.where(mask[:, t] > 0, values[:, t], next_value)
        next_adv = torch.where(mask[:, t] > 0, adv, next_adv)
        advantages[:, t] = next_adv
    return advantages, advantages + values


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, all_reduce=lambda t: t, eps: float = 1e-8) -> torch.Tensor:
    """(B, T) -> (B, T) with masked mean 0 and unbiased masked variance 1 (0 where mask is 0).
    ``all_reduce`` sums a tensor over processes, so the statistics cover the whole batch."""
    total = all_reduce(torch.stack([(x * mask).sum(), mask.sum()]))
    mean = total[0] / total[1]
    var = all_reduce(((x - mean).square() * mask).sum()) / (total[1] - 1).clamp(min=1.0)
    return (x - mean) * torch.rsqrt(var + eps) * mask
# END ALGO LOGIC


# ALGO LOGIC: policy loss
def seq_mask(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             delta: float) -> torch.Tensor:
    """GRPO_SM (§3.8): (B,) bool, True for rows with mean advantage < 0 and mean log(pi_old/pi) > delta."""
    row_len = mask.sum(-1).clamp(min=1.0)
    mean_adv = (advantages * mask).sum(-1) / row_len
    mean_log_ratio = ((old_logp - logp).detach() * mask).sum(-1) / row_len
    return (mean_adv < 0) & (mean_log_ratio > delta)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_low: float = 0.2, clip_high: float = 0.2, clip_c: float = 3.0, agg_mode: str = "token-mean",
                seq_mask_delta: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with dual clip (verl 'vanilla', §3.2); all tensors (B, T).

    Returns the aggregated loss and detached metrics: clipfrac_upper (A>0, r>1+eps_high),
    clipfrac_lower (A<0, r<1-eps_low), clipfrac_dual (A<0, r>c), approx_kl (mean l_old - l),
    masked_seqs (rows dropped by sequence masking).
    """
    masked = torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
    if seq_mask_delta is not None:
        masked = seq_mask(logp, old_logp, advantages, mask, seq_mask_delta)
        mask = mask * (~masked).unsqueeze(-1).to(mask.dtype)
    log_ratio = torch.clamp(logp - old_logp, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = torch.maximum(loss1, loss2)
    loss3 = -advantages * clip_c
    dual = torch.minimum(clipped, loss3)
    loss_mat = torch.where(advantages < 0, dual, clipped)
    with torch.no_grad():
        metrics = {
            "clipfrac_upper": masked_mean(((ratio > 1 + clip_high) & (advantages > 0)).float(), mask),
            "clipfrac_lower": masked_mean(((ratio < 1 - clip_low) & (advantages < 0)).float(), mask),
            "clipfrac_dual": masked_mean(((ratio > clip_c) & (advantages < 0)).float(), mask),
            "approx_kl": masked_mean(-log_ratio, mask),
            "masked_seqs": masked.sum().float(),
        }
    return agg_loss(loss_mat, mask, agg_mode), metrics


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float = 0.5, agg_mode: str = "token-mean") -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss (ARLArena §4.4); (B, T) -> (loss, fraction of tokens where the clipped term wins).
    0.5 * agg(max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2))."""
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    loss1, loss2 = (values - returns).square(), (clipped - returns).square()
    return 0.5 * agg_loss(torch.maximum(loss1, loss2), mask, agg_mode), masked_mean((loss2 > loss1).float(),
                                                                                    mask).detach()


def sequence_values(critic, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Critic values (B, T): V_t is read where response token t is predicted (the state before it)."""
    T = batch["mask"].shape[1]
    out = critic(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 position_ids=batch["position_ids"], use_cache=False).logits  # (B, P+T, 1)
    return out[:, -T - 1:-1, 0].float()


def pad_rows(arrays: list[np.ndarray], T: int) -> torch.Tensor:
    """Right-pad per-row arrays (n_b,) into a float tensor (B, T)."""
    out = torch.zeros(len(arrays), T)
    for b, a in enumerate(arrays):
        out[b, :len(a)] = torch.as_tensor(np.asarray(a, dtype=np.float32))
    return out
# END ALGO LOGIC


# ---------------------------------------------------------------------------------------------
# Rollout: rows, tokenisation, log-probs.
# ---------------------------------------------------------------------------------------------
@dataclass
class Row:
    """One turn of one episode: a training sample (prompt -> response)."""

    group: int  # task instance; the G episodes of a group share it
    episode: int  # trajectory id, unique within the batch
    turn: int  # 0-based step index in its episode
    prompt_ids: list[int]
    response_ids: list[int]
    step_reward: float  # env reward of this turn, before the format penalty
    format_penalty: float  # penalty of this turn (0 or --format-penalty)
    format_ok: bool
    action_is_valid: bool
    anchor: Any  # canonical key of the state acted on (GiGPO)
    won: bool  # the episode was won (filled when it ends)
    episode_return: float = 0.0  # sum of the episode's env rewards (filled when it ends)
    advantage: Any = 0.0  # float or (len(response_ids),) array
    old_logp: np.ndarray | None = None  # (len(response_ids),) log-probs before the update
    ref_logp: np.ndarray | None = None  # (len(response_ids),) log-probs of the reference model
    entropy: float = 0.0  # mean token entropy of the response under the old policy (EMPG)
    extra: dict[str, Any] = field(default_factory=dict)  # room for method-specific data


def encode_prompt(tokenizer, messages: list[dict[str, str]], max_tokens: int) -> tuple[list[int], bool]:
    """Chat-template token ids with the generation prompt; long prompts keep their last tokens."""
    ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"])
    return (ids[-max_tokens:], True) if len(ids) > max_tokens else (ids, False)


def task_seeds(args: Args, iteration: int, rank: int, world: int, attempt: int = 0) -> list[int]:
    """This process's share of the iteration's task seeds (deterministic in seed, iteration, attempt)."""
    rng = np.random.default_rng([args.seed, iteration, attempt])
    seeds = rng.integers(0, EVAL_SEED_OFFSET, size=args.num_groups).tolist()
    return seeds[rank::world]


def collect_rows(backend, tokenizer, rollout, seeds: list[int], args: Args, stats: dict[str, float],
                 greedy: bool = False, id_offset: int = 0) -> tuple[list[Row], list[Any]]:
    """Play every episode of ``rollout`` (a wrappers.GroupRollout) to the end, batching all active
    episodes into one generate call per turn. Returns the rows and the per-episode stats."""
    rollout.reset(seeds)
    rows: list[Row] = []
    for _ in range(args.max_turns):
        active = rollout.active()
        if not active:
            break
        encoded = [encode_prompt(tokenizer, rollout.messages(i), args.max_prompt_tokens) for i in active]
        prompts = [ids for ids, _ in encoded]
        responses = backend.generate(prompts, args.max_response_tokens, args.temperature, args.top_p, greedy)
        texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
        turns = rollout.step(dict(zip(active, texts)), max_turns=args.max_turns)
        by_episode = {i: (p, r) for i, p, r in zip(active, prompts, responses)}
        for t in turns:
            prompt_ids, response_ids = by_episode[t.episode]
            rows.append(Row(group=t.group + id_offset, episode=t.episode + id_offset, turn=t.turn,
                            prompt_ids=prompt_ids, response_ids=response_ids, step_reward=t.env_reward,
                            format_penalty=t.format_penalty, format_ok=t.format_ok,
                            action_is_valid=t.action_is_valid, anchor=t.anchor, won=False))
        stats["gen_tokens"] += sum(len(r) for r in responses)
        stats["truncated_prompts"] += sum(trunc for _, trunc in encoded)
    episodes = rollout.episodes()
    for row in rows:
        ep = episodes[row.episode - id_offset]
        row.episode_return, row.won = ep.env_return, ep.won
    return rows, episodes


def make_batch(rows: list[Row], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Left-pad prompts and right-pad responses so all responses start at the same column P.

    input_ids/attention_mask/position_ids: (B, P+T); response_ids, mask, old_logp, ref_logp,
    advantages: (B, T).
    """
    P = max(len(r.prompt_ids) for r in rows)
    T = max(max(len(r.response_ids) for r in rows), 1)
    B = len(rows)
    input_ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + T), dtype=torch.long)
    out = {k: torch.zeros((B, T)) for k in ("mask", "old_logp", "ref_logp", "advantages")}
    for b, r in enumerate(rows):
        p, n = len(r.prompt_ids), len(r.response_ids)
        input_ids[b, P - p:P] = torch.tensor(r.prompt_ids)
        input_ids[b, P:P + n] = torch.tensor(r.response_ids, dtype=torch.long)
        attn[b, P - p:P + n] = 1
        out["mask"][b, :n] = 1.0
        for key, value in (("old_logp", r.old_logp), ("ref_logp", r.ref_logp)):
            if value is not None:
                out[key][b, :n] = torch.as_tensor(value)
        out["advantages"][b, :n] = torch.as_tensor(np.broadcast_to(r.advantage, (n,)).astype(np.float32))
    out.update(input_ids=input_ids, attention_mask=attn, response_ids=input_ids[:, P:],
               position_ids=(attn.cumsum(-1) - 1).clamp(min=0))
    return {k: v.to(device) for k, v in out.items()}


def sequence_logprobs(model, batch: dict[str, torch.Tensor], temperature: float,
                      with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (B, T) of the response tokens and their entropies (B, T).

    Only the last T+1 positions go through the LM head (``logits_to_keep``), so memory is
    O(B*T*V), not O(B*(P+T)*V).
    """
    T = batch["mask"].shape[1]
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"], logits_to_keep=T + 1, use_cache=False).logits
    logits = logits[:, :-1].float() / temperature  # (B, T, V): position P-1+t predicts response token t
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, batch["response_ids"].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return logp, entropy


@torch.no_grad()
def score_rows(policy, ref_model, rows: list[Row], args: Args, pad_id: int, device, stats: dict[str, float]):
    """Fill old_logp, ref_logp and entropy of every row (before the update)."""
    start = time.perf_counter()
    for i in range(0, len(rows), args.micro_batch_size):
        chunk = rows[i:i + args.micro_batch_size]
        batch = make_batch(chunk, pad_id, device)
        logp, entropy = sequence_logprobs(policy, batch, args.temperature)
        ref_logp, _ = sequence_logprobs(ref_model, batch, args.temperature, with_entropy=False)
        for b, row in enumerate(chunk):
            n = len(row.response_ids)
            row.old_logp = logp[b, :n].float().cpu().numpy()
            row.ref_logp = ref_logp[b, :n].float().cpu().numpy()
            row.entropy = float(entropy[b, :n].mean()) if n else 0.0
    stats["time_score"] += time.perf_counter() - start


# ---------------------------------------------------------------------------------------------
# Rollout backends: same interface (generate token ids, push weights, sleep/wake).
# ---------------------------------------------------------------------------------------------
class HFBackend:
    """Batched transformers ``generate`` with KV cache on the trained model itself (no push needed)."""

    def __init__(self, model, tokenizer, batch_size: int = 256):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                 greedy: bool) -> list[list[int]]:
        from transformers import GenerationConfig

        tok, device = self.tokenizer, next(self.model.parameters()).device
        # top_k=0 disables top-k; None would inherit the model's generation_config (Qwen3: top_k=20)
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=not greedy, top_k=0,
                                  temperature=temperature if not greedy else 1.0, top_p=top_p if not greedy else 1.0,
                                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        was_training = self.model.training
        self.model.eval()
        outputs: list[list[int]] = []
        for i in range(0, len(prompts), self.batch_size):
            chunk = prompts[i:i + self.batch_size]
            L = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), L), tok.pad_token_id, dtype=torch.long)
            attn = torch.zeros((len(chunk), L), dtype=torch.long)
            for b, p in enumerate(chunk):
                ids[b, L - len(p):], attn[b, L - len(p):] = torch.tensor(p), 1
            gen = self.model.generate(input_ids=ids.to(device), attention_mask=attn.to(device),
                                      generation_config=config)[:, L:].tolist()
            for seq in gen:
                if tok.eos_token_id in seq:
                    seq = seq[:seq.index(tok.eos_token_id) + 1]
                outputs.append(seq)
        self.model.train(was_training)
        return outputs

    def push(self, model) -> dict[str, float]:
        return {}

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass


class VLLMBackend:
    """vLLM engine in the trainer's process; trained weights are pushed after every update."""

    def __init__(self, model_path: str, tokenizer, args: Args, rank: int, world: int):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine: weights pass as tensors
        from transformers import AutoConfig
        from vllm import LLM

        self.tokenizer, self.on_gpu = tokenizer, torch.cuda.is_available()
        max_len = args.max_prompt_tokens + args.max_response_tokens
        kwargs: dict[str, Any] = dict(model=model_path, seed=args.seed + rank, enable_prefix_caching=True,
                                      max_model_len=max_len)
        if world > 1:
            kwargs["distributed_executor_backend"] = "external_launcher"  # one engine per rank
        if self.on_gpu:  # the trainer's precision ('auto' would downcast a float32 checkpoint)
            dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(args.mixed_precision, "float32")
            kwargs.update(dtype=dtype, gpu_memory_utilization=args.vllm_gpu_memory_utilization, enable_sleep_mode=True)
        else:
            # vLLM's CPU defaults run a float32 checkpoint in bf16 (log-prob gaps ~1e-2) and reserve ~90% of the
            # RAM for the KV cache: compute in float32 and size the cache for every sequence of one turn at full
            # length (VLLM_CPU_KVCACHE_SPACE, in GiB, overrides the size).
            cfg = AutoConfig.from_pretrained(model_path).get_text_config()
            head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
            seqs = max(args.num_groups // world * args.group_size, args.eval_episodes // world, 1)
            kv_bytes = 2 * cfg.num_hidden_layers * kv_heads * head_dim * 4 * seqs * max_len  # K and V, float32
            kwargs.update(dtype="float32", enforce_eager=True, kv_cache_memory_bytes=kv_bytes)
        self.llm = LLM(**kwargs)

    def generate(self, prompts, max_new_tokens, temperature, top_p, greedy):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # Stop at the tokenizer's end token only, as HFBackend: ignore_eos drops the extra end tokens vLLM takes
        # from generation_config.json (e.g. Qwen3's <|endoftext|>). The stop token stays in the response.
        params = SamplingParams(n=1, max_tokens=max_new_tokens, temperature=0.0 if greedy else temperature,
                                top_p=1.0 if greedy else top_p, stop_token_ids=[self.tokenizer.eos_token_id],
                                ignore_eos=True)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def push(self, model) -> dict[str, float]:
        """Load the trained weights (``lm_head.weight`` included: tied embeddings are otherwise
        silently skipped), drop cached prefixes computed with old weights, and check a probe."""
        start = time.perf_counter()
        state = {k: v.detach() for k, v in model.state_dict().items()}
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(state.items())})
        self.llm.reset_prefix_cache()
        return {"rollout/push_time_s": time.perf_counter() - start, "rollout/push_logp_diff": self._probe(model)}

    @torch.no_grad()
    def _probe(self, model) -> float:
        """|log-prob difference| of vLLM's greedy next token against the trained model."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompt = self.tokenizer.apply_chat_template([{"role": "user", "content": "probe"}],
                                                    add_generation_prompt=True, tokenize=True,
                                                    return_dict=True)["input_ids"]
        out = self.llm.generate([TokensPrompt(prompt_token_ids=list(prompt))],
                                SamplingParams(max_tokens=1, temperature=0.0, logprobs=1), use_tqdm=False)[0]
        token = out.outputs[0].token_ids[0]
        vllm_logp = out.outputs[0].logprobs[0][token].logprob
        device = next(model.parameters()).device
        logits = model(input_ids=torch.tensor([list(prompt)], device=device)).logits[0, -1].float()
        return abs(float(torch.log_softmax(logits, -1)[token]) - vllm_logp)

    def sleep(self) -> None:
        if self.on_gpu:
            self.llm.sleep(level=1)  # frees the KV cache during the update

    def wake(self) -> None:
        if self.on_gpu:
            self.llm.wake_up()


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Helpers of main(): models, checkpoints, logging.
# ---------------------------------------------------------------------------------------------
def load_model_and_tokenizer(path: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model, tokenizer


def check_model_path(args: Args) -> str:
    """Resolve 'tiny'/'smollm2'; explain what to do when the default BC checkpoint is missing."""
    from arena_models import resolve_model_path

    if args.model_path == PROFILES["cpu-tiny"]["model_path"] and not Path(args.model_path).exists():
        raise SystemExit(f"No behaviour-cloned model at '{args.model_path}'. Create it first with\n"
                         f"    python algos/sft.py\n(or pass --model-path tiny for an untrained tiny model).")
    return resolve_model_path(args.model_path)


def latest_checkpoint(run_dir: Path) -> tuple[Path, int] | None:
    pointer = run_dir / "checkpoints" / "latest.json"
    if not pointer.exists():
        return None
    info = json.loads(pointer.read_text())
    return run_dir / "checkpoints" / info["dir"], int(info["iteration"])


def save_checkpoint(accelerator, run_dir: Path, iteration: int, keep: int = 2) -> None:
    """Model, optimizer and RNG states (accelerator.save_state) plus a pointer written last."""
    ckpt_root = run_dir / "checkpoints"
    name = f"iter_{iteration:06d}"
    accelerator.save_state(str(ckpt_root / name))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (ckpt_root / "latest.json").write_text(json.dumps({"dir": name, "iteration": iteration}))
        for old in sorted(ckpt_root.glob("iter_*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


def global_mean(accelerator, values: list[float]) -> float:
    """Mean of ``values`` pooled over all processes (nan if there are none)."""
    t = torch.tensor([float(np.sum(values)) if values else 0.0, float(len(values))], device=accelerator.device)
    total, count = accelerator.reduce(t, reduction="sum").tolist()
    return total / count if count else float("nan")


def global_sum(accelerator, value: float) -> float:
    """Sum of one number over all processes."""
    return accelerator.reduce(torch.tensor(float(value), device=accelerator.device), reduction="sum").item()


def param_sync_error(accelerator, model) -> float:
    """Max |difference| of per-tensor parameter checksums between ranks (0 = in sync)."""
    sums = torch.stack([p.detach().float().sum() for p in model.parameters()])
    gathered = accelerator.gather(sums.unsqueeze(0))  # (world, n_params)
    return float((gathered - gathered[0]).abs().max())


class MetricsLogger:
    """Writes one JSON line per iteration and the same scalars to TensorBoard (and W&B)."""

    def __init__(self, run_dir: Path, args: Args, start_iteration: int):
        from torch.utils.tensorboard import SummaryWriter

        self.path = run_dir / "metrics.jsonl"
        if self.path.exists():  # a resumed run drops lines logged after its checkpoint
            lines = [ln for ln in self.path.read_text().splitlines()
                     if ln.strip() and json.loads(ln)["iteration"] < start_iteration]
            self.path.write_text("".join(ln + "\n" for ln in lines))
        self.writer = SummaryWriter(str(run_dir / "tb"), purge_step=start_iteration)
        self.wandb = None
        if args.track:
            import wandb

            self.wandb = wandb.init(project=args.wandb_project, name=args.run_name, config=asdict(args),
                                    resume="allow")

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"iteration": iteration, **metrics}) + "\n")
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, iteration)
        if self.wandb is not None:
            self.wandb.log(metrics, step=iteration)

    def close(self) -> None:
        self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def evaluate(backend, tokenizer, rollout, args: Args, iteration: int, rank: int, world: int, accelerator) -> float:
    """Greedy success rate on held-out task seeds (>= EVAL_SEED_OFFSET)."""
    seeds = [EVAL_SEED_OFFSET + k for k in range(args.eval_episodes)][rank::world]
    _, episodes = collect_rows(backend, tokenizer, rollout, seeds, args, defaultdict(float), greedy=True)
    return global_mean(accelerator, [float(e.won) for e in episodes])


def main(args: Args) -> None:
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm
    from transformers.utils import logging as hf_logging

    import wrappers

    args = resolve_args(args)
    torch.set_num_threads(args.torch_threads)  # before any vLLM engine: later calls are no-ops
    hf_logging.disable_progress_bar()
    model_path = check_model_path(args)
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision=args.mixed_precision)
    rank, world, device = accelerator.process_index, accelerator.num_processes, accelerator.device
    if args.num_groups % world or args.eval_episodes % world:
        raise SystemExit(f"--num-groups and --eval-episodes must be multiples of the {world} processes")
    set_seed(args.seed + rank)
    run_dir = Path(args.output_dir) / args.run_name
    run_dir.mkdir(parents=True, exist_ok=True)

    dtype = torch.bfloat16 if args.mixed_precision == "bf16" and torch.cuda.is_available() else torch.float32
    policy, tokenizer = load_model_and_tokenizer(model_path, torch.float32)
    ref_model, _ = load_model_and_tokenizer(model_path, dtype)
    ref_model.requires_grad_(False).eval().to(device)
    if args.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    # ALGO LOGIC: extra models and optimizers (the critic)
    from transformers import AutoModelForTokenClassification

    # critic = policy checkpoint + a zero-initialised scalar head per token (V = 0 at the start)
    critic = AutoModelForTokenClassification.from_pretrained(model_path, num_labels=1, dtype=torch.float32)
    critic.config.pad_token_id = tokenizer.pad_token_id
    for p in critic.score.parameters():
        torch.nn.init.zeros_(p)
    if args.gradient_checkpointing:
        critic.gradient_checkpointing_enable()
    critic_lr = args.critic_lr if args.critic_lr is not None else 10 * args.learning_rate
    optimizer.add_param_group({"params": list(critic.parameters()), "lr": critic_lr})
    critic_grad_norms: list[float] = []

    def clip_critic_grad(*_) -> None:  # the loop clips the policy's gradient; the critic's is clipped here
        critic_grad_norms.append(float(torch.nn.utils.clip_grad_norm_(critic.parameters(), args.max_grad_norm)))

    optimizer.register_step_pre_hook(clip_critic_grad)
    critic = accelerator.prepare(critic)
    # END ALGO LOGIC
    policy, optimizer = accelerator.prepare(policy, optimizer)

    backend_name = args.rollout_backend
    if backend_name == "auto":
        backend_name = "vllm" if torch.cuda.is_available() and vllm_available() else "hf"
    if backend_name == "vllm":
        backend = VLLMBackend(model_path, tokenizer, args, rank, world)
    else:
        backend = HFBackend(accelerator.unwrap_model(policy), tokenizer)

    start_iteration = 1
    if args.resume and (ckpt := latest_checkpoint(run_dir)) is not None:
        accelerator.load_state(str(ckpt[0]))
        start_iteration = ckpt[1] + 1
        accelerator.print(f"resumed from {ckpt[0]} (iteration {ckpt[1]})")
    push_metrics = backend.push(accelerator.unwrap_model(policy))
    logger = MetricsLogger(run_dir, args, start_iteration) if accelerator.is_main_process else None
    if accelerator.is_main_process:
        (run_dir / "args.json").write_text(json.dumps({**asdict(args), "world_size": world}, indent=1))

    def make_env():
        return wrappers.make_env(args.env_id, history_length=args.history_length, format_penalty=args.format_penalty,
                                 prompt_style=args.prompt_style)

    train_rollout = wrappers.GroupRollout(make_env, args.num_groups // world, args.group_size)
    eval_rollout = wrappers.GroupRollout(make_env, max(args.eval_episodes // world, 1), 1)
    pad_id = tokenizer.pad_token_id

    for iteration in tqdm(range(start_iteration, args.num_iterations + 1), disable=not accelerator.is_main_process,
                          initial=start_iteration - 1, total=args.num_iterations, desc=args.exp_name):
        # ---- rollout -------------------------------------------------------------------------
        t_rollout = time.perf_counter()
        stats: dict[str, float] = defaultdict(float)
        policy.eval()
        # ALGO LOGIC: collect a batch of rows and compute their advantages
        rows, episodes = collect_rows(backend, tokenizer, train_rollout, task_seeds(args, iteration, rank, world),
                                      args, stats)
        score_rows(policy, ref_model, rows, args, pad_id, device, stats)
        with torch.no_grad():
            for i in range(0, len(rows), args.micro_batch_size):
                chunk = rows[i:i + args.micro_batch_size]
                values = sequence_values(critic, make_batch(chunk, pad_id, device))
                for b, row in enumerate(chunk):
                    row.extra["values"] = values[b, :len(row.response_ids)].cpu().numpy()
        T = max(len(r.response_ids) for r in rows)
        mask = pad_rows([np.ones(len(r.response_ids)) for r in rows], T)  # (N, T)
        rewards = torch.zeros_like(mask)  # the row's score on its last token
        last = mask.sum(-1).long() - 1
        rewards[torch.arange(len(rows)), last] = torch.tensor([r.episode_return - r.format_penalty for r in rows])
        if args.kl_in_reward:
            rewards -= args.kl_coef * kl_penalty(pad_rows([r.old_logp for r in rows], T),
                                                 pad_rows([r.ref_logp for r in rows], T), args.kl_estimator) * mask
        advantages, returns = gae(rewards, pad_rows([r.extra["values"] for r in rows], T), mask, args.gamma,
                                  args.lam)
        advantages = masked_whiten(advantages, mask,
                                   lambda t: accelerator.reduce(t.to(device), reduction="sum").cpu())
        for b, row in enumerate(rows):
            row.advantage = advantages[b, :len(row.response_ids)].numpy()
            row.extra["returns"] = returns[b, :len(row.response_ids)].numpy()
        # END ALGO LOGIC
        t_rollout = time.perf_counter() - t_rollout

        # ---- update --------------------------------------------------------------------------
        t_update = time.perf_counter()
        backend.sleep()
        policy.train()
        # same number of optimizer steps on every process, or DDP's all-reduce would hang
        n_rows = accelerator.gather(torch.tensor([len(rows)], device=device)).max().item()
        n_minibatches = max(1, math.ceil(n_rows / args.mini_batch_size))
        shuffle = torch.Generator().manual_seed(args.seed * 1_000_003 + iteration * 101 + rank)
        sums: dict[str, list[float]] = defaultdict(list)
        grad_norms, skipped, update_tokens = [], 0, 0
        for _epoch in range(args.update_epochs):
            order = torch.randperm(len(rows), generator=shuffle).tolist()
            for mb_index in np.array_split(np.array(order, dtype=np.int64), n_minibatches):
                weight = 1.0 if len(mb_index) else 0.0  # an empty share still joins the all-reduce
                mb_rows = [rows[j] for j in mb_index] or rows[:1]
                micro_batches = [mb_rows[k:k + args.micro_batch_size]
                                 for k in range(0, len(mb_rows), args.micro_batch_size)]
                optimizer.zero_grad(set_to_none=True)
                non_finite = 0.0
                for k, micro_rows in enumerate(micro_batches):
                    batch = make_batch(micro_rows, pad_id, device)
                    sync = contextlib.nullcontext() if k == len(micro_batches) - 1 else accelerator.no_sync(policy)
                    with sync, accelerator.autocast():
                        logp, entropy = sequence_logprobs(policy, batch, args.temperature)
                        mask = batch["mask"]
                        # ALGO LOGIC: loss of one micro-batch (defines `loss` and `metrics`)
                        pg_loss, metrics = policy_loss(
                            logp, batch["old_logp"], batch["advantages"], mask, clip_low=args.clip_ratio_low,
                            clip_high=args.clip_ratio_high, clip_c=args.clip_ratio_c, agg_mode=args.loss_agg_mode,
                            seq_mask_delta=args.seq_mask_delta if args.use_seq_mask else None)
                        kl_ref = agg_loss(kl_penalty(logp, batch["ref_logp"], args.kl_estimator), mask,
                                          args.loss_agg_mode)
                        entropy_bonus = agg_loss(entropy, mask, args.loss_agg_mode)
                        values = sequence_values(critic, batch)
                        vf_loss, vf_clipfrac = value_loss(
                            values, pad_rows([r.extra["values"] for r in micro_rows], mask.shape[1]).to(device),
                            pad_rows([r.extra["returns"] for r in micro_rows], mask.shape[1]).to(device), mask,
                            clip=args.value_clip, agg_mode=args.loss_agg_mode)
                        kl_weight = 0.0 if args.kl_in_reward else args.kl_coef  # in-reward KL is in the returns
                        loss = pg_loss + kl_weight * kl_ref - args.entropy_coef * entropy_bonus + vf_loss
                        metrics.update(pg_loss=pg_loss.detach(), kl_ref=kl_ref.detach(),
                                       entropy=entropy_bonus.detach(), value_loss=vf_loss.detach(),
                                       value_clipfrac=vf_clipfrac, value_mean=masked_mean(values.detach(), mask))
                        # END ALGO LOGIC
                        accelerator.backward(loss * weight * len(micro_rows) / len(mb_rows))
                    non_finite += float(not torch.isfinite(loss).item())
                    update_tokens += int(batch["attention_mask"].sum())
                    for key, value in metrics.items():
                        sums[key].append(float(value))
                grad_norm = float(accelerator.clip_grad_norm_(policy.parameters(), args.max_grad_norm))
                non_finite = accelerator.reduce(torch.tensor(non_finite, device=device), reduction="sum").item()
                if non_finite > 0 or not math.isfinite(grad_norm):
                    optimizer.zero_grad(set_to_none=True)  # skip: a bad batch must not poison the weights
                    skipped += 1
                else:
                    optimizer.step()
                    grad_norms.append(grad_norm)
        policy.eval()
        backend.wake()
        push_metrics = backend.push(accelerator.unwrap_model(policy))
        t_update = time.perf_counter() - t_update

        # ---- log, evaluate, checkpoint -------------------------------------------------------
        metrics_out = {
            "rollout/success_rate": global_mean(accelerator, [float(e.won) for e in episodes]),
            "rollout/episode_return": global_mean(accelerator, [e.env_return for e in episodes]),
            "rollout/episode_length": global_mean(accelerator, [float(e.length) for e in episodes]),
            "rollout/valid_format_ratio": global_mean(accelerator, [float(r.format_ok) for r in rows]),
            "rollout/valid_action_ratio": global_mean(accelerator, [float(r.action_is_valid) for r in rows]),
            "rollout/response_length": global_mean(accelerator, [float(len(r.response_ids)) for r in rows]),
            "rollout/num_rows": global_sum(accelerator, len(rows)),
            "rollout/truncated_prompts": global_sum(accelerator, stats["truncated_prompts"]),
            "rollout/advantage_abs": global_mean(accelerator, [float(np.mean(np.abs(r.advantage))) for r in rows]),
        }
        for key, values in sums.items():
            metrics_out[f"actor/{key}"] = (global_sum(accelerator, sum(values)) if key in COUNT_METRICS
                                           else global_mean(accelerator, values))
        metrics_out["actor/grad_norm"] = global_mean(accelerator, grad_norms)
        metrics_out["actor/skipped_updates"] = float(skipped)
        metrics_out.update(push_metrics)
        gen_time = max(t_rollout - stats["time_score"], 1e-9)
        metrics_out.update({
            "perf/rollout_tokens_per_s": global_sum(accelerator, stats["gen_tokens"]) / gen_time,
            "perf/update_tokens_per_s": global_sum(accelerator, update_tokens) / max(t_update, 1e-9),
            "perf/time_rollout_s": t_rollout,
            "perf/time_update_s": t_update,
            "perf/time_score_s": stats["time_score"],
        })
        # ALGO LOGIC: method-specific metrics into metrics_out (none for GRPO)
        metrics_out["actor/critic_grad_norm"] = global_mean(accelerator, critic_grad_norms)
        critic_grad_norms.clear()
        # END ALGO LOGIC
        if args.eval_every > 0 and (iteration % args.eval_every == 0 or iteration == args.num_iterations):
            metrics_out["eval/success_rate"] = evaluate(backend, tokenizer, eval_rollout, args, iteration, rank,
                                                        world, accelerator)
        if logger is not None:
            logger.log(iteration, metrics_out)
        if (args.checkpoint_every > 0 and iteration % args.checkpoint_every == 0) or iteration == args.num_iterations:
            save_checkpoint(accelerator, run_dir, iteration)

    # ---- final model (a normal HF folder) and a cross-rank consistency check -----------------
    sync_error = param_sync_error(accelerator, policy)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        final = run_dir / "final"
        accelerator.unwrap_model(policy).save_pretrained(final, state_dict=accelerator.get_state_dict(policy))
        tokenizer.save_pretrained(final)
        (run_dir / "summary.json").write_text(json.dumps(
            {"world_size": world, "param_sync_error": sync_error, "final_model": str(final)}, indent=1))
        logger.close()
        accelerator.print(f"done: metrics in {run_dir / 'metrics.jsonl'}, model in {final}")
    accelerator.end_training()


if __name__ == "__main__":
    main(tyro.cli(Args))
