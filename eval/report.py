"""Figures and tables from training runs: dynamics plots, the paper-style results table, a report.

``python -m eval.report RUN_DIR... [--results SWEEP_RESULTS.json] --out reports/x``

A mixture run (several ``--env-id``, ``arena_train.mixture``) counts as one run per env, read from its per-env
metrics (``env/<name>/*``, ``eval/<name>/success_rate``), so every table and figure shows each env apart.

Writes into ``--out``: ``dynamics_<env>.png/.pdf`` (success, grad norm, KL, entropy,
valid-format ratio, response length vs iteration; one line per method, mean ± std
band over seeds, collapse onsets marked ×, the runs' first in-run alarms ▼), ``table.md`` / ``table.tex`` (methods ×
envs, score and success as mean ± std over seeds, relative change of the mean vs the
baseline method, plus the paper's row average), ``stability.json`` and a
self-contained ``report.html`` (images inlined) next to ``report.md``.
A directory argument without ``metrics.jsonl`` is searched one level down for runs.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
import numpy as np  # noqa: E402
import tyro  # noqa: E402

from arena_train.mixture import env_name  # noqa: E402
from arena_train.safe_files import atomic_write_text, save_figure  # noqa: E402
from eval.runlog import METRICS_FILE, RunLog, RunLogError  # noqa: E402
from eval.stability import (  # noqa: E402
    EVAL_SUCCESS_KEY,
    RunStability,
    StabilityConfig,
    alarm_text,
    analyze,
    curve_summary,
    fmt,
)
from eval.sweep import METHODS  # noqa: E402

RETURN_KEY = "rollout/episode_return"
PANELS: tuple[tuple[str, str, bool], ...] = (  # (metric, title, log-scale y)
    ("rollout/success_rate", "success rate", False),
    ("actor/grad_norm", "gradient norm", True),
    ("actor/kl_ref", "KL to reference", False),
    ("actor/entropy", "entropy", False),
    ("rollout/valid_format_ratio", "valid-format ratio", False),
    ("rollout/response_length", "response length (tokens)", False),
)


#: A mixture run's per-env metric (``env/<name>/<metric>``) -> the run-level name the tables and figures read.
ENV_METRICS = {"success_rate": "rollout/success_rate", "episode_return": RETURN_KEY,
               "episode_length": "rollout/episode_length", "valid_format_ratio": "rollout/valid_format_ratio",
               "valid_action_ratio": "rollout/valid_action_ratio", "response_length": "rollout/response_length",
               "advantage_abs": "rollout/advantage_abs", "num_rows": "rollout/num_rows"}


@dataclass
class Run:
    log: RunLog
    stability: RunStability
    method: str
    env: str
    dimension: str


@dataclass(frozen=True)
class Cell:
    """mean ± std over ``n`` seeds; ``rel`` = % change of the mean vs the baseline's."""

    mean: float
    std: float
    n: int
    rel: float | None = None


@dataclass
class Table:
    columns: list[str]
    rows: list[tuple[str, str, list[Cell | None], Cell | None]] = field(default_factory=list)
    baseline: str = "GRPO"
    success_source: str = ""


def env_label(env: str) -> str:
    return re.sub(r"-v\d+$", "", env.split("/")[-1])


# --- loading ---------------------------------------------------------------------------
def env_view(log: RunLog, env_id: str) -> RunLog:
    """One env of a mixture run as a run of its own: its ``env/<name>/*`` and ``eval/<name>/success_rate`` under
    the run-level names (``ENV_METRICS``, ``eval/success_rate``); the run's other ``rollout/*`` and ``eval/*``
    (totals over the envs) are left out, the update's ``actor/*`` and the rest kept."""
    name = env_name(env_id)
    rows = []
    for row in log.rows:
        view = {k: v for k, v in row.items() if not k.startswith(("rollout/", "eval/", "env/"))}
        view.update({total: row[f"env/{name}/{key}"] for key, total in ENV_METRICS.items()
                     if f"env/{name}/{key}" in row})
        if f"eval/{name}/success_rate" in row:
            view[EVAL_SUCCESS_KEY] = row[f"eval/{name}/success_rate"]
        rows.append(view)
    return dataclasses.replace(log, rows=rows, meta={**log.meta, "env": env_id})


