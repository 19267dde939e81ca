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
element), and the page's script puts text into the document with ``textContent`` only. The page shows what a
grader saw: every recorded text sits in its own element, isolated from its neighbours (``dir=auto``,
``unicode-bidi: isolate``), and each character that draws nothing or reorders others (bidi controls, zero-width
and other format characters, controls, separators other than the space) is drawn as a marker ``⟨U+202E⟩``, so
``\\boxed{<U+202E>51}`` never reads as ``\\boxed{15}`` and ``5<U+200B>`` never as ``5``. A recorded value (an
action, a stop reason) is never spliced into the page's own labels: each is an element of its own, an action a
quotation.

The records are streamed: a first pass reads one line at a time, checks it (a malformed line is one error line
naming the file and line) and keeps only where each record is and its size in the page; a second pass reads the
chosen ones again. A line over ``LINE_BYTES`` is left out, and the page's notes say so.

The page is bounded (``--max-bytes``, default 4 MB of episodes): the episodes of the first, best and last held-out
evaluations go in first, then training episodes of iterations spread evenly over the run, then the other
evaluations, each turn's text cut to ``--turn-chars`` (the count of characters cut travels beside the text); the
page says how many episodes it holds of how many recorded.
"""

from __future__ import annotations

import json
import math
import re
import sys
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import tyro

from arena_train.episodes import EPISODES_DIR, SCHEMA
from arena_train.safe_files import atomic_write_text
from arena_train.stats import proportion_ci

#: Bytes of one record line at most: a longer line is left out (the page notes it), so memory stays bounded.
LINE_BYTES = 64_000_000


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


NULL = type(None)
NUMBER = (int, float, NULL)
#: The JSON types the page's script can show, per field (exact types: a JSON true is no number here); a field may
#: be absent. A record whose turns or texts were dropped to bound its file (``cut``: "turns" or "texts", or the
#: field itself missing) shows them as not recorded.
RECORD_FIELDS = {"schema": (int,), "source": (str,), "won": (bool,), "iteration": (int, NULL), "env_id": (str, NULL),
                 "split": (str, NULL), "task_seed": (int, NULL), "group": (int, NULL), "sample": (int, NULL),
                 "episode": (int, NULL), "return": NUMBER, "episode_return": NUMBER, "length": (int, NULL),
                 "stop": (str, NULL), "turns": (list, NULL), "cut": (str, NULL)}
TURN_FIELDS = {"turn": (int, NULL), "seen": (list, NULL), "response": (str, NULL), "action": (str, NULL),
               "format_ok": (bool, NULL), "action_valid": (bool, NULL), "reward": NUMBER, "format_penalty": NUMBER,
               "stop": (str, NULL), "advantage": NUMBER}
MESSAGE_FIELDS = {"role": (str, NULL), "content": (str, NULL)}
_JSON_NAMES = {dict: "a JSON object", list: "a JSON array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", NULL: "null"}


def _preview(value: Any) -> str:
    """``value`` for an error line: ASCII only (no text of a record can move a terminal's cursor or reorder the
    line) and short."""
    text = ascii(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_fields(value: Any, fields: dict[str, tuple[type, ...]], where: str, required: tuple[str, ...] = ()
                  ) -> None:
    """Raise ValueError naming the first of ``fields`` of ``value`` (``where``) the page cannot show."""
    if type(value) is not dict:
        raise ValueError(f"{where} is {_JSON_NAMES.get(type(value), 'a value')}, not a JSON object")
    for key in required:
        if key not in value:
            raise ValueError(f"{where} has no {key!r}")
    for key, kinds in fields.items():
        if key in value and type(value[key]) not in kinds:
            wanted = " or ".join(dict.fromkeys(_JSON_NAMES[k] for k in kinds))
            raise ValueError(f"{where}'s {key!r} is {_preview(value[key])}, not {wanted}")
        if type(value.get(key)) is float and not math.isfinite(value[key]):  # 1e999 reads as inf
            raise ValueError(f"{where}'s {key!r} is {value[key]}, not a finite number")


def check_record(record: Any) -> None:
    """Raise ValueError naming what in ``record`` the page cannot show as recorded: the page's script and the
    choice of episodes assume these types, and a wrong one would otherwise end in a traceback far from its file."""
    _check_fields(record, RECORD_FIELDS, "the record", required=("schema", "source", "won"))
    if record["schema"] != SCHEMA:
        raise ValueError(f"not an episode record of schema {SCHEMA} (its schema is {record['schema']})")
    for k, turn in enumerate(record.get("turns") or []):
        _check_fields(turn, TURN_FIELDS, f"turn {k}")
        for j, message in enumerate(turn.get("seen") or []):
            _check_fields(message, MESSAGE_FIELDS, f"turn {k}'s message {j}")


def _no_constant(name: str) -> None:
    """Refuse NaN and Infinity, which Python's JSON reads but the page's JSON cannot hold."""
    raise ValueError(f"{name} is not a number JSON allows")


def _reason(err: Exception) -> str:
    """Why a line is not a record, in words that point into the line."""
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 text (byte {err.start + 1} of the line)"
    if isinstance(err, json.JSONDecodeError):
        return f"not JSON ({err.msg} at column {err.colno})"
    if isinstance(err, RecursionError):
        return "JSON nested too deeply to read"
    return str(err)


def parse_record(file: Path, number: int, line: bytes) -> dict[str, Any] | None:
    """The record on line ``number`` of ``file`` (None for a blank line); a line that is not one is an error
    naming the file and the line."""
    try:
        text = line.decode("utf-8")
        if not text.strip():
            return None
        record = json.loads(text, parse_constant=_no_constant)
        check_record(record)
    except (ValueError, RecursionError) as err:
        raise SystemExit(f"error: {file} line {number}: {_reason(err)}") from None
    return record


@contextmanager
def _opened(file: Path) -> Iterator[IO[bytes]]:
    """``file`` open for reading bytes, or an error line naming it."""
    try:
        handle = file.open("rb")
    except OSError as err:
        raise SystemExit(f"error: {file}: {err.strerror or err}") from None
    with handle:
        yield handle


def _lines(handle: IO[bytes]) -> Iterator[tuple[int, int, bytes | None]]:
    """(line number, byte offset, line) of an open file, one line in memory at a time; a line over
    ``LINE_BYTES`` comes as None (it is skipped through in pieces, never held)."""
    number = 0
    while True:
        offset = handle.tell()
        line = handle.readline(LINE_BYTES + 1)
        if not line:
            return
        number += 1
        if len(line) <= LINE_BYTES:
            yield number, offset, line
            continue
        while line and not line.endswith(b"\n"):
            line = handle.readline(1 << 20)
        yield number, offset, None


def _cut(text: str | None, limit: int) -> tuple[str | None, int]:
    """``text`` cut to ``limit`` characters, and how many were cut: the page marks a cut outside the text, so a
    text that itself ends like a cut mark reads as what it is."""
    if text is None or len(text) <= limit:
        return text, 0
    return text[:limit], len(text) - limit


def _page_turn(turn: dict[str, Any], turn_chars: int) -> dict[str, Any]:
    """A turn as the page holds it: its response and messages cut, each with the count of characters cut."""
    response, more = _cut(turn.get("response"), turn_chars)
    out = {**turn, "response": response, "response_more": more}
    if isinstance(turn.get("seen"), list):
        out["seen"] = []
        for message in turn["seen"]:
            content, cut = _cut(message.get("content"), turn_chars)
            out["seen"].append({"role": message.get("role"), "content": content, "more": cut})
    return out


def page_episode(record: dict[str, Any], turn_chars: int) -> dict[str, Any]:
    """A record as the page holds it: turn texts cut to ``turn_chars`` (turns that were not recorded stay so)."""
    turns = record.get("turns")
    return {**record, "turns": None if turns is None else [_page_turn(t, turn_chars) for t in turns]}


def _page_size(item: dict[str, Any]) -> int:
    """Bytes ``item`` takes in the page: the budget is spent on what the page holds, not on the record's size."""
    return len(json_for_script(item).encode()) + 1  # as the page holds it, with its comma


