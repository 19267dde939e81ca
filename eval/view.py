"""The viewer: one self-contained HTML page of a run or of an episodes file, to open in a browser.

    python -m eval.view runs/<name>                 # writes runs/<name>/view.html
    python -m eval.view episodes.jsonl --out v.html  # eval.evaluate --episodes, or one file of a run's episodes/

The page needs nothing outside itself (no network, no external script, style or font):
* first, the held-out success curve with its 95 % Wilson intervals beside the rollout success (inline SVG, drawn
  here from ``metrics.jsonl`` and the held-out episode records), and the run's verdict (``summary.json``);
* the episode list with filters (source, env, iteration, won/failed, stop reason);
* one episode as a conversation, turn by turn (what the model saw that was new, its response, the parsed action,
  validity, reward, stop reason, advantage);
* the group of that episode: its G episodes side by side with their returns and per-turn advantages.

The filters and the open episode live in the URL's fragment (``#won=0&stop=max_turns&episode=12``), so a view
can be linked, and a page opened with a fragment shows it (the browser test drives the page that way).

Model and env text is data, never markup: the records travel as JSON in a ``<script type="application/json">``
element with ``<``, ``>`` and ``&`` written as ``\\u003c``, ``\\u003e`` and ``\\u0026`` (no text can close the
element), and the page's script puts text into the document with ``textContent`` only.

The page is bounded (``--max-bytes``, default 4 MB of episodes): the episodes of the first, best and last held-out
evaluations go in first, then training episodes of iterations spread evenly over the run, then the other
evaluations, each turn's text cut to ``--turn-chars``; the page says how many episodes it holds of how many recorded.
"""

from __future__ import annotations

import html
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tyro

from arena_train.episodes import EPISODES_DIR, read_episodes
from eval.stats import proportion_ci


@dataclass
class Args:
    """Write the viewer page of a run folder or an episodes file."""

    source: tyro.conf.Positional[Path]
    """a run folder (runs/<name>) or an episodes JSONL file (or a folder of them)"""
    out: Path | None = None
    """the page (default: <run>/view.html, or the file's name with .html)"""
    max_bytes: int = 4_000_000
    """the most bytes of episode data in the page (whole episodes are left out past it)"""
    turn_chars: int = 1500
    """characters kept of each text of a turn in the page (the records keep more)"""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}\n[... {len(text) - limit} more characters in the file]"


def page_episode(record: dict[str, Any], turn_chars: int) -> dict[str, Any]:
    """A record as the page holds it: turn texts cut to ``turn_chars``."""
    turns = [{**t, "response": _cut(t.get("response") or "", turn_chars),
              "seen": [{"role": m.get("role", ""), "content": _cut(m.get("content", ""), turn_chars)}
                       for m in t.get("seen") or []]} for t in record.get("turns", [])]
    return {**record, "turns": turns}


def _spread(values: list[int], k: int) -> list[int]:
    """``k`` of the sorted ``values`` spread evenly (first and last included)."""
    if k >= len(values):
        return values
    if k <= 1:
        return values[-1:]
    return sorted({values[round(i * (len(values) - 1) / (k - 1))] for i in range(k)})


