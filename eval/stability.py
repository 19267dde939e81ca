"""Per-run stability diagnostics: best/final success, area under the curve, collapse.

``python -m eval.stability RUN_DIR... [--json out.json] [--success-patience 10 ...]``

Collapse follows the project convention (docs/evaluation.md, "Stability"; the paper states no numeric
criterion). A run has collapsed when any criterion below fires; each reports the
iteration where the bad stretch began (``iteration``) and where it was confirmed
(``confirmed``, onset + patience − 1 logged iterations):

- ``success_drop``: success < ``success_drop`` × running best, for ≥ ``success_patience``
  consecutive logged iterations, once the running best is ≥ ``success_min_peak``
  (a "best" of 0.01 is noise, and halving it is not a collapse);
- ``format``: valid-format ratio < ``format_threshold`` for ≥ ``format_patience``
  iterations, after it has been ≥ the threshold once (never having the format is
  failing to learn, not collapsing);
- ``grad_nonfinite``: a NaN/inf gradient norm;
- ``grad_explode``: gradient norm > ``grad_factor`` × median of the previous
  ``window`` finite values (needs ``min_history`` of them);
- ``kl_blowup``: KL to the reference non-finite, or > max(``kl_floor``,
  ``kl_factor`` × running median) — KL starts near 0, so a ratio alone fires on noise.

Beside this post-hoc verdict, ``alarms`` lists what the run's own in-run alarm (``arena_train.monitor``)
reported and did: the ``stability/events`` of its ``summary.json`` when it finished, else the events rebuilt
from the ``stability/*`` keys of ``metrics.jsonl`` (a signal's first iteration in each stretch it fired, and
every signal of a stop or rollback iteration).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import tyro

from arena_train.monitor import SIGNALS
from eval.runlog import RunLog, RunLogError

SUCCESS_KEY = "rollout/success_rate"
EVAL_SUCCESS_KEY = "eval/success_rate"
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class StabilityConfig:
    """Collapse criteria and summary settings (every field is a CLI flag)."""

    success_key: str = SUCCESS_KEY
    """metric whose curve defines success (best, final, AUC, success_drop)"""
    success_drop: float = 0.5
    """success_drop fires when success < this fraction of its running best ..."""
    success_patience: int = 10
    """... for this many consecutive logged iterations"""
    success_min_peak: float = 0.05
    """the running best must reach this before success_drop can fire"""
    format_key: str = "rollout/valid_format_ratio"
    format_threshold: float = 0.5
    """format fires when the valid-format ratio falls below this ..."""
    format_patience: int = 1
    """... for this many consecutive logged iterations"""
    grad_key: str = "actor/grad_norm"
    grad_factor: float = 10.0
    """grad_explode fires when grad norm > this × running median"""
    kl_key: str = "actor/kl_ref"
    kl_factor: float = 10.0
    """kl_blowup fires when KL > max(kl_floor, this × running median)"""
    kl_floor: float = 0.1
    window: int = 50
    """running medians use at most this many previous finite values"""
    min_history: int = 5
    """running-median criteria need this many previous finite values"""
    final_window: int = 5
    """final success = mean of the last this-many logged values"""


@dataclass(frozen=True)
class Trigger:
    """One collapse criterion that fired: where the bad stretch began and was confirmed."""

    criterion: str
    iteration: float
    confirmed: float
    value: float
    detail: str


@dataclass(frozen=True)
class Alarm:
    """One event of the in-run alarm: a signal that fired and what the run did (warn, stop, rollback)."""

    iteration: float
    signal: str
    action: str
    checkpoint: float | None = None
    onset: float | None = None
    reason: str = ""

    def label(self) -> str:
        act = "" if self.action == "warn" else f"->{self.action}"
        if self.action in ("stop", "rollback") and self.checkpoint is not None:
            act += f"({fmt(self.checkpoint, 6)})"
        return f"{self.signal}@{fmt(self.iteration, 6)}{act}"


@dataclass
class RunStability:
    """Summary of one run; numbers are NaN where the run did not log the metric."""

    run: str
    run_dir: str
    method: str
    env: str
    seed: int | None
    iterations: int
    best_success: float
    best_iteration: float
    final_success: float
    auc_success: float
    eval_best_success: float
    eval_final_success: float
    triggers: list[Trigger] = field(default_factory=list)
    alarms: list[Alarm] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    skipped_lines: int = 0

    @property
    def collapsed(self) -> bool:
        return bool(self.triggers)

    @property
    def collapse_iteration(self) -> float | None:
        return min((t.iteration for t in self.triggers), default=None)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["collapsed"] = self.collapsed
        out["collapse_iteration"] = self.collapse_iteration
        return out


# --- criteria --------------------------------------------------------------------------
def first_sustained(bad: np.ndarray, patience: int) -> tuple[int, int] | None:
    """(start, end) indices of the first run of ≥ ``patience`` consecutive True values."""
    start = None
    for i, flag in enumerate(bad):
        if not flag:
            start = None
            continue
        start = i if start is None else start
        if i - start + 1 >= max(1, patience):
            return start, i
    return None


def _trigger(name: str, its: np.ndarray, vals: np.ndarray, bad: np.ndarray, patience: int, detail: str):
    hit = first_sustained(bad, patience)
    if hit is None:
        return None
    start, end = hit
    return Trigger(name, float(its[start]), float(its[end]), float(vals[start]), detail)


def running_median(vals: np.ndarray, window: int, min_history: int) -> np.ndarray:
    """Median of the previous ≤ ``window`` finite values at each index (NaN when too few)."""
    out = np.full(len(vals), np.nan)
    history: list[float] = []
    for i, v in enumerate(vals):
        if len(history) >= min_history:
            out[i] = float(np.median(history[-window:]))
        if math.isfinite(v):
            history.append(float(v))
    return out


def _success_drop(log: RunLog, cfg: StabilityConfig) -> Trigger | None:
    its, vals = _finite(*log.series(cfg.success_key))
    best = np.maximum.accumulate(vals) if len(vals) else vals
    bad = (best >= cfg.success_min_peak) & (vals < cfg.success_drop * best)
    return _trigger("success_drop", its, vals, bad, cfg.success_patience,
                    f"< {cfg.success_drop:g} x running best for >= {cfg.success_patience} iterations")


def _format(log: RunLog, cfg: StabilityConfig) -> Trigger | None:
    its, vals = _finite(*log.series(cfg.format_key))
    armed = np.maximum.accumulate(vals >= cfg.format_threshold) if len(vals) else vals.astype(bool)
    bad = armed & (vals < cfg.format_threshold)
    return _trigger("format", its, vals, bad, cfg.format_patience,
                    f"valid-format ratio < {cfg.format_threshold:g} for >= {cfg.format_patience} iterations")


def _grad(log: RunLog, cfg: StabilityConfig) -> list[Trigger]:
    its, vals = log.series(cfg.grad_key)
    med = running_median(vals, cfg.window, cfg.min_history)
    with np.errstate(invalid="ignore"):
        exploding = np.isfinite(vals) & (vals > cfg.grad_factor * med)
    found = [
        _trigger("grad_nonfinite", its, vals, ~np.isfinite(vals), 1, "non-finite gradient norm"),
        _trigger("grad_explode", its, vals, exploding, 1, f"> {cfg.grad_factor:g} x running median"),
    ]
    return [t for t in found if t is not None]


def _kl(log: RunLog, cfg: StabilityConfig) -> Trigger | None:
    its, vals = log.series(cfg.kl_key)
    limit = np.fmax(cfg.kl_floor, cfg.kl_factor * running_median(vals, cfg.window, cfg.min_history))
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(vals) | (vals > limit)
    return _trigger("kl_blowup", its, vals, bad, 1,
                    f"non-finite or > max({cfg.kl_floor:g}, {cfg.kl_factor:g} x running median)")


def _finite(its: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = np.isfinite(vals)
    return its[keep], vals[keep]


# --- the in-run alarm --------------------------------------------------------------------
def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def in_run_alarms(log: RunLog) -> list[Alarm]:
    """The run's in-run alarm events: from ``summary.json`` (``stability/events``) when it has them, else rebuilt
    from the ``stability/*`` metrics (no reasons there). Empty for runs without the monitor."""
    try:
        summary = json.loads((log.run_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        summary = None
    events = summary.get("stability/events") if isinstance(summary, dict) else None
    if isinstance(events, list):
        return [Alarm(float(e["iteration"]), str(e["signal"]), str(e.get("action", "warn")),
                      _number(e.get("checkpoint")), _number(e.get("onset")), str(e.get("reason", "")))
                for e in events if isinstance(e, dict) and _number(e.get("iteration")) is not None
                and "signal" in e]
    monitored, _ = log.series("stability/alarms")
    if len(monitored) == 0:
        return []
    acts = {}
    for action in ("rollback", "stop"):
        its, targets = log.series(f"stability/{action}")
        acts.update({it: (action, None if t < 0 else t) for it, t in zip(its, targets)})
    fired = {name: set(log.series(f"stability/{name}")[0]) for name in SIGNALS}
    alarms, previous = [], None
    for it in monitored:
        action, checkpoint = acts.get(it, ("warn", None))
        for name in SIGNALS:
            if it in fired[name] and (action != "warn" or previous not in fired[name]):
                alarms.append(Alarm(float(it), name, action, checkpoint))
        previous = it
    return alarms


# --- summary ---------------------------------------------------------------------------
def curve_summary(its: np.ndarray, vals: np.ndarray, final_window: int) -> tuple[float, float, float, float]:
    """(best, iteration of best, final = mean of last ``final_window``, normalised AUC)."""
    its, vals = _finite(its, vals)
    if len(vals) == 0:
        return math.nan, math.nan, math.nan, math.nan
    best_index = int(np.argmax(vals))
    final = float(np.mean(vals[-max(1, final_window):]))
    span = its[-1] - its[0]
    auc = float(vals[0]) if span <= 0 else float(np.trapezoid(vals, its) / span)
    return float(vals[best_index]), float(its[best_index]), final, auc


def analyze(log: RunLog, cfg: StabilityConfig = StabilityConfig()) -> RunStability:
    """Summarise one loaded run and check every collapse criterion."""
    best, best_it, final, auc = curve_summary(*log.series(cfg.success_key), cfg.final_window)
    eval_best, _, eval_final, _ = curve_summary(*log.series(EVAL_SUCCESS_KEY), 1)
    triggers = [t for t in (_success_drop(log, cfg), _format(log, cfg), _kl(log, cfg)) if t] + _grad(log, cfg)
    triggers.sort(key=lambda t: (t.iteration, t.criterion))
    keys = (cfg.success_key, cfg.format_key, cfg.grad_key, cfg.kl_key)
    return RunStability(
        run=log.name, run_dir=str(log.run_dir), method=log.method, env=log.env, seed=log.seed,
        iterations=len(log.rows), best_success=best, best_iteration=best_it, final_success=final,
        auc_success=auc, eval_best_success=eval_best, eval_final_success=eval_final, triggers=triggers,
        alarms=in_run_alarms(log), unchecked=[k for k in keys if not log.has(k)], skipped_lines=log.skipped_lines,
    )


def analyze_dir(run_dir: str | Path, cfg: StabilityConfig = StabilityConfig()) -> RunStability:
    return analyze(RunLog.load(run_dir), cfg)


def fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


def alarm_text(alarms: list[Alarm]) -> str:
    """``signal@iteration[->action(checkpoint)]`` per event; '-' for a run without the in-run alarm's events."""
    return ", ".join(a.label() for a in alarms) or "-"


def format_table(results: list[RunStability]) -> str:
    """A fixed-width text table, one line per run."""
    header = ("run", "method", "env", "seed", "iters", "best@it", "final", "AUC", "collapse", "in-run alarm")
    lines = [header]
    for r in results:
        collapse = ", ".join(f"{t.criterion}@{fmt(t.iteration, 6)}" for t in r.triggers) or "no"
        lines.append((r.run, r.method, r.env, fmt(r.seed), str(r.iterations),
                      f"{fmt(r.best_success)}@{fmt(r.best_iteration, 6)}", fmt(r.final_success),
                      fmt(r.auc_success), collapse, alarm_text(r.alarms)))
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in lines)


@dataclass
class Args:
    """Stability report over training runs."""

    run_dirs: tyro.conf.Positional[list[Path]]
    """run directories, each with a metrics.jsonl"""
    json: Path | None = None
    """also write the per-run results here"""
    criteria: StabilityConfig = field(default_factory=StabilityConfig)


def main(args: Args) -> int:
    results, status = [], 0
    for run_dir in args.run_dirs:
        try:
            results.append(analyze_dir(run_dir, args.criteria))
        except RunLogError as err:
            print(f"skipped: {err}", file=sys.stderr)
            status = 2
    print(format_table(results))
    for r in results:
        for t in r.triggers:
            print(f"  {r.run}: {t.criterion} from iteration {fmt(t.iteration, 6)} "
                  f"(confirmed {fmt(t.confirmed, 6)}, value {fmt(t.value)}): {t.detail}")
        for a in r.alarms:
            onset = "" if a.onset is None else f", onset {fmt(a.onset, 6)}"
            print(f"  {r.run}: in-run alarm {a.label()}{onset}{': ' + a.reason if a.reason else ''}")
        if r.unchecked:
            print(f"  {r.run}: not logged, not checked: {', '.join(r.unchecked)}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.as_dict() for r in results], indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main(tyro.cli(Args, config=(tyro.conf.OmitArgPrefixes,))))