@dataclass
class Block:
    """The records of one evaluation or one training iteration as the first pass keeps them: counts, and the
    place (file, byte offset, line) and page size of those that can still fit the page; once their sizes pass
    the page's budget the rest are only counted (the page could not hold them)."""

    records: int = 0
    won: int = 0
    scored: int = 0  # held-out records that count in the success rate (not ended on an env error)
    places: array = field(default_factory=lambda: array("q"))  # file, offset, line, size; 4 numbers a record
    size: int = 0
    full: bool = False

    def add(self, record: dict[str, Any], place: tuple[int, int, int], size: int, max_bytes: int) -> None:
        self.records += 1
        self.won += record["won"]
        self.scored += record.get("stop") != "env_error"
        if self.full or self.size + size > max_bytes:
            self.full = True
            return
        self.places.extend((*place, size))
        self.size += size

    def entries(self) -> Iterator[tuple[int, int, int, int]]:
        """(file, offset, line, size) of each record kept."""
        for k in range(0, len(self.places), 4):
            yield tuple(self.places[k:k + 4])


@dataclass
class RecordScan:
    """What the first pass saw of a source's records: the files, one ``Block`` per (kind, iteration) where kind
    is "eval" for held-out episodes and "train" for every other source, and notes on what it left out; its
    length is the number of records read."""

    files: list[Path]
    blocks: dict[tuple[str, int | None], Block]
    notes: list[str]

    def __len__(self) -> int:
        return sum(b.records for b in self.blocks.values())

    def scored(self) -> dict[int | None, int]:
        """iteration -> held-out records that count in its success rate."""
        return {it: b.scored for (kind, it), b in self.blocks.items() if kind == "eval"}


