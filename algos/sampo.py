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
import math
import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
import tyro

from arena_train.batching import (
    fill_old_logp,
    first_minibatch,
    lockstep_micro_batches,
    loss_counts,
    make_batch,
    score_rows,
    sequence_logprobs,
    update_orders,
)
from arena_train.checkpoint import resume_latest, save_checkpoint
from arena_train.cli import parse_args
from arena_train.dist import param_sync_error
from arena_train.logger import MetricsLogger, env_metrics, iteration_metrics
from arena_train.memory import print_run_plan
from arena_train.mixture import EnvRatios, FailureStreak, Mixture, MixtureRollout, check_resume
from arena_train.models import BC_CHECKPOINT, load_policy_and_reference, resolve_policy_path
from arena_train.monitor import CollapseConfig, CollapseMonitor, checkpoints_to_keep, restore_healthy
from arena_train.rollout import VAL_TEMPERATURE, VAL_TOP_K, VAL_TOP_P, RolloutConfig, Row
from arena_train.rollout_is import pooled_mismatch, rollout_correction
from arena_train.run_dir import prepare_run_dir
from arena_train.sharding import (
    make_accelerator,
    make_rollout_backend,
    micro_batch_sync,
    prepare_reference,
    require_supported,
    save_final_model,
)
from arena_train.threads import default_threads

#: ``--profile gpu``: ARLArena's shared recipe (§1.3; BC'd Qwen3-4B, 16 groups x 8, lr 1e-6, mini-batch 256, bf16,
#: vLLM); --max-turns and --max-prompt-tokens come from the env's registration (``arena_envs.env_recipe``: ALFWorld
#: 50 turns, WebShop 15 turns and 4,096 prompt tokens). Fields not listed keep the CPU default declared in ``Args``;
#: flags given on the command line always win.
GPU_PROFILE: dict[str, Any] = dict(
    env_id=["ARL/Sokoban-v0"], model_path="Qwen/Qwen3-4B", num_iterations=200, num_groups=16, history_length=2,
    prompt_style="arlarena", max_response_tokens=512, temperature=1.0, learning_rate=1e-6, mini_batch_size=256,
    micro_batch_size=8, rollout_backend="auto", mixed_precision="bf16", gradient_checkpointing=True, eval_episodes=128)
#: Loss aggregation modes (ARLArena §3.1); ``--loss-agg`` is the short flag.
LossAgg = Annotated[Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"],
                    tyro.conf.arg(aliases=("--loss-agg",))]
