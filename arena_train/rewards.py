"""Reward density: what score a row (or each turn of a trajectory row) hands to the advantage estimator.

``sparse`` (ARLArena's): every turn of an episode is scored with the episode's env return; ``dense`` (the
Practitioner's Guide's dense rewards): turn t is scored with its return-to-go, the env rewards of turns t, t+1,
... of its episode, so a turn that earned nothing and led nowhere is not credited with a later turn's reward.
Either way a turn's own format penalty is subtracted.

A score belongs to a *segment*: a step row (one turn) is one segment; a trajectory row is one segment when sparse
(score: env return minus all its turns' penalties) and one segment per turn when dense. Group-based estimators
(GRPO, RLOO) normalise over segments and ``spread_advantages`` writes the result back, per token for per-turn
segments. PPO's GAE needs token rewards instead: ``token_rewards`` puts the score on a step row's last token, and
on a trajectory row each turn's own reward on that turn's last policy token (GAE then carries it back over the
concatenated trajectory).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from arena_train.rollout import Row

REWARD_DENSITIES = ("sparse", "dense")


def returns_to_go(rewards, gamma: float = 1.0) -> np.ndarray:
    """(T,) -> (T,): G_t = r_t + gamma * G_{t+1}."""
    out = np.zeros(len(rewards))
    running = 0.0
    for t in reversed(range(len(rewards))):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


@dataclass
class Segments:
    """Scored segments, parallel (S,) arrays: the row each lies in, the turn (-1 = the whole row), its score, and
    its row's group and episode ids."""

    row: np.ndarray
    turn: np.ndarray
    score: np.ndarray
    group: np.ndarray
    episode: np.ndarray


def _check(density: str) -> None:
    if density not in REWARD_DENSITIES:
        raise ValueError(f"reward density must be one of {REWARD_DENSITIES}, got {density!r}")


def _step_returns_to_go(rows: list[Row]) -> dict[int, float]:
    """Return-to-go of every step row (by index), over the step rows of its episode ordered by turn."""
    by_episode: dict[int, list[int]] = defaultdict(list)
    for k, r in enumerate(rows):
        if not r.turns:
            by_episode[r.episode].append(k)
    out = {}
    for ks in by_episode.values():
        ks.sort(key=lambda k: rows[k].turn)
        for k, g in zip(ks, returns_to_go([rows[k].step_reward for k in ks])):
            out[k] = float(g)
    return out


def _later_rows_rewards(rows: list[Row]) -> dict[int, float]:
    """Per trajectory row (by index), the env rewards of the later rows of its episode: an episode whose context
    outgrew the budget goes on in a new row (``arena_train.trajectory``), and a turn's return-to-go runs on
    through those rows."""
    by_episode: dict[int, list[int]] = defaultdict(list)
    for k, r in enumerate(rows):
        if r.turns:
            by_episode[r.episode].append(k)
    out = {}
    for ks in by_episode.values():
        ks.sort(key=lambda k: rows[k].turn)
        later = 0.0
        for k in reversed(ks):
            out[k] = later
            later += float(sum(s.env_reward for s in rows[k].turns))
    return out


def segment_scores(rows: list[Row], density: str) -> Segments:
    """The segments of ``rows`` and their scores under ``density`` (module docstring)."""
    _check(density)
    rtg = _step_returns_to_go(rows) if density == "dense" else {}
    later = _later_rows_rewards(rows) if density == "dense" else {}
    out: dict[str, list] = defaultdict(list)

    def add(k: int, turn: int, score: float) -> None:
        for key, value in (("row", k), ("turn", turn), ("score", score), ("group", rows[k].group),
                           ("episode", rows[k].episode)):
            out[key].append(value)

    for k, r in enumerate(rows):
        if not r.turns:
            add(k, -1, (rtg[k] if density == "dense" else r.env_return) - r.format_penalty)
        elif density == "sparse":
            add(k, -1, r.env_return - sum(s.format_penalty for s in r.turns))
        else:
            for t, g in enumerate(returns_to_go([s.env_reward for s in r.turns])):
                add(k, t, float(g) + later[k] - r.turns[t].format_penalty)
    return Segments(**{key: np.array(out[key], dtype=np.float64 if key == "score" else np.int64)
                       for key in ("row", "turn", "score", "group", "episode")})


def spread_advantages(rows: list[Row], segments: Segments, advantages: np.ndarray) -> None:
    """Write one advantage per segment into ``row.advantage``: a float for a whole-row segment, else a per-token
    array holding each turn's advantage on its span (0 on the env's tokens, which the loss mask drops anyway)."""
    for k, turn, adv in zip(segments.row, segments.turn, np.asarray(advantages, dtype=np.float64)):
        row = rows[k]
        if turn < 0:
            row.advantage = float(adv)
            continue
        if not isinstance(row.advantage, np.ndarray) or len(row.advantage) != len(row.response_ids):
            row.advantage = np.zeros(len(row.response_ids), dtype=np.float32)
        span = row.turns[turn]
        row.advantage[span.start:span.end] = adv


def token_rewards(rows: list[Row], density: str) -> list[np.ndarray]:
    """Per-token rewards (len(response_ids),) of every row for GAE: the row's segment score on its last token, or
    on a dense trajectory row each turn's reward minus its penalty on the turn's last token."""
    _check(density)
    segments = segment_scores(rows, density)
    out = [np.zeros(len(r.response_ids), dtype=np.float32) for r in rows]
    for k, turn, score in zip(segments.row, segments.turn, segments.score):
        r = rows[k]
        if turn < 0:
            last = r.turns[-1].end - 1 if r.turns else len(r.response_ids) - 1
            if last >= 0:
                out[k][last] += score
    for k, r in enumerate(rows):
        if r.turns and density == "dense":
            for s in r.turns:
                if s.end > s.start:  # generation yields at least one token; an empty turn has nowhere to go
                    out[k][s.end - 1] += s.env_reward - s.format_penalty
    return out