def choose_episodes(records: list[dict[str, Any]], max_bytes: int, turn_chars: int
                    ) -> list[dict[str, Any]]:
    """The episodes that go into the page, at most ``max_bytes`` of JSON: held-out episodes of the first, best
    and last evaluations, then training episodes by iterations spread over the run (halving the spacing until the
    budget is spent), then the other evaluations."""
    evals: dict[Any, list] = {}
    train: dict[Any, list] = {}
    for r in records:
        (evals if r.get("source") == "eval" else train).setdefault(r.get("iteration"), []).append(r)
    order: list[list[dict[str, Any]]] = []
    rest: list[list[dict[str, Any]]] = []
    if evals:
        its = sorted(evals, key=lambda i: (i is None, i if i is not None else 0))
        rate = {i: sum(r["won"] for r in evals[i]) / len(evals[i]) for i in its}
        best = max(its, key=lambda i: rate[i])
        first = [its[0], best, its[-1]]
        order += [evals[i] for i in dict.fromkeys(first)]
        rest += [evals[i] for i in its if i not in first]
    its = sorted(train, key=lambda i: (i is None, i if i is not None else 0))
    taken: set = set()
    k = 2
    while len(taken) < len(its):
        for i in _spread(its, k):
            if i not in taken:
                taken.add(i)
                order.append(train[i])
        k *= 2
    order += rest
    chosen, size = [], 0
    for block in order:
        for record in block:
            item = page_episode(record, turn_chars)
            n = len(json_for_script(item).encode()) + 1  # as the page holds it, with its comma
            if size + n > max_bytes:
                return chosen
            chosen.append(item)
            size += n
    return chosen


def _metrics(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    from arena_train.logger import read_metric_lines

    by_iteration = {r["iteration"]: r for r in read_metric_lines(path)}  # a resumed run: the last line wins
    return [by_iteration[i] for i in sorted(by_iteration)]


def curves(metrics: list[dict[str, Any]], records: list[dict[str, Any]], default_n: int
           ) -> tuple[list[tuple[float, float]], list[tuple[float, float, float, float]]]:
    """(rollout success points, held-out points with Wilson bounds) of a run: (iteration, rate) and
    (iteration, rate, low, high); a held-out rate's n is its recorded episodes, else ``default_n``."""
    counted: dict[int, int] = {}
    for r in records:
        if r.get("source") == "eval" and r.get("stop") != "env_error":
            counted[r["iteration"]] = counted.get(r["iteration"], 0) + 1
    rollout, held_out = [], []
    for m in metrics:
        value = m.get("rollout/success_rate")
        if isinstance(value, (int, float)) and math.isfinite(value):
            rollout.append((m["iteration"], float(value)))
        value = m.get("eval/success_rate")
        if isinstance(value, (int, float)) and math.isfinite(value):
            n = counted.get(m["iteration"], default_n)
            est = proportion_ci(round(value * n), n) if n > 0 else None
            held_out.append((m["iteration"], float(value), est.low if est else value, est.high if est else value))
    return rollout, held_out


def success_svg(rollout: list[tuple[float, float]], held_out: list[tuple[float, float, float, float]],
                width: int = 760, height: int = 300) -> str:
    """The success chart: rollout success as a thin line, held-out success as points with interval bars."""
    if not rollout and not held_out:
        return "<p>No success figures recorded (no metrics.jsonl).</p>"
    left, right, top, bottom = 48, 16, 16, 40
    its = [p[0] for p in rollout] + [p[0] for p in held_out]
    lo, hi = min(its), max(its)
    span = (hi - lo) or 1

    def x(i: float) -> float:
        return left + (i - lo) / span * (width - left - right)

    def y(v: float) -> float:
        return top + (1 - v) * (height - top - bottom)

    parts = [f'<svg id="curve" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="success over iterations">']
    for v in (0, 0.25, 0.5, 0.75, 1):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>'
                     f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{int(v * 100)}%</text>')
    for i in sorted({round(lo + k * span / 5) for k in range(6)}):
        parts.append(f'<text x="{x(i):.1f}" y="{height - bottom + 16}" text-anchor="middle">{i}</text>')
    parts.append(f'<text x="{(left + width - right) / 2}" y="{height - 6}" text-anchor="middle">iteration</text>')
    if rollout:
        path = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in rollout)
        parts.append(f'<polyline points="{path}" class="rollout"/>')
    if held_out:
        path = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v, _, _ in held_out)
        parts.append(f'<polyline points="{path}" class="heldout"/>')
        for i, v, low, high in held_out:
            parts.append(f'<line x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{y(low):.1f}" y2="{y(high):.1f}" class="ci"/>'
                         f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3.5" class="heldout-point">'
                         f'<title>iteration {i}: {100 * v:.1f}% [{100 * low:.1f}, {100 * high:.1f}]</title></circle>')
    parts.append(f'<g class="legend"><line x1="{width - 300}" x2="{width - 280}" y1="{top + 8}" y2="{top + 8}" '
                 f'class="heldout"/><text x="{width - 275}" y="{top + 12}">held-out success (95% Wilson)</text>'
                 f'<line x1="{width - 300}" x2="{width - 280}" y1="{top + 26}" y2="{top + 26}" class="rollout"/>'
                 f'<text x="{width - 275}" y="{top + 30}">rollout success</text></g></svg>')
    return "".join(parts)