#: Sequence masking switch (ARLArena §3.8); ``--seq-mask`` is the short flag.
SeqMask = Annotated[bool, tyro.conf.arg(aliases=("--seq-mask",))]
#: Per-micro-batch metrics that are counts (summed over the iteration), not averages.
COUNT_METRICS = ("masked_seqs",)
#: Per-micro-batch metrics that are terms of the loss: each is the micro-batch's share of its mini-batch's value.
LOSS_METRICS = ("pg_loss", "kl_ref", "entropy", "value_loss")


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
    num_iterations: int = 30
    """number of rollout + update iterations"""
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
    max_response_tokens: int = 16
    """new tokens generated per turn"""
    temperature: float = 0.5
    """sampling temperature of training rollouts (log-probs use the same temperature)"""
    top_p: float = 1.0
    """nucleus sampling of training rollouts"""
    learning_rate: float = 1e-4
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
    mini_batch_size: int = 128
    """rows per optimizer step (per process)"""
    micro_batch_size: int = 128
    """rows per forward/backward pass (gradient accumulation inside a mini-batch)"""
    micro_batch_tokens: int = 0
    """also cap a forward/backward pass at this many padded tokens (0 = rows only); rows are sorted by length"""
    update_epochs: int = 1
    """passes over each rollout batch"""
    rollout_backend: Literal["auto", "hf", "vllm"] = "hf"
    """'auto' (vLLM if importable and on GPU), 'vllm' or 'hf' (transformers generate)"""
    vllm_gpu_memory_utilization: float = 0.35
    """GPU memory fraction given to vLLM's engine"""
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    """Accelerate mixed precision"""
    gradient_checkpointing: bool = False
    """trade compute for memory in the update"""
    lora_rank: int = 0
    """LoRA rank on every attention/MLP projection (0 = full fine-tuning); the reference is the frozen base"""
    dry_run: bool = False
    """print this run's per-GPU memory plan (policy, reference, optimizer, activations, vLLM) and exit"""
    seed: int = 1
    """seed of everything (tasks, sampling, init)"""
    torch_threads: int = 0
    """CPU threads per process (0 = $OMP_NUM_THREADS if set, else all available cores; 1 on a shared machine)"""
    output_dir: str = "runs"
    """runs/<run_name>/ receives metrics.jsonl, TensorBoard events, checkpoints and the final model"""
    run_name: str | None = None
    """defaults to <env>__<exp_name>__<seed>"""
    checkpoint_every: int = 10
    """save model, optimizer, RNG states every N iterations (0 = only at the end)"""
    resume: bool = False
    """continue from the latest checkpoint of run_name (verified against its manifest)"""
    resume_fallback: bool = False
    """with --resume: when the newest checkpoint is damaged, resume from the newest intact earlier one"""
    overwrite: bool = False
    """delete the run already in output_dir/run_name and start over (without this or --resume it is an error)"""
    eval_every: int = 10
    """evaluation on the held-out split every N iterations (0 = never)"""
    eval_episodes: int = 100
    """held-out episodes per evaluation"""
    eval_split: str | None = None
    """split of the evaluation (default: the env's held-out split, arena_envs.held_out_split; never 'train')"""
    eval_greedy: bool = False
    """greedy evaluation instead of ARLArena's validation sampling (eval_temperature, eval_top_p, eval_top_k)"""
    eval_temperature: float = VAL_TEMPERATURE
    """sampling temperature of the evaluation"""
    eval_top_p: float = VAL_TOP_P
    """nucleus sampling of the evaluation"""
    eval_top_k: int = VAL_TOP_K
    """top-k sampling of the evaluation (0 = off)"""
    track: bool = False
    """also log to Weights & Biases"""
    wandb_project: str = "arlarena"
    """W&B project"""
    # the in-run collapse alarm (arena_train.monitor, docs/evaluation.md "The in-run alarm")
    on_collapse: Literal["off", "warn", "stop", "rollback"] = "warn"
    """off: no monitoring; warn: log the alarm; stop: end the run on its last healthy checkpoint; rollback: go back
    to that checkpoint with a smaller learning rate (stop once max_rollbacks are used)"""
    rollback_lr_scale: float = 0.5
    """each rollback multiplies the learning rate by this"""
    max_rollbacks: int = 2
    """rollbacks allowed per run; the next alarm stops the run"""
    collapse_warmup: int = 5
    """iterations after the start (or a rollback) in which statistics are collected and nothing but a
    non-finite value fires"""
    collapse_success_drop: float = 0.5
    """success_drop / eval_drop fire when success < this fraction of its running best ..."""
    collapse_success_window: int = 10
    """... rollout success averaged over this many iterations (one batch of 64 episodes is too noisy) ..."""
    collapse_success_patience: int = 3
    """... for this many consecutive iterations ..."""
    collapse_success_min_peak: float = 0.2
    """... once that best is at least this (below it, halving is noise, not a collapse)"""
    collapse_eval_window: int = 3
    """held-out success (eval/success_rate) averaged over this many evaluations ..."""
    collapse_eval_patience: int = 2
    """... below success_drop x its best for this many consecutive evaluations"""
    collapse_patience: int = 2
    """consecutive iterations a grad_spike, entropy, kl_blowup, format_drop, action_drop or mismatch condition
    must hold (a single outlier batch is clipped and survived)"""
    collapse_window: int = 50
    """running medians (grad norm, entropy, KL) use at most this many previous finite values ..."""
    collapse_min_history: int = 5
    """... and need this many"""
    collapse_grad_factor: float = 10.0
    """grad_spike: gradient norm > this x its running median"""
    collapse_entropy_factor: float = 4.0
    """entropy: above this x, or below 1/this x, its running median (explosion or collapse)"""
    collapse_kl_factor: float = 10.0
    """kl_blowup: KL to the reference > max(kl_floor, this x its running median)"""
    collapse_kl_floor: float = 0.1
    """KL starts near 0, where a ratio alone fires on noise"""
    collapse_ratio_drop: float = 0.5
    """format_drop / action_drop: valid-format / valid-action ratio < this x its running best ..."""
    collapse_ratio_min_peak: float = 0.5
    """... once that best is at least this (never having the format is not learning it, not a collapse)"""
    collapse_mismatch_max: float = 0.05
    """mismatch: mean |p_rollout - p_train| of the sampled tokens (rollout_is/prob_diff_mean) above this"""
    rollout_precision: Literal["trainer", "bf16"] = "trainer"
    """the rollout engine's precision: the trainer's own, or bfloat16 (a bf16 copy / vLLM engine fed after every
    update); another engine's log-probs differ from the trainer's: rollout_is/* logs the gap"""
    rollout_is: Literal["none", "tis", "mis"] = "none"
    """rollout/trainer mismatch correction: the trainer rescores every row and weights each token's policy loss by
    p_train/p_rollout, truncated at the cap (tis) or 0 above it (mis); none: no weights"""
    rollout_is_cap: float = 2.0
    """cap (>= 1) of the rollout importance weights"""
    env_workers: int = -1
    """env worker processes per env (0 = step the envs in the trainer's process; -1 = auto: one per core, up to one
    per episode, for the native engines ALFWorld and TextWorld, 0 for the pure-Python envs); same rows either way"""
    env_step_timeout: float = 300.0
    """seconds an env step or reset may take in a worker before its episode fails (workers only)"""
    max_env_failures: int = 5
    """stop the run after this many consecutive iterations whose env errors dropped a group (0 = never)"""
    # ALGO LOGIC: algorithm hyper-parameters
    clip_ratio_low: float = 3e-3
    """clip epsilon of the sequence ratio below 1 (ARLArena: 3e-3 ALFWorld, 3e-2 WebShop, 3e-4 math)"""
    clip_ratio_high: float = 4e-3
    """clip epsilon of the sequence ratio above 1 (ARLArena: 4e-3 ALFWorld, 4e-2 WebShop, 4e-4 math)"""
    loss_agg_mode: LossAgg = "seq-mean-token-mean"
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


