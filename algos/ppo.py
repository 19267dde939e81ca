# ALGO LOGIC: module docstring (what this method is and how it differs from grpo.py)
"""PPO for multi-turn LLM agents — a copy of grpo.py with a token-level critic and GAE.

Method (Schulman et al., PPO arXiv 1707.06347, GAE arXiv 1506.02438; ARLArena §4.4; the "biased"
PPO baseline of the Practitioner's Guide, arXiv 2510.01132): the critic is a separate copy of the
policy checkpoint with a zero-initialised scalar head per token (``AutoModelForTokenClassification``),
its own AdamW parameter group (``--critic-lr``, default 10x the policy's) and its own gradient
clipping. Each row (one turn) is a GAE segment: the row's score (episode env return minus its format
penalty; its return-to-go with ``--reward-density dense``) sits on its last response token, V = 0 after it, and
A_t = delta_t + gamma * lam * A_{t+1} runs over the response tokens. With ``--row-layout trajectory`` a row is
the whole episode: each turn's reward sits on the turn's last token (dense; sparse: the episode's score on the
last) and GAE runs over the policy tokens of the concatenated trajectory, skipping the env's tokens (mask 0).
Advantages are whitened over the whole batch (all processes). The value loss is clipped
(``--value-clip`` 0.5). The KL to the reference goes into the loss (default, ARLArena's recipe) or,
with ``--kl-in-reward``, into the token rewards (PPO style). Policy loss is grpo.py's clipped
surrogate.

Differs from grpo.py only inside ``# ALGO LOGIC`` blocks: ``diff algos/grpo.py algos/ppo.py``.

    python algos/sft.py && python algos/ppo.py                    # CPU demo, tiny model, minutes
    accelerate launch algos/ppo.py --profile gpu --model-path <BC checkpoint of Qwen3-4B>
"""
# END ALGO LOGIC

from __future__ import annotations

import functools
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

import wrappers
from arena_train import cli
from arena_train.batching import first_minibatch, score_rows, sequence_logprobs, update_orders
from arena_train.cli import EngineArgs, EvalArgs, RunArgs, flat_args, parse_args
from arena_train.losses import agg_loss, kl_penalty, masked_mean
from arena_train.mixture import Mixture
from arena_train.models import BC_CHECKPOINT, load_policy_and_reference
from arena_train.monitor import CollapseConfig
from arena_train.rollout import RolloutConfig
from arena_train.run import Run
from arena_train.sharding import prepare_reference
from arena_train.update import Update

# isort: split
# ALGO LOGIC: imports (the method's own modules: every import of the script sits at its top)
from transformers import AutoModelForTokenClassification

from arena_train.batching import full_inputs, make_batch, score_all
from arena_train.dist import global_mean
from arena_train.rewards import token_rewards
from arena_train.trajectory import loss_masks

# END ALGO LOGIC

#: ``--profile gpu``: ARLArena's shared recipe (§1.3; BC'd Qwen3-4B, 16 groups x 8, lr 1e-6, mini-batch 256, bf16,
#: vLLM); --max-turns and --max-prompt-tokens come from the env's registration (``arena_envs.env_recipe``: ALFWorld
#: 50 turns, WebShop 15 turns and 4,096 prompt tokens). Fields not listed keep the CPU default declared in ``Args``
#: and its groups (``arena_train.cli``); flags given on the command line always win.
GPU_PROFILE: dict[str, Any] = {
    "env_id": ["ARL/Sokoban-v0"], "model_path": "Qwen/Qwen3-4B", "num_iterations": 200, "num_groups": 16,
    "history_length": 2, "prompt_style": "arlarena", "max_response_tokens": 512, "learning_rate": 1e-6,
    "mini_batch_size": 256, "micro_batch_size": 8, "rollout_backend": "auto", "mixed_precision": "bf16",
    "gradient_checkpointing": True, "eval_episodes": 128}


