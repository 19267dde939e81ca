"""GiGPO's advantage estimator (ARLArena §4.2) for scripts that offer it as an option (``dapo.py --advantage
gigpo``). gigpo.py and sampo.py keep their own visible copies, since there it is the method; this one is pinned
equal to gigpo.py's, function by function, by tests/test_algos_math.py.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from typing import Any

import numpy as np


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