# ---------------------------------------------------------------------------------------------
# Loss math every method shares. B = rows, T = padded response length. Masks are 0/1 floats.
# ---------------------------------------------------------------------------------------------
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
    import difflib

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


def dynamic_sample(rollout, n_groups: int, max_tries: int) -> tuple[list[Row], list[Any], dict[str, float]]:
    """Dynamic sampling (ARLArena §5.1): call ``rollout(attempt) -> (rows, episodes)`` up to ``max_tries``
    times, keeping whole groups with non-constant episode env returns until ``n_groups`` are kept; the
    last try fills up with all-equal groups. Group ids must be unique across attempts.

    Returns the kept rows (rollout order), every episode rolled out (for unbiased rollout metrics) and
    counts: gen_batches, kept_groups, informative_groups (over all tries).
    """
    rows: list[Row] = []
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
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm
    from transformers.utils import logging as hf_logging

    import wrappers

    mixture = Mixture.parse(args.env_id, args.env_weights)
    if args.run_name is None:
        args.run_name = f"{mixture.label}__{args.exp_name}__{args.seed}"
    torch.set_num_threads(default_threads(args.torch_threads))  # before any vLLM engine: later calls are no-ops
    hf_logging.disable_progress_bar()
    if args.dry_run:  # the plan needs the model's shape only: Qwen3 names are known without a download
        raise SystemExit(print_run_plan(
            args.model_path, micro_batch_size=args.micro_batch_size, lora_rank=args.lora_rank,
            max_prompt_tokens=args.max_prompt_tokens, max_response_tokens=args.max_response_tokens,
            gradient_checkpointing=args.gradient_checkpointing, rollout_backend=args.rollout_backend,
            vllm_share=args.vllm_gpu_memory_utilization, mixed_precision=args.mixed_precision))
    model_path = resolve_policy_path(args.model_path)
    accelerator = make_accelerator(args.mixed_precision)  # FSDP2 also on CPU-only machines (tests)
    rank, world, device = accelerator.process_index, accelerator.num_processes, accelerator.device
    if args.num_groups % world or args.eval_episodes % world:
        raise SystemExit(f"--num-groups and --eval-episodes must be multiples of the {world} processes")
    set_seed(args.seed + rank)
    run_dir = Path(args.output_dir) / args.run_name
    prepare_run_dir(accelerator, run_dir, args.resume, args.overwrite)

    dtype = torch.bfloat16 if args.mixed_precision == "bf16" and torch.cuda.is_available() else torch.float32
    require_supported(accelerator, args.lora_rank)
    policy, ref_model, tokenizer = load_policy_and_reference(model_path, dtype, lora_rank=args.lora_rank,
                                                             gradient_checkpointing=args.gradient_checkpointing)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    # ALGO LOGIC: extra models and optimizers (defines `extra_models`, trained beside the policy; none for GRPO)
    extra_models: list[torch.nn.Module] = []
    # END ALGO LOGIC
    policy, optimizer = accelerator.prepare(policy, optimizer)
    ref_model = prepare_reference(accelerator, ref_model, policy)  # sharded like the policy; LoRA: the base

    backend = make_rollout_backend(  # vLLM, or transformers generate (sharded: an unsharded copy fed from shards)
        args.rollout_backend, accelerator, policy, tokenizer, model_path, dtype, seed=args.seed + rank,
        max_model_len=args.max_prompt_tokens + args.max_response_tokens, mixed_precision=args.mixed_precision,
        max_num_seqs=max(args.num_groups // world * args.group_size, args.eval_episodes // world),
        gpu_memory_utilization=args.vllm_gpu_memory_utilization, precision=args.rollout_precision)
    monitor = CollapseMonitor(CollapseConfig.from_flags(asdict(args)))  # its state travels in every checkpoint
    accelerator.register_for_checkpointing(monitor)
    keep = checkpoints_to_keep(monitor.config, args.checkpoint_every)  # a healthy one survives until an alarm
    if args.resume:  # before the logger rewrites args.json, the record of the run's mixture
        check_resume(accelerator, run_dir, mixture)
    start_iteration = 1 + (resume_latest(accelerator, run_dir, args.resume_fallback) if args.resume else 0)
    push_metrics = backend.push(accelerator.unwrap_model(policy))
    logger = MetricsLogger(run_dir, start_iteration, args.wandb_project if args.track else None, args.run_name,
                           {**asdict(args), "world_size": world}) if accelerator.is_main_process else None
    if start_iteration == 1 and monitor.config.on_collapse in ("stop", "rollback"):  # the start weights: the first
        monitor.checkpointed(0)  # healthy checkpoint, for a collapse in the first iterations
        save_checkpoint(accelerator, run_dir, 0, keep)

    # a partial of wrappers.make_env pickles: env worker processes (--env-workers) build their envs with it
    make_env = functools.partial(wrappers.make_env, history_length=args.history_length,
                                 format_penalty=args.format_penalty, prompt_style=args.prompt_style)

    # every env's groups and held-out episodes (the held-out split: rollout and eval tasks must not meet)
    rollouts = MixtureRollout(mixture, make_env, args.num_groups // world, args.group_size,
                              max(args.eval_episodes // world, 1), args.eval_split,
                              env_workers=args.env_workers, step_timeout=args.env_step_timeout)
    sampling = RolloutConfig(max_turns=args.max_turns, max_prompt_tokens=args.max_prompt_tokens,
                             max_response_tokens=args.max_response_tokens, temperature=args.temperature,
                             top_p=args.top_p, row_layout=args.row_layout)
    rollouts.require_prompts_fit(tokenizer, sampling, seed=args.seed)
    env_failures, env_failure = FailureStreak(args.max_env_failures, rollouts), None
    evaluation = replace(sampling, temperature=args.eval_temperature, top_p=args.eval_top_p, top_k=args.eval_top_k)
    pad_id = tokenizer.pad_token_id
    # Dr.GRPO's constant length: the most policy tokens a row can hold
    max_len = args.max_response_tokens * (args.max_turns if args.row_layout == "trajectory" else 1)

    for iteration in tqdm(range(start_iteration, args.num_iterations + 1), disable=not accelerator.is_main_process,
                          initial=start_iteration - 1, total=args.num_iterations, desc=args.exp_name):
        # ---- rollout: rows of whole episodes, their old-policy and reference log-probs, advantages ------------
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
        n_minibatches, orders = update_orders(accelerator, len(rows), args.mini_batch_size, args.update_epochs,
                                              seed=args.seed * 1_000_003 + iteration * 101 + rank)
        # the first mini-batch's forward comes before any optimizer step: it gives its rows' old log-probs itself
        score_rows(policy, ref_model, rows, micro_batch_size=args.micro_batch_size, temperature=args.temperature,
                   pad_id=pad_id, device=device, stats=stats, skip_policy=first_minibatch(orders, n_minibatches),
                   micro_batch_tokens=args.micro_batch_tokens,
                   use_rollout_logp=args.rollout_is == "none" and backend.score_rollouts)
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

        # ---- update --------------------------------------------------------------------------
        t_update = time.perf_counter()
        backend.sleep()
        policy.train()
        sums: dict[str, list[float]] = defaultdict(list)
        grad_norms, skipped, update_tokens = [], 0, 0
        mismatch: dict[str, list[float]] = defaultdict(list)
        env_ratios = EnvRatios()
        for order in orders:
            for mb_index in np.array_split(np.array(order, dtype=np.int64), n_minibatches):
                mb_rows: list[Row] = [rows[j] for j in mb_index]  # may be empty here: this process still joins
                # as many micro-batches and forward calls on every process (padding micro-batches are empty)
                micro_batches, share_prefix = lockstep_micro_batches(accelerator, mb_rows, args.micro_batch_size,
                                                                     args.micro_batch_tokens)
                # one normaliser per optimizer step: the whole mini-batch on all processes (loss_counts)
                counts = loss_counts(accelerator, mb_rows, max_len)
                # ALGO LOGIC: the policy loss's normaliser `pg_counts` (no sequence masking in GSPO)
                pg_counts = counts
                # END ALGO LOGIC
                optimizer.zero_grad(set_to_none=True)
                non_finite = 0.0
                loss_terms: dict[str, float] = defaultdict(float)
                for k, (micro_rows, share) in enumerate(zip(micro_batches, share_prefix)):
                    batch_rows = micro_rows or micro_batches[0] or rows[:1]  # padding: a real batch, weight 0
                    batch = make_batch(batch_rows, pad_id, device, share_prefix=share)
                    sync = micro_batch_sync(accelerator, [policy, *extra_models], last=k == len(micro_batches) - 1)
                    with sync, accelerator.autocast():
                        logp, entropy = sequence_logprobs(policy, batch, args.temperature)
                        fill_old_logp(batch, logp, micro_rows)  # the first mini-batch's rows (not scored)
                        mask = batch["mask"]
                        # rollout/trainer correction: per-token weights of the policy loss (None: off)
                        is_weights, batch_mismatch = rollout_correction(
                            batch, mask, args.rollout_is, args.rollout_is_cap, not backend.score_rollouts)
                        for key, value in batch_mismatch.items() if micro_rows else ():
                            mismatch[key].append(value)
                        # ALGO LOGIC: loss of one micro-batch (defines `loss` and `metrics`)
                        pg_loss, metrics = policy_loss(logp, batch["old_logp"], batch["advantages"], mask,
                                                       clip_low=args.clip_ratio_low, clip_high=args.clip_ratio_high,
                                                       counts=pg_counts,
                            is_weights=is_weights)
                        kl_ref = agg_loss(kl_penalty(logp, batch["ref_logp"], args.kl_estimator), mask,
                                          args.loss_agg_mode, counts)
                        entropy_bonus = agg_loss(entropy, mask, args.loss_agg_mode, counts)
                        loss = pg_loss + args.kl_coef * kl_ref - args.entropy_coef * entropy_bonus
                        metrics.update(pg_loss=pg_loss.detach(), kl_ref=kl_ref.detach(),
                                       entropy=entropy_bonus.detach())
                        # END ALGO LOGIC
                        # DDP averages gradients over processes; the losses are shares of the global sum
                        accelerator.backward(loss * (world if micro_rows else 0.0))
                    non_finite += float(not torch.isfinite(loss).item())
                    update_tokens += int(batch["attention_mask"].sum()) if micro_rows else 0
                    if len(mixture.env_ids) > 1 and micro_rows:  # each env's importance ratios apart (env/<name>/*)
                        env_ratios.add(micro_rows, logp, batch["old_logp"], mask, args.clip_ratio_low,
                                       args.clip_ratio_high)
                    for key, value in metrics.items():
                        if key in LOSS_METRICS:  # every process logs every term, 0 for its padding
                            loss_terms[key] += float(value) if micro_rows else 0.0
                        elif micro_rows:
                            sums[key].append(float(value))
                for key, value in loss_terms.items():  # this process's share of the mini-batch's loss
                    sums[key].append(value * world)
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
        push_metrics = backend.push(accelerator.unwrap_model(policy))  # the rollout engine gets the new weights
        t_update = time.perf_counter() - t_update

        # ---- log, evaluate, checkpoint -------------------------------------------------------
        metrics_out = iteration_metrics(accelerator, episodes=episodes, rows=rows, stats=stats, actor_sums=sums,
                                        grad_norms=grad_norms, skipped=skipped, update_tokens=update_tokens,
                                        t_rollout=t_rollout, t_update=t_update, count_keys=COUNT_METRICS)
        if len(mixture.env_ids) > 1:  # env/<name>/*: every env of the mixture apart
            metrics_out.update(env_metrics(accelerator, mixture.names, episodes=episodes, rows=rows))
            metrics_out.update(env_ratios.metrics(accelerator, mixture.names))
        metrics_out.update(push_metrics)
        metrics_out.update(pooled_mismatch(accelerator, mismatch))  # every process holds rows, so values
        # ALGO LOGIC: method-specific metrics into metrics_out (none for GRPO)
        from arena_train.dist import global_mean, global_sum
        metrics_out["rollout/gen_batches"] = global_mean(accelerator, [stats["gen_batches"]])
        metrics_out["rollout/kept_groups"] = global_sum(accelerator, stats["kept_groups"])
        metrics_out["rollout/informative_groups"] = global_sum(accelerator, stats["informative_groups"])
        metrics_out["rollout/step_adv_abs"] = global_mean(accelerator, [stats["step_adv_abs"]])
        metrics_out["rollout/grouped_step_ratio"] = global_mean(accelerator, [stats["grouped_step_ratio"]])
        # END ALGO LOGIC
        if args.eval_every > 0 and (iteration % args.eval_every == 0 or iteration == args.num_iterations):
            metrics_out.update(rollouts.evaluate(accelerator, backend, tokenizer, evaluation, args.eval_episodes,
                                                 rank, world, greedy=args.eval_greedy))
        step = monitor.update(iteration, metrics_out)  # collapse signals; pooled metrics: one decision everywhere
        metrics_out.update(step.metrics)
        if step.message:
            accelerator.print(step.message)
        if logger is not None:
            logger.log(iteration, metrics_out)
        env_failure = env_failures.update(metrics_out)
        if env_failure is not None:  # the env keeps failing: stop on the last checkpoint
            break
        if step.decision.action in ("stop", "rollback"):  # back to the last healthy checkpoint, saved as this one
            restored = restore_healthy(accelerator, run_dir, monitor, step.decision, iteration, optimizer, keep)
            if step.decision.action == "stop" or restored is None:
                break
            push_metrics = backend.push(accelerator.unwrap_model(policy))
            continue
        if (args.checkpoint_every > 0 and iteration % args.checkpoint_every == 0) or iteration == args.num_iterations:
            monitor.checkpointed(iteration)
            save_checkpoint(accelerator, run_dir, iteration, keep)

    rollouts.close()  # the env workers end here (and with the process on any other way out)
    if env_failure is not None:
        backend.close()
        raise SystemExit(env_failure if accelerator.is_main_process else 1)

    # ---- final model (a normal HF folder) and a cross-rank consistency check -----------------
    sync_error = param_sync_error(accelerator, policy)
    final = save_final_model(accelerator, policy, tokenizer, run_dir / "final")  # every process joins the gather
    if accelerator.is_main_process:
        logger.close(summary={"world_size": world, "param_sync_error": sync_error, "final_model": str(final),
                              **monitor.summary()})
        accelerator.print(f"done: metrics in {run_dir / 'metrics.jsonl'}, model in {final}")
    backend.close()  # vLLM: after the last collective, before the process group ends
    accelerator.end_training()


if __name__ == "__main__":
    main(parse_args(Args, GPU_PROFILE))
