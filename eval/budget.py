"""SFT/RL budget recipe: split one fixed training budget between BC and RL — ``python -m eval.budget``.

The Practitioner's Guide (arXiv 2510.01132) asks for the best split of a fixed compute budget between SFT and RL.
Each point of the curve spends ``--budget-s`` seconds of training: a share ``r`` on RL iterations and ``1 - r`` on
BC steps, converted with the measured cost of one BC step (its validation checks included) and of one RL
iteration (its rollouts, scoring and update), so a point's step counts follow from the seeds and the flags alone
and every point is reproducible. The measured seconds of each stage are recorded beside the plan.

Per (share, pipeline seed): BC for its steps (cosine schedule over them, the best validation checkpoint kept, no
early stop: the budget is spent), then the mini-arena's RL script for its iterations from that checkpoint, then
the final model greedy on the held-out seeds (``eval.mini_arena``'s stages). The curve is final held-out success
against the RL share; the recommended split is the share with the highest mean **final** success over seeds (a
weaker BC start inflates the RL gain, so the gain is reported but not used to choose).

    python -m eval.budget --budget-s 840 --rl-shares 0 0.25 0.5 0.75 --seeds 1 2 3
    python -m eval.budget --arena.env-id ARL/Sokoban-v0     # any env with an expert
    python -m eval.budget --merge runs/b1 runs/b2 --out runs/budget   # one curve from parallel runs
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from arena_train.rollout import EVAL_SEED_OFFSET
from arena_train.stats import mean_ci, pct_ci
from eval import mini_arena


@dataclass
class Args:
    """Final held-out success against the RL share of a fixed BC + RL budget, over pipeline seeds."""

    budget_s: float = 840.0
    """training seconds per point (BC + RL; evaluation excluded); 840 s = 14 min, the main job's <= 15 min"""
    rl_shares: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75])
    """fractions of the budget given to RL (each in [0, 1); BC gets the rest and at least one step)"""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """pipeline seeds; every share runs on every seed"""
    bc_step_s: float = 0.25
    """seconds of one BC step, validation checks included (tiny profile, 1 thread, loaded 2-core machine)"""
    rl_iteration_s: float = 3.5
    """seconds of one RL iteration of the mini-arena's RL script (SAMPO, tiny profile, same machine)"""
    rl_startup_s: float = 15.0
    """fixed seconds of an RL stage besides its iterations (the script's imports, model loads, final save)"""
    arena: mini_arena.Args = field(default_factory=mini_arena.Args)
    """mini-arena settings of every point, e.g. --arena.env-id ARL/Sokoban-v0 --arena.rl-script grpo (its seeds,
    out, BC step count and target, RL iterations and skip-rl are set per point)"""
    out: Path = Path("runs/budget")
    """output folder: <out>/share<r>/seed<s>/{bc,<rl-script>}, results.json, report.md, budget_curve.png"""
    keep_models: bool = False
    """keep every point's BC and RL model folders (they are deleted after evaluation otherwise)"""
    merge: list[Path] = field(default_factory=list)
    """instead of running: one curve from these finished --out folders (same budget and settings; each
    (share, seed) once), written to --out; run shares or seeds in parallel processes, then merge"""


def split_budget(budget_s: float, rl_share: float, bc_step_s: float, rl_iteration_s: float,
                 rl_startup_s: float = 0.0) -> tuple[int, int]:
    """(BC steps, RL iterations) that spend ``1 - rl_share`` and ``rl_share`` of ``budget_s`` at the given unit
    costs, the RL stage's fixed start-up cost included (rounded down; BC at least one step)."""
    if not 0.0 <= rl_share < 1.0:
        raise ValueError(f"an RL share must be in [0, 1), got {rl_share}")
    if budget_s <= 0 or bc_step_s <= 0 or rl_iteration_s <= 0 or rl_startup_s < 0:
        raise ValueError("the budget and the unit costs must be > 0 (the start-up cost >= 0)")
    bc_steps = max(1, math.floor((1.0 - rl_share) * budget_s / bc_step_s + 1e-9))
    rl_iterations = max(0, math.floor((rl_share * budget_s - rl_startup_s) / rl_iteration_s + 1e-9))
    return bc_steps, rl_iterations


