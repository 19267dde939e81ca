"""Training dynamics of runs side by side, with the in-run alarm's events marked.

    python -m eval.dynamics runs/a runs/b --out dynamics.png [--labels "no action" rollback]

One panel per metric (held-out and rollout success, gradient norm, entropy, KL to the reference, valid-format
ratio); every run is a line, and each ``stability/events`` entry of its ``summary.json`` a marker at its
iteration (x: warn, v: stop, o: rollback). The picture the paper draws for collapse: success that falls after a
peak, with the signals that announce it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import tyro

from eval.runlog import RunLog

PANELS = (("eval/success_rate", "held-out success"), ("rollout/success_rate", "rollout success"),
          ("actor/grad_norm", "grad norm"), ("actor/entropy", "entropy"), ("actor/kl_ref", "KL to reference"),
          ("rollout/valid_format_ratio", "valid format"))
MARKERS = {"warn": "x", "stop": "v", "rollback": "o"}


def alarm_events(run_dir: Path) -> list[dict]:
    """The run's alarm events (``summary.json``), or none for an unfinished run."""
    path = Path(run_dir) / "summary.json"
    return json.loads(path.read_text()).get("stability/events", []) if path.exists() else []


def plot(run_dirs: list[Path], out: Path, labels: list[str] | None = None, start: float | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5), sharex=True)
    for k, run_dir in enumerate(run_dirs):
        log = RunLog.load(run_dir)
        label = labels[k] if labels else log.name
        color = f"C{k}"
        events = alarm_events(run_dir)
        for ax, (key, title) in zip(axes.flat, PANELS):
            ax.set_title(title, fontsize=10)
            if not log.has(key):
                continue
            its, vals = log.series(key)
            ax.plot(its, vals, color=color, label=label, marker="." if key.startswith("eval/") else None)
            for e in events:
                at = its.tolist().index(e["iteration"]) if e["iteration"] in its.tolist() else None
                if at is not None:
                    ax.plot(its[at], vals[at], MARKERS.get(e["action"], "x"), color=color, markersize=9)
    if start is not None:
        axes.flat[0].axhline(start, color="gray", linestyle="--", label="start (held-out)")
    axes.flat[0].legend(fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("iteration")
    fig.suptitle("training dynamics (markers: alarm x warn, v stop, o rollback)", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


@dataclass
class Args:
    """Plot the dynamics of training runs."""

    runs: tyro.conf.Positional[list[Path]]
    """run directories, each with a metrics.jsonl"""
    out: Path = Path("dynamics.png")
    """the figure"""
    labels: list[str] = field(default_factory=list)
    """one legend label per run (default: the run names)"""
    start: float | None = None
    """held-out success of the runs' start (e.g. the BC checkpoint), drawn as a dashed line"""


def main(args: Args) -> None:
    if args.labels and len(args.labels) != len(args.runs):
        raise SystemExit(f"error: --labels has {len(args.labels)} names for {len(args.runs)} runs; give one per run")
    plot(args.runs, args.out, args.labels or None, args.start)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main(tyro.cli(Args))