def find_run_dirs(paths: list[Path]) -> list[Path]:
    """Run directories among ``paths``, looking one level into folders that are not runs."""
    found = []
    for path in paths:
        if (path / METRICS_FILE).is_file() or not path.is_dir():
            found.append(path)
        else:
            found.extend(sorted(p for p in path.iterdir() if (p / METRICS_FILE).is_file()))
    return found


def load_runs(run_dirs: list[Path], results: Path | None, cfg: StabilityConfig) -> tuple[list[Run], list[str]]:
    """Runs from directories and/or a sweep results file; returns (runs, problems)."""
    labels: dict[str, dict] = {}
    problems: list[str] = []
    if results is not None:
        try:
            for entry in json.loads(results.read_text())["runs"]:
                labels[str(Path(entry["run_dir"]).resolve())] = entry
        except (OSError, ValueError, KeyError, TypeError) as err:
            problems.append(f"{results}: not a sweep results file ({err})")
    runs = []
    for run_dir in find_run_dirs(run_dirs) + [Path(k) for k in labels]:
        if any(r.log.run_dir.resolve() == run_dir.resolve() for r in runs):
            continue
        try:
            log = RunLog.load(run_dir)
        except RunLogError as err:
            problems.append(str(err))
            continue
        label = labels.get(str(run_dir.resolve()), {})
        method = str(label.get("method", log.method))
        method = next((m for m in METHODS if m.lower() == method.lower()), method)  # exp_name "gspo" → GSPO
        dimension = str(label.get("dimension") or (METHODS[method].dimension if method in METHODS else ""))
        views = [(env_view(log, e), e) for e in log.env_ids] if len(log.env_ids) > 1 and "env" not in label else [
            (log, str(label.get("env", log.env)))]
        runs += [Run(view, analyze(view, cfg), method, env, dimension) for view, env in views]
    return runs, problems


def method_order(methods: list[str], baseline: str) -> list[str]:
    """Baseline first, then the paper's row order, then anything else alphabetically."""
    known = list(METHODS)
    return sorted(set(methods), key=lambda m: (m != baseline, known.index(m) if m in known else len(known), m))


# --- table -----------------------------------------------------------------------------
def _cell(values: list[float]) -> Cell | None:
    xs = [v for v in values if math.isfinite(v)]
    if not xs:
        return None
    return Cell(float(np.mean(xs)), float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0, len(xs))


def _rel(value: float, base: float) -> float | None:
    return None if base == 0 or not math.isfinite(base) else 100.0 * (value - base) / abs(base)


def results_table(runs: list[Run], baseline: str = "GRPO", source: str = "auto", final_window: int = 5) -> Table:
    """Methods × envs of final score and success (%), the paper's row average, change vs baseline."""
    if source == "auto":
        source = "eval" if runs and all(r.log.has(EVAL_SUCCESS_KEY) for r in runs) else "rollout"
    envs = sorted({r.env for r in runs}, key=env_label)
    table = Table([f"{env_label(e)} {kind}" for e in envs for kind in ("Score", "Succ.")], baseline=baseline,
                  success_source=EVAL_SUCCESS_KEY if source == "eval" else "rollout/success_rate")
    grid: dict[str, list[Cell | None]] = {}
    for method in method_order([r.method for r in runs], baseline):
        cells: list[Cell | None] = []
        for env in envs:
            mine = [r for r in runs if r.method == method and r.env == env]
            score = [curve_summary(*r.log.series(RETURN_KEY), final_window)[2] for r in mine]
            succ = [r.stability.eval_final_success if source == "eval" else r.stability.final_success for r in mine]
            cells += [_cell(score), _cell([100.0 * s for s in succ])]
        grid[method] = cells
    base = grid.get(baseline)
    for method, cells in grid.items():
        present = [i for i, c in enumerate(cells) if c is not None]
        avg = Cell(float(np.mean([cells[i].mean for i in present])), math.nan, 0) if present else None
        if base is not None and method != baseline:
            cells = [None if c is None or base[i] is None else Cell(c.mean, c.std, c.n, _rel(c.mean, base[i].mean))
                     for i, c in enumerate(cells)]
            if avg is not None and all(base[i] is not None for i in present):
                avg = Cell(avg.mean, math.nan, 0, _rel(avg.mean, float(np.mean([base[i].mean for i in present]))))
        dimension = next((r.dimension for r in runs if r.method == method), "")
        table.rows.append((dimension, method, cells, avg))
    return table