def arena_settings(args: Args, bc_steps: int, rl_iterations: int, seed: int, out: Path) -> mini_arena.Args:
    """The mini-arena settings of one point: its profile and flags, the point's step counts, no BC early stop."""
    base = dataclasses.replace(args.arena)
    base.bc_max_steps, base.bc_target, base.seeds, base.out = bc_steps, 1.0, [seed], out
    base.skip_rl = rl_iterations == 0
    base.rl_iterations = max(rl_iterations, 1)
    resolved = mini_arena.resolve(base)
    resolved.rl_eval_every = 0  # no held-out checks inside RL: evaluation is not part of the budget
    resolved.bc_eval_start = min(resolved.bc_eval_start, bc_steps)
    return resolved


def run_point(args: Args, share: float, seed: int) -> dict[str, Any]:
    """BC -> RL -> held-out evaluation of one (share, seed); returns its record."""
    bc_steps, rl_iterations = split_budget(args.budget_s, share, args.bc_step_s, args.rl_iteration_s, args.rl_startup_s)
    point_dir = args.out / f"share{share:g}" / f"seed{seed}"
    point_dir.mkdir(parents=True, exist_ok=True)
    arena = arena_settings(args, bc_steps, rl_iterations, seed, point_dir)
    print(f"[share {share:g} seed {seed}] BC {bc_steps} steps, RL {rl_iterations} iterations", flush=True)
    t0 = time.perf_counter()
    bc = mini_arena.run_bc(arena, seed, point_dir / "bc")
    timing = {"bc_s": time.perf_counter() - t0}
    final_path = point_dir / "bc"
    if rl_iterations > 0:
        t1 = time.perf_counter()
        rl = mini_arena.run_rl(arena, seed, point_dir / "bc", point_dir)
        timing["rl_s"] = time.perf_counter() - t1
        final_path = Path(rl["model"])
    t2 = time.perf_counter()
    seeds = [EVAL_SEED_OFFSET + k for k in range(arena.eval_episodes)]
    bc_result, bc_wins = mini_arena.evaluate_model(arena, point_dir / "bc", "BC start", seeds)
    record: dict[str, Any] = {"share": share, "seed": seed, "bc_steps": bc_steps, "rl_iterations": rl_iterations,
                              "bc_best_step": bc["step"], "bc_val_success": bc["val_success"],
                              "bc_success": bc_result.success.mean, "final_success": bc_result.success.mean,
                              "gain": 0.0}
    if rl_iterations > 0:
        rl_result, rl_wins = mini_arena.evaluate_model(arena, final_path, arena.rl_script.upper(), seeds)
        record.update(final_success=rl_result.success.mean,
                      gain=float(np.mean(rl_wins) - np.mean(bc_wins)))
    timing["eval_s"] = time.perf_counter() - t2
    record["timing"] = timing
    record["train_s"] = timing["bc_s"] + timing.get("rl_s", 0.0)
    if not args.keep_models:
        shutil.rmtree(point_dir / "bc", ignore_errors=True)
        shutil.rmtree(point_dir / arena.rl_script, ignore_errors=True)
        shutil.rmtree(point_dir / "init", ignore_errors=True)
    print(f"[share {share:g} seed {seed}] final held-out success {record['final_success']:.3f} "
          f"(BC {record['bc_success']:.3f}), {record['train_s']:.0f} s of training", flush=True)
    return record