def record_files(source: Path) -> list[Path]:
    """The episodes files of ``source``: every ``*.jsonl`` of a folder (sorted by name), or the file itself."""
    return sorted(source.glob("*.jsonl")) if source.is_dir() else [source]


def scan_records(files: list[Path], max_bytes: int, turn_chars: int) -> RecordScan:
    """First pass over ``files``, one line at a time (module docstring)."""
    blocks: dict[tuple[str, int | None], Block] = {}
    notes = []
    for n, file in enumerate(files):
        too_long = []
        with _opened(file) as handle:
            for number, offset, line in _lines(handle):
                if line is None:
                    too_long.append(number)
                    continue
                record = parse_record(file, number, line)
                if record is None:
                    continue
                kind = "eval" if record["source"] == "eval" else "train"
                block = blocks.setdefault((kind, record.get("iteration")), Block())
                size = 0 if block.full else _page_size(page_episode(record, turn_chars))
                block.add(record, (n, offset, number), size, max_bytes)
        if too_long:
            lines = ", ".join(map(str, too_long[:5])) + (", ..." if len(too_long) > 5 else "")
            notes.append(f"{file}: {len(too_long)} line(s) over {LINE_BYTES} bytes left out (line {lines})")
    return RecordScan(files, blocks, notes)


def _spread(values: list[Any], k: int) -> list[Any]:
    """``k`` of the sorted ``values`` spread evenly (first and last included)."""
    if k >= len(values):
        return values
    if k <= 1:
        return values[-1:]
    return sorted({values[round(i * (len(values) - 1) / (k - 1))] for i in range(k)}, key=_iteration_key)


def _iteration_key(iteration: int | None) -> tuple[bool, int]:
    """Iterations in order, None (an eval.evaluate file's records) last."""
    return iteration is None, iteration or 0


def page_order(blocks: dict[tuple[str, int | None], Block]) -> list[Block]:
    """The blocks in the order the page takes them: held-out blocks of the first, best and last evaluations, then
    training blocks by iterations spread over the run (halving the spacing until every one is listed), then the
    other evaluations."""
    evals = {it: b for (kind, it), b in blocks.items() if kind == "eval"}
    train = {it: b for (kind, it), b in blocks.items() if kind == "train"}
    order: list[Block] = []
    rest: list[Block] = []
    if evals:
        its = sorted(evals, key=_iteration_key)
        best = max(its, key=lambda i: evals[i].won / evals[i].records)
        first = [its[0], best, its[-1]]
        order += [evals[i] for i in dict.fromkeys(first)]
        rest += [evals[i] for i in its if i not in first]
    its = sorted(train, key=_iteration_key)
    taken: set = set()
    k = 2
    while len(taken) < len(its):
        for i in _spread(its, k):
            if i not in taken:
                taken.add(i)
                order.append(train[i])
        k *= 2
    return order + rest