def _cell_text(cell: Cell | None, pm: str, pct: str) -> str:
    if cell is None:
        return "–"
    text = f"{cell.mean:.2f}"
    if cell.n > 1:
        text += f" {pm} {cell.std:.2f}"
    if cell.rel is not None:
        text += f" ({cell.rel:+.1f}{pct})"
    return text


def _render(table: Table, fmt_row: Callable[[list[str]], str], pm: str, pct: str,
            escape: Callable[[str], str] = str) -> list[str]:
    """Header + one line per method; ``escape`` applies to labels, not to the formatted numbers."""
    lines = [fmt_row([escape(c) for c in ["Dimension", "Method", *table.columns, "Avg", "Seeds"]])]
    for dimension, method, cells, avg in table.rows:
        seeds = max((c.n for c in cells if c is not None), default=0)
        lines.append(fmt_row([escape(dimension), escape(method), *(_cell_text(c, pm, pct) for c in cells),
                              _cell_text(avg, pm, pct), str(seeds)]))
    return lines


def _caption(table: Table) -> str:
    return (f"Final score (mean episode return) and success (%, from `{table.success_source}`), mean ± std over "
            f"seeds; (±x%) = change of the mean vs {table.baseline}; Avg = mean of the row's cells, compared "
            f"with {table.baseline}'s mean over the same cells.")


def table_markdown(table: Table) -> str:
    lines = _render(table, lambda cells: "| " + " | ".join(cells) + " |", "±", "%")
    lines.insert(1, "|" + "---|" * (len(table.columns) + 4))
    return "\n".join(lines + ["", _caption(table)]) + "\n"


def _tex(text: str) -> str:
    return re.sub(r"([_%&#$])", r"\\\1", text)


def table_latex(table: Table) -> str:
    body = _render(table, lambda cells: " & ".join(cells) + r" \\", r"$\pm$", r"\%", _tex)
    return "\n".join([
        "% " + _caption(table).replace("`", ""),
        r"\begin{tabular}{ll" + "r" * (len(table.columns) + 2) + "}", r"\toprule", body[0], r"\midrule",
        *body[1:], r"\bottomrule", r"\end{tabular}", "",
    ])


def table_html(table: Table) -> str:
    rows = _render(table, lambda cells: "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>", "±", "%",
                   html.escape)
    rows[0] = rows[0].replace("<td>", "<th>").replace("</td>", "</th>")
    return f"<table>{''.join(rows)}</table><p>{html.escape(_caption(table))}</p>"


