"""Held-out success over iterations, one panel per method and one line per seed, with the half-of-start line and
where each run collapsed: the picture of a collapse (e.g. the KL-off stress setting, docs/mini_arena.md).

    python -m eval.collapse_plot runs/stress_kl_off --out docs/stress_kl_off.png

``eval.report``'s dynamics figure averages seeds and, without held-out evaluations, falls back to the rollout
success at the training temperature, which swings by ±0.2 with 64 episodes an iteration: a collapse of one seed
disappears in it. Here every run keeps its own held-out greedy curve (``eval/success_rate``, the same held-out rooms
at every evaluation, iteration 0 being the start). Marked per run:

- ``●`` held-out collapse: the first evaluation from which held-out success stays below half the run's start to
  the end of the run (the criterion docs/mini_arena.md states for the KL-off table);
- ``×`` ``eval.stability``'s post-hoc verdict: its first criterion (e.g. ``kl_blowup@1``), on the curve;
- ``▼`` the in-run alarm's first event (``summary.json``'s ``stability/events``), on the curve.

Prints one line per run (start, lowest, final held-out success, the collapses) as a Markdown table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
import numpy as np  # noqa: E402
import tyro  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from arena_train.safe_files import save_figure  # noqa: E402
from eval.report import Run, env_label, load_runs, method_order  # noqa: E402
from eval.stability import EVAL_SUCCESS_KEY, StabilityConfig  # noqa: E402

HALF = 0.5
"""a run has collapsed on the held-out rooms when its success stays below this fraction of its start"""


@dataclass
class Args:
    runs: tyro.conf.Positional[list[Path]]
    """run folders, or folders of runs (a sweep's runs_dir)"""
    out: Path = Path("reports/collapse.png")
    title: str | None = None
    """figure title; default: the env, whether the KL term was on, and what is plotted"""
    baseline: str = "GRPO"
    """method whose panel comes first"""


@dataclass
class Curve:
    """One run's held-out success curve and where it collapsed (iterations; None where it did not)."""

    method: str
    seed: int
    its: np.ndarray
    success: np.ndarray
    heldout_collapse: float | None
    verdict: str | None
    """``eval.stability``'s first criterion as ``name@iteration``"""
    verdict_iteration: float | None
    alarm: str | None
    """the in-run alarm's first event as ``signal@iteration``"""
    alarm_iteration: float | None

    @property
    def start(self) -> float:
        return float(self.success[0])

    @property
    def lowest(self) -> tuple[float, float]:
        """(lowest held-out success, its first iteration)"""
        index = int(np.argmin(self.success))
        return float(self.success[index]), float(self.its[index])

    @property
    def final(self) -> float:
        return float(self.success[-1])


def heldout_collapse(its: np.ndarray, success: np.ndarray, fraction: float = HALF) -> float | None:
    """The first iteration from which ``success`` stays below ``fraction`` × its first value through the last
    evaluation; None if the last evaluation is not below it (a dip the run came back from is not a collapse)."""
    below = success < fraction * success[0]
    if len(success) < 2 or not below[-1]:
        return None
    start = len(below) - 1
    while start > 0 and below[start - 1]:
        start -= 1
    return float(its[start])


def curve(run: Run) -> Curve | None:
    """The run's held-out curve (finite evaluations only), or None for a run without two of them."""
    its, vals = run.log.series(EVAL_SUCCESS_KEY)
    keep = np.isfinite(vals)
    its, vals = its[keep], vals[keep]
    if len(vals) < 2:
        return None
    first = run.stability.triggers[0] if run.stability.triggers else None
    alarm = run.stability.alarms[0] if run.stability.alarms else None
    return Curve(run.method, run.log.seed or 0, its, vals, heldout_collapse(its, vals),
                 f"{first.criterion}@{first.iteration:g}" if first else None, first.iteration if first else None,
                 f"{alarm.signal}@{alarm.iteration:g}" if alarm else None, alarm.iteration if alarm else None)


def load_curves(paths: list[Path], baseline: str = "GRPO") -> tuple[list[Curve], list[str]]:
    """Curves of every run under ``paths`` (methods in the paper's order, baseline first; seeds ascending), and the
    runs left out with why."""
    runs, problems = load_runs(paths, None, StabilityConfig())
    curves = []
    for run in runs:
        c = curve(run)
        if c is None:
            problems.append(f"{run.log.run_dir}: fewer than two held-out evaluations ({EVAL_SUCCESS_KEY})")
        else:
            curves.append(c)
    order = method_order([c.method for c in curves], baseline)
    return sorted(curves, key=lambda c: (order.index(c.method), c.seed)), problems


def default_title(paths: list[Path]) -> str:
    """``<env>, KL off|on: held-out greedy success (<n> rooms) per method and seed`` from the runs' records."""
    runs, _ = load_runs(paths, None, StabilityConfig())
    envs = sorted({env_label(r.env) for r in runs})
    kl = {r.log.config.get("kl_coef") for r in runs}
    kl_text = "KL off" if kl == {0} else "KL on" if kl and 0 not in kl and None not in kl else "KL mixed"
    rooms = {r.log.config.get("eval_episodes") for r in runs}
    room_text = f" ({rooms.pop()} rooms)" if len(rooms) == 1 and None not in rooms else ""
    return f"{' + '.join(envs)}, {kl_text}: held-out greedy success{room_text} per method and seed"


def _at(c: Curve, iteration: float) -> float:
    """Held-out success drawn at ``iteration`` (on the line between evaluations)."""
    return float(np.interp(iteration, c.its, c.success))


def draw(curves: list[Curve], title: str) -> Figure:
    """One panel per method (seeds as lines, shared axes) and a last panel with the legend."""
    methods = list(dict.fromkeys(c.method for c in curves))
    seeds = sorted({c.seed for c in curves})
    colors = {s: plt.get_cmap("tab10").colors[i % 10] for i, s in enumerate(seeds)}
    cols = min(3, len(methods) + 1)
    rows = math.ceil((len(methods) + 1) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.9 * rows), sharex=True, sharey=True, squeeze=False)
    top = max(float(np.max(c.success)) for c in curves) if curves else 1.0
    for ax, method in zip(axes.flat, methods):
        mine = [c for c in curves if c.method == method]
        for half in sorted({HALF * c.start for c in mine}):
            ax.axhline(half, color="0.3", ls="--", lw=1, zorder=1)
            ax.annotate(f"half of start: {half:.3g}", (1.0, half), xycoords=("axes fraction", "data"),
                        xytext=(-3, -3), textcoords="offset points", ha="right", va="top", fontsize=8, color="0.3")
        for c in mine:
            ax.plot(c.its, c.success, color=colors[c.seed], marker=".", ms=6, lw=1.6, zorder=2)
            if c.heldout_collapse is not None:
                ax.scatter([c.heldout_collapse], [_at(c, c.heldout_collapse)], marker="o", s=90, facecolor="none",
                           edgecolor="red", lw=2, zorder=4)
            for iteration, marker in ((c.verdict_iteration, "x"), (c.alarm_iteration, "v")):
                if iteration is not None:
                    ax.scatter([iteration], [_at(c, iteration)], marker=marker, s=60, color=colors[c.seed], zorder=3)
        flags = sum(c.heldout_collapse is not None for c in mine)
        ax.set_title(f"{method}: held-out collapse in {flags} of {len(mine)} seeds", fontsize=11)
        ax.set_ylim(0, 1.1 * top)
        ax.grid(alpha=0.3)
        ax.tick_params(labelbottom=True, labelleft=True)
        ax.set_xlabel("iteration")
        ax.set_ylabel("held-out success (greedy)")
    legend_ax = axes.flat[len(methods)]
    legend_ax.axis("off")
    handles = [Line2D([], [], color=colors[s], marker=".", lw=1.6, label=f"seed {s}") for s in seeds] + [
        Line2D([], [], color="0.3", ls="--", label="half of the start (iteration 0)"),
        Line2D([], [], ls="", marker="o", ms=9, mfc="none", mec="red", mew=2,
               label="held-out collapse: below half the start\nfrom here to the end"),
        Line2D([], [], ls="", marker="x", ms=8, color="0.2", label="eval.stability verdict, first criterion"),
        Line2D([], [], ls="", marker="v", ms=8, color="0.2", label="in-run alarm, first event"),
    ]
    legend_ax.legend(handles=handles, loc="center", frameon=False, fontsize=10)
    for ax in axes.flat[len(methods) + 1:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=13)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return fig


