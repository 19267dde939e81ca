"""A run's verdict: held-out success at the start (iteration 0), at its best evaluation and at the end, each with a
Wilson interval, and the gain of the final model over the start with a paired interval.

Every in-run evaluation plays the same held-out task seeds (``rollout.held_out_seeds``: EVAL_SEED_OFFSET + 0, 1,
...), so the start and the final evaluation can be compared task by task: the gain's interval is Newcombe's paired
one (``arena_train.stats.paired_difference_ci``) over the (env, task seed) pairs both evaluations scored. The
outcomes are
read from the run's held-out episode records (``episodes/eval_<iteration>.jsonl``), so a resumed run's verdict
still starts at the iteration-0 evaluation of its first part. Those files keep every episode played (over their
size cap an episode loses its texts, never its outcome: ``arena_train.episodes.encode_records``), so each point
counts every held-out episode, as ``eval/success_rate`` does, and says how many.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arena_train.episodes import EPISODES_DIR, file_iteration, read_episodes
from arena_train.stats import paired_difference_ci, proportion_ci


def held_out_outcomes(run_dir: Path) -> dict[int, dict[tuple[str, int], bool]]:
    """iteration -> {(env id, task seed): won} of every held-out evaluation recorded in ``run_dir`` (episodes that
    ended on an env error are left out, as in ``eval/success_rate``)."""
    out: dict[int, dict[tuple[str, int], bool]] = {}
    for path in sorted((run_dir / EPISODES_DIR).glob("eval_*.jsonl")):
        iteration = file_iteration(path)
        if iteration is None:
            continue
        out[iteration] = {(r["env_id"], int(r["task_seed"])): bool(r["won"]) for r in read_episodes(path)
                          if r.get("stop") != "env_error"}
    return out


def _point(iteration: int, outcomes: dict[tuple[str, int], bool]) -> dict[str, Any]:
    est = proportion_ci(sum(outcomes.values()), len(outcomes))
    return {"iteration": iteration, "success": est.mean, "low": est.low, "high": est.high, "episodes": est.n}


def run_verdict(run_dir: Path) -> dict[str, Any] | None:
    """The verdict of the run in ``run_dir`` (module docstring), or None without two recorded evaluations... or
    one: a run with a single evaluation has start = best = final and no gain."""
    evaluations = {i: o for i, o in held_out_outcomes(run_dir).items() if o}
    if not evaluations:
        return None
    iterations = sorted(evaluations)
    first, last = iterations[0], iterations[-1]
    points = {i: _point(i, evaluations[i]) for i in iterations}
    best = max(iterations, key=lambda i: (points[i]["success"], -i))  # the earliest of equal bests
    shared = sorted(set(evaluations[first]) & set(evaluations[last]))
    gain = paired_difference_ci([(evaluations[first][k], evaluations[last][k]) for k in shared])
    return {"start": points[first], "best": points[best], "final": points[last],
            "gain": {"mean": gain.mean, "low": gain.low, "high": gain.high, "pairs": gain.n,
                     "interval": "Newcombe paired (method 10), 95 %, over the same held-out task seeds"},
            "evaluations": len(iterations)}


def _pct(point: dict[str, Any]) -> str:
    return (f"{100 * point['success']:.1f}% [{100 * point['low']:.1f}, {100 * point['high']:.1f}] "
            f"(iteration {point['iteration']}, {point['episodes']} episodes)")


def verdict_line(verdict: dict[str, Any] | None) -> str:
    """One line for the end of a run."""
    if verdict is None:
        return "verdict: no held-out evaluation recorded (--eval-every 0): nothing says whether the run learned"
    gain = verdict["gain"]
    if verdict["start"]["iteration"] != 0:
        start = f"first evaluation {_pct(verdict['start'])} (no evaluation at iteration 0)"
    else:
        start = f"start {_pct(verdict['start'])}"
    return (f"verdict: held-out success {start}, best {_pct(verdict['best'])}, final {_pct(verdict['final'])}; "
            f"final - start {100 * gain['mean']:+.1f} points [{100 * gain['low']:+.1f}, {100 * gain['high']:+.1f}] "
            f"(paired, {gain['pairs']} task seeds, 95 %)")