def choose_places(order: list[Block], max_bytes: int) -> list[tuple[int, int, int, int]]:
    """The places of the records that go into the page, at most ``max_bytes`` of JSON, in ``order``: the first
    record that does not fit ends the page (a block that was only counted past its budget ends it too)."""
    chosen, size = [], 0
    for block in order:
        for entry in block.entries():
            if size + entry[3] > max_bytes:
                return chosen
            chosen.append(entry)
            size += entry[3]
        if block.full:
            return chosen
    return chosen


def load_episodes(files: list[Path], places: list[tuple[int, int, int, int]], turn_chars: int
                  ) -> list[dict[str, Any]]:
    """The records at ``places`` as the page holds them, in that order: second pass, one file open at a time,
    each record read again at its offset (a file that changed since the first pass is an error)."""
    out: list[Any] = [None] * len(places)
    by_file: dict[int, list[tuple[int, int, int, int]]] = {}
    for slot, (n, offset, number, size) in enumerate(places):
        by_file.setdefault(n, []).append((offset, number, size, slot))
    for n, wanted in sorted(by_file.items()):
        with _opened(files[n]) as handle:
            for offset, number, size, slot in sorted(wanted):
                handle.seek(offset)
                record = parse_record(files[n], number, handle.readline(LINE_BYTES + 1))
                item = None if record is None else page_episode(record, turn_chars)
                if item is None or _page_size(item) != size:
                    raise SystemExit(f"error: {files[n]} changed while its page was being made; run the viewer again")
                out[slot] = item
    return out


def _metrics(run: Path) -> list[dict[str, Any]]:
    """The run's metrics rows in iteration order; an iteration that is not an integer (the curve's axis) is an
    error naming the file, counting its records as ``read_metric_lines`` does (blank lines skipped)."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    from arena_train.logger import read_metric_lines

    rows = read_metric_lines(path)
    for number, row in enumerate(rows, start=1):
        if type(row["iteration"]) is not int:
            raise SystemExit(f"error: {path}: the iteration of its record {number} is {_preview(row['iteration'])}, "
                             "not an integer")
    by_iteration = {r["iteration"]: r for r in rows}  # a resumed run: the last line wins
    return [by_iteration[i] for i in sorted(by_iteration)]


def _rate(value: Any) -> float | None:
    """A success rate of ``metrics.jsonl`` that can be drawn, or None."""
    ok = type(value) in (int, float) and math.isfinite(value) and 0 <= value <= 1
    return float(value) if ok else None


def curves(metrics: list[dict[str, Any]], scored: dict[int | None, int], default_n: int
           ) -> tuple[list[tuple[float, float]], list[tuple[float, float, float, float]]]:
    """(rollout success points, held-out points with Wilson bounds) of a run: (iteration, rate) and
    (iteration, rate, low, high); a held-out rate's n is its recorded episodes (``scored``), else ``default_n``."""
    rollout, held_out = [], []
    for m in metrics:
        value = _rate(m.get("rollout/success_rate"))
        if value is not None:
            rollout.append((m["iteration"], value))
        value = _rate(m.get("eval/success_rate"))
        if value is not None:
            n = scored.get(m["iteration"], default_n)
            est = proportion_ci(round(value * n), n) if n > 0 else None
            held_out.append((m["iteration"], value, est.low if est else value, est.high if est else value))
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


_SURROGATE = re.compile("[\ud800-\udfff]")


