# ALGO LOGIC: module docstring (what this method is and how it differs from grpo.py)
"""GRPO for multi-turn LLM agents — the ARLArena reference script (CleanRL style, one file).

Method (ARLArena §4.1 + §3.2): every turn of every episode is one training row; G episodes of
the same task form a group; a row's score is its episode's env return minus the row's format
penalty; advantages are group-normalised scores, pooled over all rows of the group by default
("cross-step"; ``--advantage-mode vanilla`` pools per-episode means instead); the policy loss is
PPO's clipped surrogate with dual clip, aggregated by ``--loss-agg-mode`` (``seq-mean-token-mean``
gives GRPO_ST), optionally with sequence masking (``--use-seq-mask``, GRPO_SM); plus a k3 KL to the
frozen reference model and an entropy bonus. ``--reward-density dense`` scores a turn with its return-to-go
instead (``arena_train.rewards``); ``--row-layout trajectory`` makes a row of each whole episode, every turn's
tokens carrying that turn's advantage (``arena_train.trajectory``).

Other algos/*.py files are copies of this one that differ only inside ``# ALGO LOGIC`` blocks; what is not
the algorithm (backends, model loading, rows, batching, checkpoints, reductions, logging) is ``arena_train``.

    python algos/sft.py && python algos/grpo.py                   # CPU demo, tiny model, minutes
    accelerate launch algos/grpo.py --profile gpu --model-path <BC checkpoint of Qwen3-4B>
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
from arena_train.rewards import segment_scores, spread_advantages

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
    advantage_mode: Literal["cross-step", "vanilla"] = "cross-step"
    """group statistics over all rows of the group (ARLArena) or over per-episode means"""
    norm_adv_by_std: bool = True
    """divide by the group std (False = Dr.GRPO mean-centring)"""
    # END ALGO LOGIC


# ALGO LOGIC: advantage estimator
def compute_advantages(scores: np.ndarray, group_ids: np.ndarray, episode_ids: np.ndarray,
                       cross_steps: bool = True, norm_by_std: bool = True, eps: float = 1e-6) -> np.ndarray:
    """Multi-turn GRPO advantages (ARLArena §4.1), one per row: (N,) -> (N,).

    cross_steps: mean/std over all rows of the group (length-weighted pooling);
    else over the group's per-episode mean scores. A group with one sample gets mean 0, std 1
    (its advantage is the raw score); std is unbiased (n-1), as in verl.
    """
    scores = np.asarray(scores, dtype=np.float64)
    group_ids, episode_ids = np.asarray(group_ids), np.asarray(episode_ids)
    adv = np.zeros_like(scores)
    for g in np.unique(group_ids):
        rows = np.flatnonzero(group_ids == g)
        if cross_steps:
            samples = scores[rows]
        else:
            samples = np.array([scores[rows][episode_ids[rows] == e].mean() for e in np.unique(episode_ids[rows])])
        mean, std = (0.0, 1.0) if len(samples) == 1 else (samples.mean(), samples.std(ddof=1))
        adv[rows] = (scores[rows] - mean) / (std + eps) if norm_by_std else scores[rows] - mean
    return adv
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
    """PPO clipped surrogate with dual clip (verl 'vanilla', §3.2); all tensors (B, T); ``counts``: ``agg_loss``'s;
    ``is_weights`` (B, T): detached rollout/trainer importance weights multiplying each token's loss.

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
    if is_weights is not None:
        loss_mat = loss_mat * is_weights
    return agg_loss(loss_mat, mask, agg_mode, counts), metrics
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
    # ALGO LOGIC: extra models and optimizers (defines `extra_models`, trained beside the policy; none for GRPO)
    extra_models: list[torch.nn.Module] = []
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
        segments = segment_scores(rows, args.reward_density)
        advantages = compute_advantages(
            segments.score, segments.group, segments.episode, cross_steps=args.advantage_mode == "cross-step",
            norm_by_std=args.norm_adv_by_std)
        spread_advantages(rows, segments, advantages)
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
                    loss = pg_loss + args.kl_coef * kl_ref - args.entropy_coef * entropy_bonus
                    metrics.update(
                        pg_loss=pg_loss.detach(), kl_ref=kl_ref.detach(), entropy=entropy_bonus.detach())
                    # END ALGO LOGIC
                    accelerator.backward(loss * micro.weight)  # the losses are shares of the global sum
                mb.record(micro, loss, metrics, logp)
            grad_norm = float(accelerator.clip_grad_norm_(policy.parameters(), args.max_grad_norm))
            if mb.step_ok(grad_norm):  # every process's loss and the gradient norm are finite
                # ALGO LOGIC: before the step: extra models' gradients (PPO clips its critic's; none for GRPO)
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