@dataclass
class Args:
    """Defaults: the cpu-tiny profile (minutes on a laptop, the mini-arena's RL setting); --profile gpu: ARLArena's
    recipe (GPU_PROFILE). Flags given on the command line win over both."""

    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (the script name)"""
    profile: Literal["cpu-tiny", "gpu"] = "cpu-tiny"
    """cpu-tiny = the defaults below; gpu = ARLArena's recipe (GPU_PROFILE); explicit flags win over both"""
    env_id: list[str] = field(default_factory=lambda: ["ARL/Sokoban-Mini-v0"])
    """registered ARLArena env id; several ids train on a mixture (docs/runs.md): groups drawn by --env-weights"""
    env_weights: list[float] | None = None
    """sampling weight of each --env-id (default: equal); 0 = evaluated, never trained on"""
    model_path: str = BC_CHECKPOINT
    """HF hub id or local folder ('tiny', 'smollm2' = offline models from arena_models); default: algos/sft.py's"""
    seed: int = 1
    """seed of everything (tasks, sampling, init)"""
    num_iterations: int = 100
    """number of rollout + update iterations (100: the length in which every method of the paper's comparison
    gained on the mini-arena's BC starts, docs/mini_arena.md; GRPO 194-223, SAMPO 235-267 CPU seconds on one
    thread from algos/sft.py's default start, docs/algorithms.md)"""
    num_groups: int = 8
    """task instances (groups) per iteration, over all processes"""
    group_size: int = 8
    """episodes per group G (same task seed)"""
    max_turns: int = 10
    """turn budget per episode"""
    history_length: int = 0
    """past (observation, action) pairs shown in the prompt"""
    row_layout: Literal["step", "trajectory"] = "step"
    """a row per turn (ARLArena) or per episode: the interleaved trajectory, env tokens masked from the loss"""
    prompt_style: str = "compact"
    """prompt template of the wrappers: 'arlarena' (the paper's layout), 'full' or 'compact' (tiny models)"""
    max_prompt_tokens: int = 512
    """longer prompts drop their oldest history pairs first (never the instructions or the task)"""
    max_response_tokens: int = 12
    """new tokens generated per turn (12: algos/sft.py's default responses, a plan of up to 4 moves, are 5-9)"""
    temperature: float = 1.0
    """sampling temperature of training rollouts (log-probs use the same temperature); 1.0 explores past the BC
    teacher's mistakes: it gained faster than 0.5 from the same start (docs/mini_arena.md, what was tried)"""
    top_p: float = 1.0
    """nucleus sampling of training rollouts"""
    format_penalty: float = 0.1
    """subtracted from a row's score when its format or action is invalid"""
    learning_rate: float = 1e-4
    """AdamW learning rate (constant)"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradient clipping threshold (total norm)"""
    mini_batch_size: int = 128
    """rows per optimizer step (per process)"""
    update_epochs: int = 1
    """passes over each rollout batch"""
    kl_coef: float = 0.01
    """coefficient of the KL-to-reference loss (0 = logged only)"""
    kl_estimator: Literal["k1", "k2", "k3", "k1+", "k3+"] = "k3"
    """KL estimator (k3 = low_var_kl; '+' = straight-through with k2 gradient)"""
    entropy_coef: float = 0.001
    """coefficient of the entropy bonus"""
    run: RunArgs = field(default_factory=RunArgs)
    """run folder, resume, logging"""
    engine: EngineArgs = field(default_factory=EngineArgs)
    """rollout engine, precision, memory, env workers"""
    eval: EvalArgs = field(default_factory=EvalArgs)
    """held-out evaluation"""
    collapse: CollapseConfig = field(default_factory=CollapseConfig)
    """the in-run collapse alarm (arena_train.monitor, docs/evaluation.md "The in-run alarm")"""
    # ALGO LOGIC: algorithm hyper-parameters
    num_iterations: int = 60
    """(replaces the shared default of 100) the critic's forward and backward make a PPO iteration about twice
    GRPO's: 100 iterations took 458 CPU seconds on one thread from algos/sft.py's default start (GRPO 216); 60 is
    the longest run that keeps within 5 minutes (docs/algorithms.md)"""
    reward_density: Literal["sparse", "dense"] = "sparse"
    """score of a turn: its episode's env return, or its return-to-go (arena_train.rewards)"""
    clip_ratio_low: float = 0.2
    """PPO clip epsilon below 1"""
    clip_ratio_high: float = 0.2
    """PPO clip epsilon above 1"""
    clip_ratio_c: float = 3.0
    """dual-clip bound c (> 1) on the ratio for negative advantages"""
    loss_agg_mode: cli.LossAgg = "token-mean"
    """loss aggregation (seq-mean-token-mean = GRPO_ST)"""
    use_seq_mask: cli.SeqMask = False
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
                seq_mask_delta: float | None = None, counts: dict[str, float] | None = None,
                is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
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
    if is_weights is not None:  # rollout/trainer importance weights (detached)
        loss_mat = loss_mat * is_weights
    return agg_loss(loss_mat, mask, agg_mode, counts), metrics


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float = 0.5, agg_mode: str = "token-mean",
               counts: dict[str, float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss (ARLArena §4.4); (B, T) -> (loss, fraction of tokens where the clipped term wins).
    0.5 * agg(max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2))."""
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    loss1, loss2 = (values - returns).square(), (clipped - returns).square()
    return 0.5 * agg_loss(torch.maximum(loss1, loss2), mask, agg_mode, counts), masked_mean((loss2 > loss1).float(),
                                                                                    mask).detach()


def sequence_values(critic, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Critic values (B, T): V_t is read where response token t is predicted (the state before it)."""
    T = batch["mask"].shape[1]
    out = critic(**full_inputs(batch), use_cache=False).logits  # (B, L+P+T, 1): whole rows, no shared prefixes
    return out[:, -T - 1:-1, 0].float()