def table(curves: list[Curve]) -> str:
    """One Markdown row per run: start, lowest (iteration), final, and the three collapse records."""
    lines = ["| method | seed | held-out per evaluation | start | lowest (iteration) | final | held-out collapse | "
             "eval.stability | in-run alarm |", "|---|---|---|---|---|---|---|---|---|"]
    for c in curves:
        low, low_it = c.lowest
        lines.append(f"| {c.method} | {c.seed} | {' / '.join(f'{v:.2f}' for v in c.success)} | {c.start:.2f} | "
                     f"{low:.2f} ({low_it:g}) | {c.final:.2f} | "
                     f"{'no' if c.heldout_collapse is None else f'from {c.heldout_collapse:g}'} | "
                     f"{c.verdict or 'no'} | {c.alarm or 'no'} |")
    return "\n".join(lines)


def main(args: Args) -> int:
    curves, problems = load_curves(args.runs, args.baseline)
    for problem in problems:
        print(f"skipped: {problem}")
    if not curves:
        print("error: no run with held-out evaluations under " + " ".join(map(str, args.runs)))
        return 1
    fig = draw(curves, args.title or default_title(args.runs))
    save_figure(fig, args.out, dpi=100)
    plt.close(fig)
    print(table(curves))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(tyro.cli(Args)))