def json_for_script(value: Any) -> str:
    """``value`` as JSON that no text inside it can end the ``<script>`` element holding it."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def verdict_html(summary: dict[str, Any] | None) -> str:
    if not summary or not summary.get("verdict"):
        return ""
    from arena_train.verdict import verdict_line

    return f'<p id="verdict">{html.escape(verdict_line(summary["verdict"]))}</p>'


def build_page(title: str, episodes: list[dict[str, Any]], total: int, svg: str, summary_html: str) -> str:
    data = json_for_script({"episodes": episodes, "total": total})
    return (_TEMPLATE.replace("__TITLE__", html.escape(title)).replace("__SVG__", svg)
            .replace("__VERDICT__", summary_html).replace("__DATA__", data))


def make_view(source: Path, out: Path | None = None, max_bytes: int = 4_000_000, turn_chars: int = 1500) -> Path:
    """Write the page of ``source`` (a run folder, an episodes file or a folder of them) -> its path."""
    if not source.exists():
        raise SystemExit(f"error: {source} does not exist; pass a run folder (runs/<name>) or an episodes .jsonl file")
    run = source if (source / "metrics.jsonl").is_file() or (source / EPISODES_DIR).is_dir() else None
    if run is not None:
        folder = run / EPISODES_DIR
        records = read_episodes(folder) if folder.is_dir() else []
        metrics = _metrics(run)
        try:
            config = json.loads((run / "args.json").read_text())
        except (OSError, ValueError):
            config = {}
        try:
            summary = json.loads((run / "summary.json").read_text())
        except (OSError, ValueError):
            summary = None
        n_envs = len(config.get("env_id") or [1]) if isinstance(config.get("env_id"), list) else 1
        rollout, held_out = curves(metrics, records, int(config.get("eval_episodes") or 0) * n_envs)
        svg, summary_html = success_svg(rollout, held_out), verdict_html(summary)
        out = out or run / "view.html"
    else:
        records = read_episodes(source)
        svg, summary_html = "", ""
        out = out or source.with_suffix(".html")
    episodes = choose_episodes(records, max_bytes, turn_chars)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(build_page(source.name, episodes, len(records), svg, summary_html), encoding="utf-8")
    return out


def main(args: Args) -> int:
    out = make_view(args.source, args.out, args.max_bytes, args.turn_chars)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB); open it in a browser: file://{out.resolve()}")
    return 0


_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>__TITLE__ · ARLArena</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:18px;margin:0 0 8px} h2{font-size:15px;margin:18px 0 6px}
svg text{font-size:11px;fill:#444} .grid{stroke:#e5e5e5} .rollout{fill:none;stroke:#7a9;stroke-width:1.2}
.heldout{fill:none;stroke:#c33;stroke-width:2} .ci{stroke:#c33;stroke-width:1.5} .heldout-point{fill:#c33}
#filters label{margin-right:10px} #list{max-height:260px;overflow:auto;border:1px solid #ddd}
table{border-collapse:collapse} td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}
tr.ep{cursor:pointer} tr.ep:hover{background:#f4f8ff} tr.sel{background:#e8f0ff}
.won{color:#080} .lost{color:#a00}
.turn{border-left:3px solid #ccd;margin:8px 0;padding:4px 10px}
.msg,.resp{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12px;margin:2px 0;padding:4px}
.msg{background:#f6f6f6} .resp{background:#eef6ee} .meta{color:#555;font-size:12px}
#episode{max-height:520px;overflow:auto;border:1px solid #eee;padding:0 6px}
#group{display:flex;gap:8px;overflow-x:auto} .col{min-width:220px;max-width:320px;border:1px solid #ddd;padding:6px}
.col .resp{font-size:11px} .col.sel{border-color:#68c}
</style></head><body>
<h1>__TITLE__</h1>
__VERDICT__
__SVG__
<h2>Episodes <span class="meta">(<span id="count"></span> shown of <span id="held"></span> in this page,
<span id="total"></span> recorded)</span></h2>
<div id="filters"></div>
<div id="list"><table><thead><tr><th>source</th><th>env</th><th>iteration</th><th>group</th><th>sample</th>
<th>task seed</th><th>turns</th><th>return</th><th>outcome</th><th>stop</th></tr></thead>
<tbody id="rows"></tbody></table></div>
<h2>Episode</h2><div id="episode" class="meta">Click an episode.</div>
<h2>Its group</h2><div id="group" class="meta"></div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const EPS = DATA.episodes;
EPS.forEach((e, k) => { e._k = k; });
const ORDER = EPS.slice().sort((a, b) => (a.iteration - b.iteration) || (a.source < b.source ? -1 : 1) ||
  (a.group - b.group) || (a.sample - b.sample));
const FILTERS = [["source", e => e.source], ["env", e => e.env_id], ["iteration", e => String(e.iteration)],
                 ["won", e => e.won ? "1" : "0"], ["stop", e => String(e.stop)]];
function el(tag, text, cls) {
  const n = document.createElement(tag);
  if (text !== undefined && text !== null) n.textContent = String(text);
  if (cls) n.className = cls;
  return n;
}
function state() {
  const s = {};
  new URLSearchParams(location.hash.slice(1)).forEach((v, k) => { s[k] = v; });
  return s;
}
function setState(s) {
  const p = new URLSearchParams();
  Object.keys(s).forEach(k => { if (s[k] !== "" && s[k] !== undefined) p.set(k, s[k]); });
  location.hash = p.toString();
}
function fmt(x) {
  if (x === null || x === undefined) return "-";
  return typeof x === "number" ? (Math.round(x * 1000) / 1000).toString() : String(x);
}
function buildFilters() {
  const box = document.getElementById("filters");
  FILTERS.forEach(([name, get]) => {
    const values = [...new Set(EPS.map(get))].sort((a, b) => (isNaN(a) || isNaN(b)) ? (a < b ? -1 : 1) : a - b);
    const label = el("label", name === "won" ? "outcome " : name + " ");
    const sel = el("select");
    sel.id = "f-" + name;
    sel.appendChild(el("option", "all")).value = "";
    values.forEach(v => {
      const o = el("option", name === "won" ? (v === "1" ? "won" : "failed") : v);
      o.value = v;
      sel.appendChild(o);
    });
    sel.addEventListener("change", () => { const s = state(); s[name] = sel.value; delete s.episode; setState(s); });
    label.appendChild(sel);
    box.appendChild(label);
  });
}
function shown(s) { return ORDER.filter(e => FILTERS.every(([name, get]) => !s[name] || get(e) === s[name])); }
function renderList(s) {
  const body = document.getElementById("rows");
  body.textContent = "";
  const list = shown(s);
  list.forEach(e => {
    const tr = el("tr", undefined, "ep" + (String(e._k) === s.episode ? " sel" : ""));
    [e.source, e.env_id, e.iteration, e.group, e.sample, e.task_seed, e.turns.length, fmt(e["return"])]
      .forEach(v => tr.appendChild(el("td", v)));
    tr.appendChild(el("td", e.won ? "won" : "failed", e.won ? "won" : "lost"));
    tr.appendChild(el("td", e.stop));
    tr.addEventListener("click", () => { const t = state(); t.episode = String(e._k); setState(t); });
    body.appendChild(tr);
  });
  document.getElementById("count").textContent = list.length;
  FILTERS.forEach(([name]) => { document.getElementById("f-" + name).value = s[name] || ""; });
}
function renderTurn(t) {
  const box = el("div", undefined, "turn");
  box.appendChild(el("div", "turn " + t.turn, "meta"));
  if (!t.seen || !t.seen.length) box.appendChild(el("div", "(the same prompt as the turn before)", "meta"));
  (t.seen || []).forEach(m => {
    box.appendChild(el("div", m.role, "meta"));
    box.appendChild(el("div", m.content, "msg"));
  });
  box.appendChild(el("div", "response", "meta"));
  box.appendChild(el("div", t.response, "resp"));
  box.appendChild(el("div", "action " + fmt(t.action) + " · format " + (t.format_ok ? "ok" : "invalid") +
    " · action " + (t.action_valid ? "valid" : "invalid") + " · reward " + fmt(t.reward) + " · stop " +
    fmt(t.stop) + " · advantage " + fmt(t.advantage), "meta"));
  return box;
}
function renderGroup(e) {
  const group = document.getElementById("group");
  group.textContent = "";
  const mates = EPS.filter(o => o.source === e.source && o.iteration === e.iteration && o.env_id === e.env_id &&
                                o.group === e.group).sort((a, b) => a.sample - b.sample);
  if (mates.length < 2) {
    group.textContent = "A group of one episode (held-out evaluations play one episode per task).";
    return;
  }
  mates.forEach(o => {
    const col = el("div", undefined, "col" + (o === e ? " sel" : ""));
    const advs = o.turns.map(t => t.advantage).filter(a => a !== null && a !== undefined);
    const mean = advs.length ? fmt(advs.reduce((a, b) => a + b, 0) / advs.length) + " (mean of turns)" : "-";
    col.appendChild(el("div", "sample " + o.sample + " · " + (o.won ? "won" : "failed") + " · return " +
      fmt(o["return"]), o.won ? "won" : "lost"));
    col.appendChild(el("div", "advantage " + mean, "meta"));
    o.turns.forEach(t => {
      col.appendChild(el("div", "turn " + t.turn + " · adv " + fmt(t.advantage) + " · r " + fmt(t.reward), "meta"));
      col.appendChild(el("div", t.response, "resp"));
    });
    col.addEventListener("click", () => { const t = state(); t.episode = String(o._k); setState(t); });
    group.appendChild(col);
  });
}
function renderEpisode(s) {
  const box = document.getElementById("episode");
  box.textContent = "";
  document.getElementById("group").textContent = "";
  const e = s.episode === undefined ? undefined : EPS[Number(s.episode)];
  if (!e) { box.textContent = "Click an episode."; return; }
  box.appendChild(el("div", e.source + " · " + e.env_id + " (" + e.split + ") · iteration " + e.iteration +
    " · group " + e.group + " · sample " + e.sample + " · task seed " + e.task_seed + " · return " +
    fmt(e["return"]) + " · " + (e.won ? "won" : "failed") + " · stop " + e.stop, "meta"));
  e.turns.forEach(t => box.appendChild(renderTurn(t)));
  renderGroup(e);
}
function render() { const s = state(); renderList(s); renderEpisode(s); }
document.getElementById("held").textContent = EPS.length;
document.getElementById("total").textContent = DATA.total;
buildFilters();
render();
window.addEventListener("hashchange", render);
</script></body></html>
"""


if __name__ == "__main__":
    sys.exit(main(tyro.cli(Args)))
