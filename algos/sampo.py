# ALGO LOGIC: module docstring (what this method is and how it differs from grpo.py)
"""SAMPO for multi-turn LLM agents — ARLArena's method as a copy of grpo.py.

Method (ARLArena, arXiv 2602.21534, §1.1): SAMPO = GSPO's sequence-level ratio and clipping
(3e-3 / 4e-3, seq-mean-token-mean) + GiGPO's episode + anchor-state step advantage (omega 1, gamma 0.95,
mean_std_norm) + DAPO-style dynamic sampling (informative groups only, up to 3 rollout batches, the
last one filling up, 15 cold-start iterations; 5 on WebShop), on ARLArena's shared recipe that grpo.py
already uses by default: BC init, format penalty 0.1, k3 KL loss 0.01, entropy bonus 0.001.

    L = (1/B) sum_b (1/|y_b|) sum_t max(-A_b s_bt, -A_b clip(s_bt, 1-3e-3, 1+4e-3)) + 0.01 KL_k3 - 0.001 H
    s_bt = exp(sg[mean_t(l - l_old)] + l_bt - sg[l_bt]),   A_b = A_episode + 1.0 * A_step

Differs from grpo.py only inside ``# ALGO LOGIC`` blocks: ``diff algos/grpo.py algos/sampo.py``.

    python algos/sft.py && python algos/sampo.py                  # CPU demo, tiny model, minutes
    accelerate launch algos/sampo.py --profile gpu --model-path <BC checkpoint of Qwen3-4B>
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
import difflib

from arena_train.dist import global_mean, global_sum

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
    clip_ratio_low: float = 3e-3
    """clip epsilon of the sequence ratio below 1 (ARLArena: 3e-3 ALFWorld, 3e-2 WebShop, 3e-4 math)"""
    clip_ratio_high: float = 4e-3
    """clip epsilon of the sequence ratio above 1 (ARLArena: 4e-3 ALFWorld, 4e-2 WebShop, 4e-4 math)"""
    loss_agg_mode: cli.LossAgg = "seq-mean-token-mean"
    """aggregation of the KL and entropy terms (the GSPO loss itself is always seq-mean-token-mean)"""
    gamma: float = 0.95
    """discount of the GiGPO step returns"""
    step_advantage_w: float = 1.0
    """weight omega of the step-level advantage (0 = pooled GRPO)"""
    gigpo_mode: Literal["mean_norm", "mean_std_norm"] = "mean_std_norm"
    """group normalisation: mean_std_norm (ARLArena ALFWorld) or mean_norm (WebShop)"""
    similarity_thresh: float | None = None
    """None = exact anchor match; e.g. 0.95 = merge text anchors with difflib similarity >= 0.95"""
    filter_groups: bool = True
    """dynamic sampling: train only on groups whose episode env returns are not all equal"""
    max_num_gen_batches: int = 3
    """rollout batches tried per iteration; the last one fills up with all-equal groups"""
    cold_start_steps: int = 15
    """iterations without filtering at the start (ARLArena: 15 ALFWorld, 5 WebShop SAMPO, 0 WebShop DAPO)"""

    def method_problem(self) -> str | None:
        """Combinations this method cannot run, refused at start-up (arena_train.cli.args_problem)."""
        if self.row_layout == "trajectory":
            return ("error: sampo.py needs --row-layout step: GiGPO's step groups are per-turn anchor states, and a "
                    "trajectory row has one anchor per episode (its step advantage would repeat the episode's)")
        return None
    # END ALGO LOGIC


# ALGO LOGIC: advantage estimators and dynamic sampling
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


def discounted_step_returns(step_rewards: np.ndarray, episode_ids: np.ndarray, turns: np.ndarray,
                            gamma: float) -> np.ndarray:
    """GiGPO step returns R_k = r_k + gamma * R_{k+1} inside each episode (rows in any order): (N,) -> (N,)."""
    step_rewards, episode_ids, turns = (np.asarray(x) for x in (step_rewards, episode_ids, turns))
    returns = np.zeros(len(step_rewards), dtype=np.float64)
    for e in np.unique(episode_ids):
        rows = np.flatnonzero(episode_ids == e)
        running = 0.0
        for b in rows[np.argsort(turns[rows])][::-1]:
            running = float(step_rewards[b]) + gamma * running
            returns[b] = running
    return returns


def step_groups(group_ids: np.ndarray, anchors: list[Any], similarity_thresh: float | None = None) -> np.ndarray:
    """Anchor-state step group (N,) of every row: rows of one episode group acting on the same anchor
    share a group (groups never cross episode groups). With ``similarity_thresh``, a text anchor joins
    the first earlier anchor of its episode group whose difflib ratio is >= the threshold."""
    keys: dict[tuple[Any, Any], int] = {}
    seen: dict[Any, dict[Any, None]] = defaultdict(dict)  # episode group -> its distinct anchors, in order
    out = np.zeros(len(anchors), dtype=np.int64)
    for b, (g, a) in enumerate(zip(np.asarray(group_ids).tolist(), anchors)):
        if similarity_thresh is not None and isinstance(a, str) and a not in seen[g]:
            a = next((c for c in seen[g] if isinstance(c, str)
                      and difflib.SequenceMatcher(None, a, c).ratio() >= similarity_thresh), a)
        seen[g].setdefault(a, None)
        out[b] = keys.setdefault((g, a), len(keys))
    return out


def step_advantages(step_returns: np.ndarray, step_group_ids: np.ndarray, norm_by_std: bool,
                    eps: float = 1e-6) -> np.ndarray:
    """Step-level advantage over anchor-state groups (GiGPO Eq. 7): (N,) -> (N,); singletons get 0."""
    adv = np.zeros(len(step_returns), dtype=np.float64)
    for h in np.unique(step_group_ids):
        rows = np.flatnonzero(step_group_ids == h)
        if len(rows) > 1:
            x = step_returns[rows]
            adv[rows] = (x - x.mean()) / (x.std(ddof=1) + eps) if norm_by_std else x - x.mean()
    return adv


def gigpo_advantages(scores: np.ndarray, step_rewards: np.ndarray, format_penalties: np.ndarray,
                     group_ids: np.ndarray, episode_ids: np.ndarray, turns: np.ndarray, anchors: list[Any],
                     gamma: float = 0.95, step_weight: float = 1.0, mode: str = "mean_std_norm",
                     similarity_thresh: float | None = None, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """GiGPO (ARLArena §4.6): A = A_episode + step_weight * A_step, one per row, (N,) -> ((N,), (N,) A_step).

    A_episode: pooled group-normalised scores (= GRPO cross-step; mean_norm drops the std).
    A_step: discounted env returns from this step on (minus this step's format penalty), normalised
    over the rows of the same episode group that acted on the same anchor state.
    """
    if mode not in ("mean_norm", "mean_std_norm"):
        raise ValueError(f"unknown GiGPO mode {mode!r}")
    norm = mode == "mean_std_norm"
    episode_adv = compute_advantages(scores, group_ids, episode_ids, cross_steps=True, norm_by_std=norm, eps=eps)
    step_returns = discounted_step_returns(step_rewards, episode_ids, turns, gamma) - np.asarray(format_penalties)
    step_adv = step_advantages(step_returns, step_groups(group_ids, anchors, similarity_thresh), norm, eps)
    return episode_adv + step_weight * step_adv, step_adv


def select_groups(group_returns: list[list[float]], capacity: int, fill: bool) -> list[int]:
    """Indices of the groups to keep, in order, at most ``capacity`` (ARLArena §5.1).

    group_returns[i] = env returns of group i's episodes (before format penalties). Informative groups
    (returns not all equal, exact comparison) are kept; with ``fill`` all-equal groups follow in order.
    """
    informative = [i for i, r in enumerate(group_returns) if len(set(map(float, r))) > 1]
    kept = informative[:max(capacity, 0)]
    if fill:
        constant = [i for i, r in enumerate(group_returns) if len(set(map(float, r))) <= 1]
        kept += constant[:max(capacity - len(kept), 0)]
    return kept


def dynamic_sample(rollout, n_groups: int, max_tries: int) -> tuple[list, list[Any], dict[str, float]]:
    """Dynamic sampling (ARLArena §5.1): call ``rollout(attempt) -> (rows, episodes)`` up to ``max_tries``
    times, keeping whole groups with non-constant episode env returns until ``n_groups`` are kept; the
    last try fills up with all-equal groups. Group ids must be unique across attempts.

    Returns the kept rows (rollout order), every episode rolled out (for unbiased rollout metrics) and
    counts: gen_batches, kept_groups, informative_groups (over all tries).
    """
    rows: list = []
    episodes: list[Any] = []
    kept = informative = 0
    for attempt in range(max_tries):
        new_rows, new_episodes = rollout(attempt)
        episodes += new_episodes
        returns: dict[int, dict[int, float]] = defaultdict(dict)  # group -> episode -> env return
        for r in new_rows:
            returns[r.group][r.episode] = r.env_return
        groups = list(returns)
        keep = select_groups([list(v.values()) for v in returns.values()], n_groups - kept,
                             fill=attempt == max_tries - 1)
        keep_ids = {groups[i] for i in keep}
        rows += [r for r in new_rows if r.group in keep_ids]
        kept += len(keep)
        informative += sum(len(set(v.values())) > 1 for v in returns.values())
        if kept >= n_groups:
            break
    return rows, episodes, {"gen_batches": attempt + 1, "kept_groups": kept, "informative_groups": informative}
# END ALGO LOGIC


# ALGO LOGIC: policy loss
def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_low: float = 3e-3, clip_high: float = 4e-3, counts: dict[str, float] | None = None,
                is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (§3.5, GSPO-token form); all tensors (B, T). Aggregation is always seq-mean-token-mean.

    s_b = exp(mean_t (l - l_old)) is the length-normalised sequence ratio. exp(sg[log s_b] + l - sg[l])
    has the value s_b on every token and the gradient s_b * grad(l), so clipping s_b zeroes or keeps
    the whole row. Metrics: clipfrac_upper (A>0, s>1+eps_high), clipfrac_lower (A<0, s<1-eps_low),
    approx_kl (mean l_old - l).
    """
    log_ratio = torch.where(mask > 0, logp - old_logp, torch.zeros_like(logp))
    seq_log_ratio = log_ratio.sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,) log s_b
    token_log_ratio = torch.clamp(seq_log_ratio.detach().unsqueeze(-1) + logp - logp.detach(), max=10.0)
    ratio = torch.exp(token_log_ratio)  # (B, T)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(loss1, loss2)
    with torch.no_grad():
        metrics = {
            "clipfrac_upper": masked_mean(((ratio > 1 + clip_high) & (advantages > 0)).float(), mask),
            "clipfrac_lower": masked_mean(((ratio < 1 - clip_low) & (advantages < 0)).float(), mask),
            "approx_kl": masked_mean(-log_ratio, mask),
        }
    if is_weights is not None:  # rollout/trainer importance weights (detached)
        loss_mat = loss_mat * is_weights
    return agg_loss(loss_mat, mask, "seq-mean-token-mean", counts), metrics
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
        target = args.num_groups // world  # groups per process
        tries = args.max_num_gen_batches if args.filter_groups and iteration > args.cold_start_steps else 1
        rows, episodes, sampling_stats = dynamic_sample(
            lambda attempt, iteration=iteration, stats=stats, target=target: rollouts.collect(  # called at once
                backend, tokenizer, mixture.task_seeds(args.seed, iteration, args.num_groups, rank, world, attempt),
                sampling, stats, id_offset=attempt * target * args.group_size),  # ids unique across tries
            target, tries)
        stats.update(sampling_stats)
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
        advantages, step_adv = gigpo_advantages(
            np.array([r.env_return - r.format_penalty for r in rows]), np.array([r.step_reward for r in rows]),
            np.array([r.format_penalty for r in rows]), np.array([r.group for r in rows]),
            np.array([r.episode for r in rows]), np.array([r.turn for r in rows]), [r.anchor for r in rows],
            gamma=args.gamma, step_weight=args.step_advantage_w, mode=args.gigpo_mode,
            similarity_thresh=args.similarity_thresh)
        for row, adv in zip(rows, advantages):
            row.advantage = float(adv)
        stats["step_adv_abs"] = float(np.abs(step_adv).mean())
        stats["grouped_step_ratio"] = float(np.mean(step_adv != 0))  # rows whose step group gave a signal
        # END ALGO LOGIC
        t_rollout = time.perf_counter() - t_rollout

        # ---- update: one optimizer step per mini-batch, gradients summed over its micro-batches ----
        t_update = time.perf_counter()
        backend.sleep()
        policy.train()
        for mb in update.minibatches(rows, orders, n_minibatches):
            # ALGO LOGIC: the policy loss's normaliser `pg_counts` (no sequence masking in GSPO)
            pg_counts = mb.counts
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
                        clip_low=args.clip_ratio_low, clip_high=args.clip_ratio_high, counts=pg_counts,
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
        metrics_out["rollout/gen_batches"] = global_mean(accelerator, [stats["gen_batches"]])
        metrics_out["rollout/kept_groups"] = global_sum(accelerator, stats["kept_groups"])
        metrics_out["rollout/informative_groups"] = global_sum(accelerator, stats["informative_groups"])
        metrics_out["rollout/step_adv_abs"] = global_mean(accelerator, [stats["step_adv_abs"]])
        metrics_out["rollout/grouped_step_ratio"] = global_mean(accelerator, [stats["grouped_step_ratio"]])
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
