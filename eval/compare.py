"""The paper's comparison from a sweep's final models: held-out success and score per method over seeds, the
change against a baseline method paired by room, and each run's collapse verdict.

    python -m eval.compare runs/mini_arena_sweep --out reports/mini_arena [--baseline GRPO --episodes 300]

Every run's ``final`` model plays the same ``--episodes`` held-out rooms greedily (``eval.mini_arena``'s
evaluation: the main job's rooms, so BC, teacher and methods are comparable), cached in the run's
``final_eval.json``. Per method: success over every (seed, room) episode with a Wilson 95 % interval at the
effective sample size the spread over seeds leaves (``arena_train.stats.clustered_proportion_ci``: a rate stays inside
[0, 100], which a t-interval over 2-3 seeds does not); score as the mean over seeds with a Student-t 95 % interval
over seeds; the change against the baseline as the mean over seeds of the per-seed difference (t over seeds) and,
tighter, pooled over every (seed, room) pair (t over pairs, the rooms being paired). Each t-interval says over how
many seeds or pairs it was taken, since with 2-3 seeds its width is mostly the t quantile. Collapse is
``eval.stability``'s verdict on the in-run curves, with the seed and the first collapsing iteration. Writes
``compare.md`` and ``compare.json`` into ``--out``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import tyro

from arena_train.stats import Estimate, clustered_proportion_ci, mean_ci


@dataclass
class Args:
    runs: tyro.conf.Positional[list[Path]]
    """run folders, or folders of runs (a sweep's runs_dir)"""
    out: Path = Path("reports/compare")
    baseline: str = "GRPO"
    episodes: int = 300
    """held-out rooms each final model plays (the same rooms for every run)"""


@dataclass
class MethodRow:
    method: str
    dimension: str
    seeds: list[int]
    success: list[float]  # per seed, %
    score: list[float]  # per seed
    wins: dict[int, list[int]] = field(default_factory=dict)  # seed -> per-room outcome
    collapses: list[str] = field(default_factory=list)  # "s<seed>@<iteration> (<criterion>)"


def final_eval(run_dir: Path, episodes: int) -> dict:
    """The run's final model on the first ``episodes`` held-out rooms: {"wins": [...], "score": mean return},
    read from ``final_eval.json`` when it holds as many rooms."""
    cache = run_dir / "final_eval.json"
    if cache.is_file():
        cached = json.loads(cache.read_text())
        if len(cached["wins"]) == episodes:
            return cached
    from arena_train.rollout import EVAL_SEED_OFFSET
    from eval import mini_arena

    saved = json.loads((run_dir / "args.json").read_text())
    env_ids = saved["env_id"] if isinstance(saved["env_id"], list) else [saved["env_id"]]
    args = mini_arena.resolve(mini_arena.Args(env_id=env_ids[0], max_response_tokens=saved["max_response_tokens"]))
    result, wins = mini_arena.evaluate_model(args, run_dir / "final", run_dir.name,
                                             [EVAL_SEED_OFFSET + k for k in range(episodes)])
    record = {"wins": wins, "score": result.score.mean}
    cache.write_text(json.dumps(record))
    return record


def method_rows(run_paths: list[Path], episodes: int) -> list[MethodRow]:
    from eval.report import load_runs, method_order
    from eval.stability import StabilityConfig

    runs, problems = load_runs(run_paths, None, StabilityConfig())
    for problem in problems:
        print(f"skipped: {problem}")
    rows: dict[str, MethodRow] = {}
    for run in sorted(runs, key=lambda r: r.log.seed or 0):
        if not (run.log.run_dir / "final").is_dir():
            print(f"skipped (unfinished): {run.log.run_dir}")
            continue
        seed = run.log.seed or 0
        row = rows.setdefault(run.method, MethodRow(run.method, run.dimension, [], [], []))
        result = final_eval(run.log.run_dir, episodes)
        row.seeds.append(seed)
        row.wins[seed] = result["wins"]
        row.success.append(100 * sum(result["wins"]) / len(result["wins"]))
        row.score.append(result["score"])
        row.collapses += [f"s{seed}@{t.iteration:g} ({t.criterion})" for t in run.stability.triggers[:1]]
    return [rows[m] for m in method_order(list(rows), "GRPO")]


def against(row: MethodRow, base: MethodRow) -> tuple[Estimate, Estimate]:
    """(mean over the common seeds of the per-seed success difference, pooled per-room difference), in points."""
    common = [s for s in row.seeds if s in base.wins]
    per_seed = [100 * (sum(row.wins[s]) - sum(base.wins[s])) / len(row.wins[s]) for s in common]
    pooled = [100 * (a - b) for s in common for a, b in zip(row.wins[s], base.wins[s])]
    return mean_ci(per_seed), mean_ci(pooled)


def success_ci(row: MethodRow) -> Estimate:
    """The method's success in % over all its (seed, room) episodes: a Wilson interval whose sample size the
    spread between seeds shrinks (the rooms of one seed share a model); ``n`` counts seeds."""
    e = clustered_proportion_ci([row.wins[s] for s in row.seeds])
    return Estimate(100 * e.mean, 100 * e.low, 100 * e.high, e.n)


def interval(e: Estimate, digits: int = 1, over: str = "") -> str:
    """``mean [low, high]``; with ``over`` (a t-interval's unit: "seeds", "pairs") the count it was taken over."""
    if e.n == 0:
        return "–"
    if e.n == 1:
        return f"{e.mean:.{digits}f}" + (f" (1 {over.removesuffix('s')})" if over else "")
    return f"{e.mean:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]" + (f" (t, {e.n} {over})" if over else "")


def table(rows: list[MethodRow], baseline: str) -> str:
    base = next((r for r in rows if r.method == baseline), None)
    lines = [f"| dimension | method | seeds | success % (Wilson) | score | Δ success vs {baseline} (points, over "
             f"seeds) | Δ vs {baseline}, pooled paired by room | collapse | success per seed % |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        seed_delta, pooled = against(r, base) if base is not None and r is not base else (None, None)
        lines.append("| " + " | ".join([
            r.dimension, r.method, str(len(r.seeds)), interval(success_ci(r)), interval(mean_ci(r.score), 2, "seeds"),
            interval(seed_delta, over="seeds") if seed_delta else "", interval(pooled, over="pairs") if pooled else "",
            ", ".join(r.collapses) or "no", " / ".join(f"{x:.1f}" for x in r.success)]) + " |")
    return "\n".join(lines)


def main(args: Args) -> int:
    rows = method_rows(args.runs, args.episodes)
    if not rows:
        print("error: no finished runs (folders with metrics.jsonl and final/) under " + " ".join(map(str, args.runs)))
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(rows, args.baseline)
    (args.out / "compare.md").write_text(
        f"Final models on {args.episodes} held-out rooms (greedy); 95 % intervals: success Wilson over the (seed, room)"
        f" episodes at the effective sample size the spread over seeds leaves; score and Δ Student-t over the seeds or"
        f" (seed, room) pairs each names.\n\n{text}\n")
    (args.out / "compare.json").write_text(json.dumps(
        [{"method": r.method, "dimension": r.dimension, "seeds": r.seeds, "success": r.success, "score": r.score,
          "collapses": r.collapses} for r in rows], indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(tyro.cli(Args)))