def json_for_script(value: Any) -> str:
    """``value`` as JSON that no text inside it can end the ``<script>`` element holding it; half of a surrogate
    pair (JSON can carry one, UTF-8 cannot) stays an escape."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    text = text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _json_object(path: Path, notes: list[str]) -> dict[str, Any] | None:
    """The JSON object in ``path`` (a run's ``args.json`` or ``summary.json``), or None: absent, or unreadable or
    over ``LINE_BYTES`` (noted, naming the file: the page is still made, without what the file would have given)."""
    if not path.is_file():
        return None
    try:
        with path.open("rb") as handle:
            raw = handle.read(LINE_BYTES + 1)
        if len(raw) > LINE_BYTES:
            raise ValueError(f"over {LINE_BYTES} bytes")
        value = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (OSError, ValueError, RecursionError) as err:
        notes.append(f"{path}: not read ({_reason(err)}); the page goes without it")
        return None
    if type(value) is not dict:
        notes.append(f"{path}: {_JSON_NAMES.get(type(value), 'a value')}, not a JSON object; the page goes without it")
        return None
    return value


def held_out_n(config: dict[str, Any] | None, path: Path, notes: list[str]) -> int:
    """Episodes of one held-out evaluation by ``args.json`` (eval_episodes x envs): the n of a held-out rate whose
    episodes were not recorded; 0 (the rate drawn without an interval) when the file does not say, noted when it
    says something that is not a count."""
    episodes = (config or {}).get("eval_episodes") or 0
    if type(episodes) is not int or episodes < 0:
        notes.append(f"{path}: eval_episodes is {_preview(episodes)}, not a count of episodes; held-out rates "
                     "without episode records are drawn without an interval")
        return 0
    envs = (config or {}).get("env_id")
    return episodes * (len(envs) if isinstance(envs, list) and envs else 1)


def verdict_text(summary: dict[str, Any] | None, path: Path, notes: list[str]) -> str | None:
    """The run's verdict line, or None: without a verdict, or with one the page cannot read (noted, naming the
    file, rather than a traceback that would leave the run without a page)."""
    if not summary or not summary.get("verdict"):
        return None
    from arena_train.verdict import verdict_line

    try:
        return verdict_line(summary["verdict"])
    except (KeyError, TypeError, ValueError, IndexError) as err:
        notes.append(f"{path}: the verdict is not shown, it cannot be read ({type(err).__name__}: {err})")
        return None


def summary_part(verdict: str | None, notes: list[str]) -> str:
    """The verdict and the page's notes as inert JSON for the page's script: a summary value or a file name is
    text like any record's (the script isolates it and marks its invisible characters)."""
    data = json_for_script({"verdict": verdict, "notes": notes})
    return f'<script type="application/json" id="summary">{data}</script>'


def left_out_note(held: int, total: int, max_bytes: int) -> list[str]:
    """The note saying how many records the page's budget left out (none when it holds them all)."""
    if held >= total:
        return []
    return [f"{total - held} of the {total} records are not in this page: its budget (--max-bytes {max_bytes}) "
            "keeps the first, best and last evaluations, then training iterations spread over the run"]


def build_page(title: str, episodes: list[dict[str, Any]], total: int, svg: str, summary_html: str) -> str:
    """The page: the title travels with the records as data (a file's name is text like theirs)."""
    data = json_for_script({"title": title, "episodes": episodes, "total": total})
    return _TEMPLATE.replace("__SVG__", svg).replace("__SUMMARY__", summary_html).replace("__DATA__", data)


def make_view(source: Path, out: Path | None = None, max_bytes: int = 4_000_000, turn_chars: int = 1500) -> Path:
    """Write the page of ``source`` (a run folder, an episodes file or a folder of them) -> its path."""
    if not source.exists():
        raise SystemExit(f"error: {source} does not exist; pass a run folder (runs/<name>) or an episodes .jsonl file")
    run = source if (source / "metrics.jsonl").is_file() or (source / EPISODES_DIR).is_dir() else None
    if run is not None:
        folder = run / EPISODES_DIR
        records = scan_records(record_files(folder) if folder.is_dir() else [], max_bytes, turn_chars)
        notes = records.notes
        config = _json_object(run / "args.json", notes)
        rollout, held_out = curves(_metrics(run), records.scored(), held_out_n(config, run / "args.json", notes))
        svg = success_svg(rollout, held_out)
        verdict = verdict_text(_json_object(run / "summary.json", notes), run / "summary.json", notes)
        out = out or run / "view.html"
    else:
        records = scan_records(record_files(source), max_bytes, turn_chars)
        svg, verdict, notes = "", None, records.notes
        out = out or source.with_suffix(".html")
    episodes = load_episodes(records.files, choose_places(page_order(records.blocks), max_bytes), turn_chars)
    summary_html = summary_part(verdict, notes + left_out_note(len(episodes), len(records), max_bytes))
    atomic_write_text(out, build_page(source.name, episodes, len(records), svg, summary_html))  # a link is replaced
    return out