# --- plots -----------------------------------------------------------------------------
def seed_band(series: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(iterations, mean, std) over seeds on the union of logged iterations (NaN-aware)."""
    its = np.unique(np.concatenate([s[0] for s in series])) if series else np.zeros(0)
    grid = np.full((len(series), len(its)), np.nan)
    for row, (x, y) in enumerate(series):
        grid[row, np.searchsorted(its, x)] = np.where(np.isfinite(y), y, np.nan)
    counts = np.isfinite(grid).sum(axis=0)
    total = np.nansum(grid, axis=0)
    mean = np.divide(total, counts, out=np.full(len(its), np.nan), where=counts > 0)
    var = np.nansum((grid - mean) ** 2, axis=0)
    std = np.sqrt(np.divide(var, counts, out=np.zeros(len(its)), where=counts > 0))
    return its, mean, std


def success_panel(runs: list[Run]) -> tuple[str, str]:
    """(metric, title) of the success panel: held-out success when every run logged it (the rollout success of a
    training batch is noisier and measured on training tasks), else the rollout success, titled as such."""
    if runs and all(r.log.has(EVAL_SUCCESS_KEY) for r in runs):
        return EVAL_SUCCESS_KEY, "held-out success rate (eval/success_rate)"
    return "rollout/success_rate", "rollout success rate (no held-out evaluation logged)"


def plot_dynamics(runs: list[Run], env: str, out_stem: Path, baseline: str = "GRPO") -> list[Path]:
    """One figure per env: a panel per metric, a line per method; returns the files written. The first panel is
    ``success_panel``'s."""
    mine = [r for r in runs if r.env == env]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), squeeze=False)
    methods = method_order([r.method for r in mine], baseline)
    colors = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20").colors
    for panel, (key, title, log_y) in enumerate(PANELS):
        ax = axes.flat[panel]
        if panel == 0:
            key, title = success_panel(mine)
        ax.set_title(title)
        ax.set_xlabel("iteration")
        drawn, positive = False, True
        for m_index, method in enumerate(methods):
            series = [r.log.series(key) for r in mine if r.method == method and r.log.has(key)]
            if not series:
                continue
            its, mean, std = seed_band(series)
            color = colors[m_index % len(colors)]
            ax.plot(its, mean, color=color, label=f"{method} (n={len(series)})", lw=1.5)
            ax.fill_between(its, mean - std, mean + std, color=color, alpha=0.2, lw=0)
            drawn = True
            positive &= bool(np.all(mean[np.isfinite(mean)] > 0))
            if panel == 0:
                _mark_collapses([r for r in mine if r.method == method], its, mean, ax, color)
        if not drawn:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
        elif log_y and positive:
            ax.set_yscale("log")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), frameon=False)
    fig.suptitle(f"{env}: training dynamics (mean ± std over seeds; × = collapse onset, ▼ = first in-run alarm)")
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    paths = [out_stem.with_suffix(".png"), out_stem.with_suffix(".pdf")]
    for path in paths:
        save_figure(fig, path, dpi=110)
    plt.close(fig)
    return paths


def _mark_collapses(runs: list[Run], its: np.ndarray, mean: np.ndarray, ax, color) -> None:
    """× at each run's post-hoc collapse onset, ▼ at its in-run alarm's first event, on the method's curve."""
    for marker, points in (("x", [r.stability.collapse_iteration for r in runs]),
                           ("v", [r.stability.alarms[0].iteration if r.stability.alarms else None for r in runs])):
        points = [p for p in points if p is not None]
        if points:
            ys = np.interp(points, its, np.nan_to_num(mean)) if len(its) else np.zeros(len(points))
            ax.scatter(points, ys, marker=marker, s=70, color=color, zorder=5)


# --- report ----------------------------------------------------------------------------
def stability_rows(runs: list[Run]) -> list[list[str]]:
    rows = [["run", "method", "env", "seed", "best", "final", "AUC", "collapse", "in-run alarm"]]
    for r in sorted(runs, key=lambda r: (r.env, r.method, r.log.seed or 0)):
        s = r.stability
        collapse = ", ".join(f"{t.criterion}@{fmt(t.iteration, 6)}" for t in s.triggers) or "no"
        rows.append([s.run, r.method, r.env, fmt(s.seed), fmt(s.best_success), fmt(s.final_success),
                     fmt(s.auc_success), collapse, alarm_text(s.alarms)])
    return rows


def alarm_lines(runs: list[Run]) -> list[str]:
    """One line per in-run alarm event, with its reason when the run's summary.json recorded it."""
    lines = []
    for r in sorted(runs, key=lambda r: (r.env, r.method, r.log.seed or 0)):
        for a in r.stability.alarms:
            onset = "" if a.onset is None else f" (onset {fmt(a.onset, 6)})"
            lines.append(f"{r.stability.run}: {a.label()}{onset}{': ' + a.reason if a.reason else ''}")
    return lines