def pad_rows(arrays: list[np.ndarray], T: int) -> torch.Tensor:
    """Right-pad per-row arrays (n_b,) into a float tensor (B, T)."""
    out = torch.zeros(len(arrays), T)
    for b, a in enumerate(arrays):
        out[b, :len(a)] = torch.as_tensor(np.asarray(a, dtype=np.float32))
    return out
# END ALGO LOGIC


def main(args: Args) -> None:
    # threads, seeds, accelerator, run folder (--resume, --overwrite); --dry-run exits here
    run = Run.start(
        args.run, args.engine, args.eval, Mixture.parse(args.env_id, args.env_weights),
        exp_name=args.exp_name, seed=args.seed, model_path=args.model_path, num_groups=args.num_groups,
        max_prompt_tokens=args.max_prompt_tokens, max_response_tokens=args.max_response_tokens)
    accelerator, rank, world, mixture = run.accelerator, run.rank, run.world, run.mixture
    device = accelerator.device
    policy, ref_model, tokenizer = load_policy_and_reference(
        run.model_path, run.dtype, lora_rank=args.engine.lora_rank,
        gradient_checkpointing=args.engine.gradient_checkpointing)
    optimizer = torch.optim.AdamW(
        policy.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    # ALGO LOGIC: extra models and optimizers (the critic; defines `extra_models`)
    if accelerator.distributed_type.name in ("FSDP", "DEEPSPEED"):  # the critic joins the policy's optimizer
        raise SystemExit("ppo.py's critic is not sharded: run ppo.py with algos/configs/ddp.yaml (or one process)")
    # critic = policy checkpoint + a zero-initialised scalar head per token (V = 0 at the start)
    critic = AutoModelForTokenClassification.from_pretrained(run.model_path, num_labels=1, dtype=torch.float32)
    critic.config.pad_token_id = tokenizer.pad_token_id
    for p in critic.score.parameters():
        torch.nn.init.zeros_(p)
    if args.engine.gradient_checkpointing:
        critic.gradient_checkpointing_enable()
    critic_lr = args.critic_lr if args.critic_lr is not None else 10 * args.learning_rate
    optimizer.add_param_group({"params": list(critic.parameters()), "lr": critic_lr})
    critic_grad_norms: list[float] = []
    critic = accelerator.prepare(critic)
    extra_models = [critic]
    # END ALGO LOGIC
    policy, optimizer = accelerator.prepare(policy, optimizer)
    ref_model = prepare_reference(accelerator, ref_model, policy)  # sharded like the policy; LoRA: the base
    backend = run.rollout_backend(
        policy, tokenizer, max_model_len=args.max_prompt_tokens + args.max_response_tokens,
        max_num_seqs=max(args.num_groups // world * args.group_size, args.eval.eval_episodes // world))
    # the alarm, checkpoint 0 or the resumed one, the logger
    run.resume(args.collapse, optimizer, flat_args(args))
    push_metrics = backend.push(accelerator.unwrap_model(policy))
    # the one source of the training temperature: rollouts sample with it, log-probs are taken at it
    sampling = RolloutConfig(
        max_turns=args.max_turns, max_prompt_tokens=args.max_prompt_tokens,
        max_response_tokens=args.max_response_tokens, temperature=args.temperature, top_p=args.top_p,
        row_layout=args.row_layout)
    make_env = functools.partial(  # pickles: env workers build their envs with it
        wrappers.make_env, history_length=args.history_length, format_penalty=args.format_penalty,
        prompt_style=args.prompt_style)
    rollouts = run.rollouts(make_env, args.num_groups, args.group_size, tokenizer, sampling)
    pad_id = tokenizer.pad_token_id
    row_turns = args.max_turns if args.row_layout == "trajectory" else 1
    update = Update(  # Dr.GRPO's constant length max_len: the most policy tokens a row can hold
        accelerator, args.engine, pad_id=pad_id, max_len=args.max_response_tokens * row_turns,
        other_engine=not backend.score_rollouts, env_names=mixture.names)

    for iteration in run.iterations(args.num_iterations):
        # ---- rollout: rows of whole episodes, their old and reference log-probs, advantages ----
        t_rollout = time.perf_counter()
        stats: dict[str, float] = defaultdict(float)
        policy.eval()
        # ALGO LOGIC: collect a batch of rows (defines `rows` and `episodes`)
        seeds = mixture.task_seeds(args.seed, iteration, args.num_groups, rank, world)
        rows, episodes = rollouts.collect(backend, tokenizer, seeds, sampling, stats)
        # END ALGO LOGIC
        # as many optimizer steps on every process; one row order per epoch
        n_minibatches, orders = update_orders(
            accelerator, len(rows), args.mini_batch_size, args.update_epochs,
            seed=args.seed * 1_000_003 + iteration * 101 + rank)
        # the first mini-batch's forward comes before any optimizer step: it gives its rows' old log-probs
        score_rows(
            policy, ref_model, rows, micro_batch_size=args.engine.micro_batch_size,
            micro_batch_tokens=args.engine.micro_batch_tokens, temperature=sampling.temperature,
            pad_id=pad_id, device=device, stats=stats, skip_policy=first_minibatch(orders, n_minibatches),
            use_rollout_logp=args.engine.rollout_is == "none" and backend.score_rollouts)
        # ALGO LOGIC: scores and advantages of the rows (into `row.advantage`)
        with torch.no_grad():
            for i in range(0, len(rows), args.engine.micro_batch_size):
                chunk = rows[i:i + args.engine.micro_batch_size]
                values = sequence_values(critic, make_batch(chunk, pad_id, device))
                for b, row in enumerate(chunk):
                    row.extra["values"] = values[b, :len(row.response_ids)].cpu().numpy()
        T = max(len(r.response_ids) for r in rows)
        mask = pad_rows(loss_masks(rows), T)  # (N, T); 0 on a trajectory row's env tokens
        rewards = pad_rows(token_rewards(rows, args.reward_density), T)  # scores on turns' last tokens
        if args.kl_in_reward:  # needs every row's old log-probs now, the first mini-batch's rows included
            score_all(rows)
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

        # ---- update: one optimizer step per mini-batch, gradients summed over its micro-batches ----
        t_update = time.perf_counter()
        backend.sleep()
        policy.train()
        for mb in update.minibatches(rows, orders, n_minibatches):
            # ALGO LOGIC: the policy loss's normaliser `pg_counts` (GRPO_SM: rows masked, found by a no-grad pass)
            pg_counts = mb.counts
            if args.use_seq_mask:
                dropped: set[int] = set()
                with torch.no_grad(), accelerator.autocast():
                    for micro in mb:
                        logp, _ = sequence_logprobs(
                            policy, micro.batch, sampling.temperature, with_entropy=False)
                        micro.fill_old_logp(logp)
                        batch = micro.batch
                        masked = seq_mask(logp, batch["old_logp"], batch["advantages"], batch["mask"],
                                          args.seq_mask_delta)
                        dropped.update(id(r) for r, m in zip(micro.rows, masked.tolist()) if m)
                pg_counts = mb.loss_counts(dropped)
            # END ALGO LOGIC
            optimizer.zero_grad(set_to_none=True)
            for micro in mb:  # as many passes on every process (padding passes weigh 0)
                batch, counts = micro.batch, mb.counts
                with micro.sync([policy, *extra_models]), accelerator.autocast():
                    logp, entropy = sequence_logprobs(policy, batch, sampling.temperature)
                    micro.fill_old_logp(logp)  # the first mini-batch's rows (not scored)
                    mask = batch["mask"]
                    is_weights = mb.rollout_weights(micro)  # rollout/trainer correction (None: off)
                    # ALGO LOGIC: loss of one micro-batch (defines `loss` and `metrics`)
                    pg_loss, metrics = policy_loss(
                        logp, batch["old_logp"], batch["advantages"], mask,
                        clip_low=args.clip_ratio_low, clip_high=args.clip_ratio_high,
                        clip_c=args.clip_ratio_c, agg_mode=args.loss_agg_mode, counts=pg_counts,
                        seq_mask_delta=args.seq_mask_delta if args.use_seq_mask else None,
                        is_weights=is_weights)
                    update.clip = (args.clip_ratio_low, args.clip_ratio_high)  # env/*/ratio_out_frac
                    kl_ref = agg_loss(
                        kl_penalty(logp, batch["ref_logp"], args.kl_estimator), mask, args.loss_agg_mode, counts)
                    entropy_bonus = agg_loss(entropy, mask, args.loss_agg_mode, counts)
                    values = sequence_values(critic, batch)
                    vf_loss, vf_clipfrac = value_loss(
                        values, pad_rows([r.extra["values"] for r in micro.batch_rows], mask.shape[1]).to(device),
                        pad_rows([r.extra["returns"] for r in micro.batch_rows], mask.shape[1]).to(device), mask,
                        clip=args.value_clip, agg_mode=args.loss_agg_mode, counts=counts)
                    kl_weight = 0.0 if args.kl_in_reward else args.kl_coef  # in-reward KL is in the returns
                    loss = pg_loss + kl_weight * kl_ref - args.entropy_coef * entropy_bonus + vf_loss
                    metrics.update(
                        pg_loss=pg_loss.detach(), kl_ref=kl_ref.detach(), entropy=entropy_bonus.detach(),
                        value_loss=vf_loss.detach(),
                                   value_clipfrac=vf_clipfrac, value_mean=masked_mean(values.detach(), mask))
                    # END ALGO LOGIC
                    accelerator.backward(loss * micro.weight)  # the losses are shares of the global sum
                mb.record(micro, loss, metrics, logp)
            grad_norm = float(accelerator.clip_grad_norm_(policy.parameters(), args.max_grad_norm))
            if mb.step_ok(grad_norm):  # every process's loss and the gradient norm are finite
                # ALGO LOGIC: before the step: the extra models' gradients (the critic's, clipped apart)
                critic_norm = torch.nn.utils.clip_grad_norm_(critic.parameters(), args.max_grad_norm)
                critic_grad_norms.append(float(critic_norm))  # logged as actor/critic_grad_norm
                # END ALGO LOGIC
                optimizer.step()
            else:
                optimizer.zero_grad(set_to_none=True)  # skip: a bad batch must not poison the weights
        policy.eval()
        backend.wake()
        push_metrics = backend.push(accelerator.unwrap_model(policy))  # the new weights to the rollouts
        t_update = time.perf_counter() - t_update

        # ---- metrics, evaluation, alarm and log, checkpoint ----
        metrics_out = update.iteration_metrics(
            episodes=episodes, stats=stats, t_rollout=t_rollout, t_update=t_update, push=push_metrics)
        # ALGO LOGIC: method-specific metrics into metrics_out (none for GRPO)
        metrics_out["actor/critic_grad_norm"] = global_mean(accelerator, critic_grad_norms)
        critic_grad_norms.clear()
        # END ALGO LOGIC
        if run.eval_due(iteration):  # held-out episodes, sampled as --eval-* say (arena_train.run)
            metrics_out.update(run.evaluate())
        action = run.log(iteration, metrics_out)  # the alarm, the logger, the env-failure streak
        if action == "stop":  # the alarm or failing envs end the run on its last healthy checkpoint
            break
        if action == "rollback":  # the last healthy checkpoint is back, saved as this iteration's
            push_metrics = backend.push(accelerator.unwrap_model(policy))
            continue
        run.checkpoint(iteration)

    run.finish(policy, tokenizer, backend, rollouts)  # final model, consistency check, summary


if __name__ == "__main__":
    main(parse_args(Args, GPU_PROFILE))