def main(args: Args) -> int:
    out = make_view(args.source, args.out, args.max_bytes, args.turn_chars)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB); open it in a browser: file://{out.resolve()}")
    return 0


_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>ARLArena viewer</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:18px;margin:0 0 8px} h2{font-size:15px;margin:18px 0 6px}
svg text{font-size:11px;fill:#444} .grid{stroke:#e5e5e5} .rollout{fill:none;stroke:#7a9;stroke-width:1.2}
.heldout{fill:none;stroke:#c33;stroke-width:2} .ci{stroke:#c33;stroke-width:1.5} .heldout-point{fill:#c33}
#notes{color:#a50;font-size:12px;margin:4px 0} #notes:empty{display:none}
#filters label{margin-right:10px} #list{max-height:260px;overflow:auto;border:1px solid #ddd}
table{border-collapse:collapse} td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}
tr.ep{cursor:pointer} tr.ep:hover{background:#f4f8ff} tr.sel{background:#e8f0ff}
.won{color:#080} .lost{color:#a00}
.turn{border-left:3px solid #ccd;margin:8px 0;padding:4px 10px}
.t{unicode-bidi:isolate}
.cf{unicode-bidi:isolate;direction:ltr;background:#fde2e2;color:#a00;border:1px solid #e99;border-radius:3px;
    font:11px ui-monospace,monospace;padding:0 2px;margin:0 1px;white-space:nowrap}
.cut{color:#777;font-style:italic}
.msg,.resp{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12px;margin:2px 0;padding:4px}
.msg{background:#f6f6f6} .resp{background:#eef6ee} .meta{color:#555;font-size:12px}
q.v{font-family:ui-monospace,monospace;background:#fff6dc;border:1px solid #e8d9a8;border-radius:3px;padding:0 3px;
    color:#222;white-space:pre-wrap}
#episode{max-height:520px;overflow:auto;border:1px solid #eee;padding:0 6px}
#group{display:flex;gap:8px;overflow-x:auto} .col{min-width:220px;max-width:320px;border:1px solid #ddd;padding:6px}
.col .resp{font-size:11px} .col.sel{border-color:#68c}
</style></head><body>
<h1 id="title"></h1>
<p id="verdict"></p>
<ul id="notes"></ul>
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
__SUMMARY__
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const SUMMARY = JSON.parse(document.getElementById("summary").textContent);
const EPS = DATA.episodes;
EPS.forEach((e, k) => { e._k = k; });
const ORDER = EPS.slice().sort((a, b) => (a.iteration - b.iteration) || (a.source < b.source ? -1 : 1) ||
  (a.group - b.group) || (a.sample - b.sample));
const FILTERS = [["source", e => fmt(e.source)], ["env", e => fmt(e.env_id)], ["iteration", e => fmt(e.iteration)],
                 ["won", e => e.won ? "1" : "0"], ["stop", e => fmt(e.stop)]];
// A character that draws nothing or reorders its neighbours: a control (but newline and tab), a format or bidi
// character, a surrogate half, a private-use or unassigned code point, a separator other than the space, a default
// ignorable one. The page draws it as a marker with its code, so what a grader read stays readable.
const HIDDEN = /((?![\n\t ])[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zs}\p{Zl}\p{Zp}\p{Default_Ignorable_Code_Point}])/u;
function code(ch) { return "U+" + ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0"); }
function el(tag, text, cls) {
  const n = document.createElement(tag);
  if (text !== undefined && text !== null) n.textContent = String(text);
  if (cls) n.className = cls;
  return n;
}
// Recorded text as its own element: isolated from the page around it, its hidden characters as markers, and a cut
// (``more`` characters left in the file) marked after it in the page's own style.
function txt(tag, value, cls, more) {
  const n = el(tag, undefined, "t" + (cls ? " " + cls : ""));
  n.dir = "auto";
  String(value).split(HIDDEN).forEach((part, k) => {
    if (k % 2) n.appendChild(el("span", "\u27e8" + code(part) + "\u27e9", "cf")).title = code(part) +
      ": a character that draws nothing or reorders the text; the record holds it here";
    else if (part) n.appendChild(document.createTextNode(part));
  });
  if (more) n.appendChild(el("span", " [\u2026 " + more + " more characters in the file]", "cut"));
  return n;
}
// The same for where no element can go (an option, the window title): markers as text, the value isolated.
function plain(value) {
  return "\u2068" + String(value).split(HIDDEN).map((p, k) => k % 2 ? "\u27e8" + code(p) + "\u27e9" : p).join("") +
    "\u2069";
}
function fmt(x) {
  if (x === null || x === undefined) return "-";
  return typeof x === "number" ? (Math.round(x * 1000) / 1000).toString() : String(x);
}
function said(x) { return x === null || x === undefined ? "-" : txt("q", x, "v"); }  // model-written: a quotation
function flag(x, yes, no) { return x === null || x === undefined ? "-" : x ? yes : no; }
// "label value · label value": the page's labels as text; a number as text beside its label; recorded text (a
// string) in its own isolated element, never spliced into the labels.
function fields(items, cls) {
  const box = el("div", undefined, cls === undefined ? "meta" : cls);
  items.forEach(([label, value], k) => {
    const lead = (k ? " \u00b7 " : "") + (label ? label + " " : "");
    if (value instanceof Node) {
      box.appendChild(document.createTextNode(lead));
      box.appendChild(value);
    } else if (typeof value === "string") {
      box.appendChild(document.createTextNode(lead));
      box.appendChild(txt("span", value));
    } else box.appendChild(document.createTextNode(lead + fmt(value)));
  });
  return box;
}
function outcome(e) { return el("span", e.won ? "won" : "failed", e.won ? "won" : "lost"); }
// A record cut to bound its file ("cut": "turns" or "texts", arena_train.episodes) or without the field at all.
function noTurns(e) { return e.cut === "turns" || !Array.isArray(e.turns); }
function turnsOf(e) { return noTurns(e) ? [] : e.turns; }
const TEXTS_CUT = "texts not recorded (cut to bound the file): what the model saw, its response";
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
function buildFilters() {
  const box = document.getElementById("filters");
  FILTERS.forEach(([name, get]) => {
    const values = [...new Set(EPS.map(get))].sort((a, b) => (isNaN(a) || isNaN(b)) ? (a < b ? -1 : 1) : a - b);
    const label = el("label", name === "won" ? "outcome " : name + " ");
    const sel = el("select");
    sel.id = "f-" + name;
    sel.appendChild(el("option", "all")).value = "";
    values.forEach(v => {
      const o = el("option", name === "won" ? (v === "1" ? "won" : "failed") : plain(v));
      o.value = v;
      sel.appendChild(o);
    });
    sel.addEventListener("change", () => { const s = state(); s[name] = sel.value; delete s.episode; setState(s); });
    label.appendChild(sel);
    box.appendChild(label);
  });
}
function shown(s) { return ORDER.filter(e => FILTERS.every(([name, get]) => !s[name] || get(e) === s[name])); }
function cell(v) {
  const td = el("td");
  if (v instanceof Node) td.appendChild(v);
  else if (typeof v === "string") td.appendChild(txt("span", v));
  else td.textContent = fmt(v);
  return td;
}
function renderList(s) {
  const body = document.getElementById("rows");
  body.textContent = "";
  const list = shown(s);
  list.forEach(e => {
    const tr = el("tr", undefined, "ep" + (String(e._k) === s.episode ? " sel" : ""));
    const turns = noTurns(e) ? el("span", "not recorded", "meta") : e.turns.length;
    [e.source, e.env_id, e.iteration, e.group, e.sample, e.task_seed, turns, e["return"], outcome(e), e.stop]
      .forEach(v => tr.appendChild(cell(v)));
    tr.addEventListener("click", () => { const t = state(); t.episode = String(e._k); setState(t); });
    body.appendChild(tr);
  });
  document.getElementById("count").textContent = list.length;
  FILTERS.forEach(([name]) => { document.getElementById("f-" + name).value = s[name] || ""; });
}
function renderTurn(t, textsCut) {
  const box = el("div", undefined, "turn");
  box.appendChild(fields([["turn", t.turn]]));
  if (textsCut) box.appendChild(el("div", TEXTS_CUT, "meta"));
  else renderTexts(box, t);
  box.appendChild(fields([["action", said(t.action)], ["format", flag(t.format_ok, "ok", "invalid")],
    ["action", flag(t.action_valid, "valid", "invalid")], ["reward", t.reward], ["stop", t.stop],
    ["advantage", t.advantage]]));
  return box;
}
function renderTexts(box, t) {
  if (!Array.isArray(t.seen)) box.appendChild(el("div", "what the model saw: not recorded", "meta"));
  else if (!t.seen.length) box.appendChild(el("div", "(the same prompt as the turn before)", "meta"));
  else t.seen.forEach(m => {
    box.appendChild(fields([["", m.role]]));
    box.appendChild(m.content === null || m.content === undefined ? el("div", "not recorded", "meta")
      : txt("div", m.content, "msg", m.more));
  });
  if (t.response === null || t.response === undefined) box.appendChild(el("div", "response not recorded", "meta"));
  else {
    box.appendChild(el("div", "response", "meta"));
    box.appendChild(txt("div", t.response, "resp", t.response_more));
  }
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
    const advs = turnsOf(o).map(t => t.advantage).filter(a => a !== null && a !== undefined);
    const mean = advs.length ? fmt(advs.reduce((a, b) => a + b, 0) / advs.length) + " (mean of turns)" : "-";
    col.appendChild(fields([["sample", o.sample], ["", outcome(o)], ["return", o["return"]]], ""));
    col.appendChild(el("div", "advantage " + mean, "meta"));
    if (noTurns(o)) col.appendChild(el("div", "turns not recorded", "meta"));
    turnsOf(o).forEach(t => {
      col.appendChild(fields([["turn", t.turn], ["adv", t.advantage], ["r", t.reward]]));
      col.appendChild(o.cut === "texts" ? el("div", "texts not recorded", "meta")
        : t.response === null || t.response === undefined ? el("div", "response not recorded", "meta")
        : txt("div", t.response, "resp", t.response_more));
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
  box.appendChild(fields([["", e.source], ["env", e.env_id], ["split", e.split],
    ["iteration", e.iteration], ["group", e.group], ["sample", e.sample], ["task seed", e.task_seed],
    ["return", e["return"]], ["", outcome(e)], ["stop", e.stop]]));
  if (noTurns(e)) box.appendChild(el("div", "turns not recorded (the record keeps its outcome only)", "meta"));
  turnsOf(e).forEach(t => box.appendChild(renderTurn(t, e.cut === "texts")));
  renderGroup(e);
}
function render() { const s = state(); renderList(s); renderEpisode(s); }
function renderHead() {
  document.title = plain(DATA.title) + " \u00b7 ARLArena";
  document.getElementById("title").appendChild(txt("span", DATA.title));
  const verdict = document.getElementById("verdict");
  if (SUMMARY.verdict === null) verdict.remove();
  else verdict.appendChild(txt("span", SUMMARY.verdict));
  SUMMARY.notes.forEach(n => document.getElementById("notes").appendChild(el("li")).appendChild(txt("span", n)));
  document.getElementById("held").textContent = EPS.length;
  document.getElementById("total").textContent = DATA.total;
}
renderHead();
buildFilters();
render();
window.addEventListener("hashchange", render);
</script></body></html>
"""


if __name__ == "__main__":
    sys.exit(main(tyro.cli(Args)))