def write_report(runs: list[Run], out: Path, baseline: str = "GRPO", source: str = "auto",
                 final_window: int = 5) -> dict[str, Path]:
    """Write every artefact into ``out``; returns name → path."""
    out.mkdir(parents=True, exist_ok=True)
    table = results_table(runs, baseline, source, final_window)
    files = {"table.md": out / "table.md", "table.tex": out / "table.tex", "stability.json": out / "stability.json"}
    atomic_write_text(files["table.md"], table_markdown(table))
    atomic_write_text(files["table.tex"], table_latex(table))
    atomic_write_text(files["stability.json"], json.dumps([r.stability.as_dict() for r in runs], indent=2))
    figures = []
    for env in sorted({r.env for r in runs}, key=env_label):
        png, pdf = plot_dynamics(runs, env, out / f"dynamics_{re.sub(r'[^A-Za-z0-9_.-]', '_', env_label(env))}",
                                 baseline)
        files[png.name], files[pdf.name] = png, pdf
        figures.append((env, png))
    srows = stability_rows(runs)
    md = ["# Results", "", table_markdown(table), "## Training dynamics", ""]
    md += [f"![{env}]({png.name})  \n[PDF]({png.with_suffix('.pdf').name})\n" for env, png in figures]
    md += ["## Stability per run", "", "| " + " | ".join(srows[0]) + " |", "|" + "---|" * len(srows[0])]
    md += ["| " + " | ".join(row) + " |" for row in srows[1:]]
    alarms = alarm_lines(runs)
    if alarms:
        md += ["", "In-run alarm events:", ""] + [f"- {line}" for line in alarms]
    files["report.md"] = out / "report.md"
    atomic_write_text(files["report.md"], "\n".join(md) + "\n")
    imgs = "".join(f"<h3>{html.escape(env)}</h3><img alt='{html.escape(env)}' src='data:image/png;base64,"
                   f"{base64.b64encode(png.read_bytes()).decode()}'>" for env, png in figures)
    cells = lambda row, tag: "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in row)  # noqa: E731
    stab = "<table><tr>" + cells(srows[0], "th") + "</tr>" + "".join(
        f"<tr>{cells(row, 'td')}</tr>" for row in srows[1:]) + "</table>"
    if alarms:
        stab += "<p>In-run alarm events:</p><ul>" + "".join(f"<li>{html.escape(a)}</li>" for a in alarms) + "</ul>"
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}img{max-width:100%}")
    files["report.html"] = out / "report.html"
    atomic_write_text(
        files["report.html"],
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>ARLArena report</title><style>{style}</style>"
        f"</head><body><h1>Results</h1>{table_html(table)}<h2>Training dynamics</h2>{imgs}"
        f"<h2>Stability per run</h2>{stab}</body></html>\n")
    return files


@dataclass
class Args:
    """Plots, results table and report from training runs."""

    run_dirs: tyro.conf.Positional[list[Path]] = field(default_factory=list)
    """run directories (or folders of runs)"""
    results: Path | None = None
    """a sweep results file (python -m eval.sweep ... collect)"""
    out: Path = Path("reports/latest")
    baseline: str = "GRPO"
    """method the relative changes are computed against"""
    source: Literal["auto", "rollout", "eval"] = "auto"
    """success metric of the table: eval/success_rate, rollout/success_rate, or eval when every run logged it"""
    criteria: StabilityConfig = field(default_factory=StabilityConfig)


def main(args: Args) -> int:
    runs, problems = load_runs(args.run_dirs, args.results, args.criteria)
    for problem in problems:
        print(f"skipped: {problem}", file=sys.stderr)
    if not runs:
        print("error: no runs with a metrics.jsonl found", file=sys.stderr)
        return 2
    files = write_report(runs, args.out, args.baseline, args.source, args.criteria.final_window)
    print(f"{len(runs)} runs -> {args.out}: {', '.join(sorted(files))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(tyro.cli(Args, config=(tyro.conf.OmitArgPrefixes,))))