def summarize(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per share: mean over seeds (Student-t 95 % intervals) of final success, BC start, gain and training time."""
    rows = []
    for share in sorted({p["share"] for p in points}):
        ps = [p for p in points if p["share"] == share]
        est = {key: mean_ci([p[key] for p in ps]) for key in ("final_success", "bc_success", "gain")}
        rows.append({"share": share, "n": len(ps), "bc_steps": ps[0]["bc_steps"],
                     "rl_iterations": ps[0]["rl_iterations"], "train_s": float(np.mean([p["train_s"] for p in ps])),
                     **{key: {"mean": e.mean, "low": e.low, "high": e.high} for key, e in est.items()}})
    return rows


def best_share(summary: list[dict[str, Any]]) -> float:
    """The share with the highest mean final held-out success (ties: the smaller RL share)."""
    return max(summary, key=lambda row: (row["final_success"]["mean"], -row["share"]))["share"]


def plot_curve(points: list[dict[str, Any]], summary: list[dict[str, Any]], path: Path, budget_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    shares = [row["share"] for row in summary]
    for key, style, label in (("final_success", "o-", "final (after RL)"), ("bc_success", "s--", "BC start")):
        means = [row[key]["mean"] for row in summary]
        err = [[m - row[key]["low"] for m, row in zip(means, summary)],
               [row[key]["high"] - m for m, row in zip(means, summary)]]
        ax.errorbar(shares, means, yerr=err, fmt=style, capsize=3, label=f"{label}, mean over seeds")
    ax.scatter([p["share"] for p in points], [p["final_success"] for p in points], s=10, color="grey", alpha=0.6,
               label="final, one seed")
    ax.set(xlabel="RL share of the training budget", ylabel="held-out success", ylim=(0, 1),
           title=f"BC/RL split of a {budget_s:.0f} s budget")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(results: dict[str, Any], out: Path) -> str:
    a, summary = results["args"], results["summary"]
    lines = [f"# BC/RL budget split: {a['budget_s']:.0f} s of training per point", "",
             f"Unit costs: {a['bc_step_s']} s per BC step, {a['rl_iteration_s']} s per RL iteration plus "
             f"{a['rl_startup_s']} s per RL stage; seeds "
             f"{a['seeds']}; held-out greedy success, mean over seeds with 95 % t-intervals.", "",
             "| RL share | BC steps | RL iterations | final success % | BC start % | RL gain (points) | measured "
             "training s |", "|---|---|---|---|---|---|---|"]
    for row in summary:
        lines.append(f"| {row['share']:g} | {row['bc_steps']} | {row['rl_iterations']} "
                     f"| {pct_ci(row['final_success'])} | {pct_ci(row['bc_success'])} | {pct_ci(row['gain'])} "
                     f"| {row['train_s']:.0f} |")
    lines += ["", f"Best split by final held-out success: RL share {results['best_share']:g}.", "",
              "![budget curve](budget_curve.png)", ""]
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    return text


def merge_points(folders: list[Path]) -> dict[str, Any]:
    """One results record from several finished budget folders (same settings; each (share, seed) once)."""
    records = mini_arena.read_finished(folders, ignore=("seeds", "rl_shares", "out", "merge", "keep_models"))
    points = [p for r in records for p in r["points"]]
    if len({(p["share"], p["seed"]) for p in points}) != len(points):
        raise SystemExit("--merge: a (share, seed) point appears twice")
    summary = summarize(points)
    args = {**records[0]["args"], "seeds": sorted({p["seed"] for p in points}),
            "rl_shares": [row["share"] for row in summary]}
    return {"args": args, "points": points, "summary": summary, "best_share": best_share(summary),
            "wall_s": sum(r["wall_s"] for r in records), "merged_from": [str(f) for f in folders]}


def main(args: Args) -> dict[str, Any]:
    import torch
    from transformers.utils import logging as hf_logging

    if args.merge:
        results = merge_points(args.merge)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
        plot_curve(results["points"], results["summary"], args.out / "budget_curve.png", results["args"]["budget_s"])
        print(write_report(results, args.out))
        return results
    if not args.seeds or not args.rl_shares:
        raise SystemExit("--seeds and --rl-shares need at least one value each")
    try:
        plans = {share: split_budget(args.budget_s, share, args.bc_step_s, args.rl_iteration_s, args.rl_startup_s)
                 for share in args.rl_shares}
    except ValueError as e:
        raise SystemExit(str(e)) from None
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    print("plan: " + ", ".join(f"share {s:g} -> BC {b} steps + RL {r} it." for s, (b, r) in plans.items()), flush=True)
    start = time.perf_counter()
    points = [run_point(args, share, seed) for share in args.rl_shares for seed in args.seeds]
    summary = summarize(points)
    results = {"args": json.loads(json.dumps(asdict(args), default=str)),
               "points": points, "summary": summary, "best_share": best_share(summary),
               "wall_s": time.perf_counter() - start}
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    plot_curve(points, summary, args.out / "budget_curve.png", args.budget_s)
    print(write_report(results, args.out))
    return results


if __name__ == "__main__":
    import tyro

    main(tyro.cli(Args))
