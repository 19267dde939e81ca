"""eval.view on records and run files built to mislead or break it: the page draws what the grader saw (bidi
controls and invisible characters as visible markers, recorded values in their own elements), any malformed file
ends in one line naming the file and line, and the records are streamed, never read whole."""

from __future__ import annotations

import html
import json
import re
import shutil
import tracemalloc
from pathlib import Path

import pytest

from eval import view
from eval.view import Args, make_view
from eval.view import main as view_main
from tests.test_viewer import chromium, page_data, record

RLO, PDF, ZWSP = "\u202e", "\u202c", "\u200b"
BIDI = f"answer \\boxed{{{RLO}51{PDF}}}"  # a grader's regex reads 51; a browser draws 15 without isolation
ZERO_WIDTH, PLAIN = f"\\boxed{{5{ZWSP}}}", "\\boxed{5}"
FAKE_FIELDS = "up · format ok · action valid · reward 10 · stop won"  # an action that reads like the page's labels
needs_chromium = pytest.mark.skipif(shutil.which("chromium") is None,
                                    reason="Chromium is not installed (apt-get install chromium)")


def write_lines(path: Path, lines: list[str | bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


def hostile_episode() -> dict:
    """One episode of 3 turns: a bidi-overridden answer, an answer with a zero-width space, a plain answer whose
    action imitates the page's own fields."""
    episode = record("eval", 0, 0, 0, won=False, turns=3)
    for turn, response in zip(episode["turns"], (BIDI, ZERO_WIDTH, PLAIN)):
        turn["response"] = response
    episode["turns"][2]["action"] = FAKE_FIELDS
    return episode


# What the browser drew, measured in the page itself: a script appended to the page (its policy allows inline
# scripts) opens each episode asked for and writes its findings as JSON into <pre id="probe">.
PROBE = r"""<script>
(function () {
  function x(node, i) { const r = document.createRange(); r.setStart(node, i); r.setEnd(node, i + 1);
                        return r.getBoundingClientRect().left; }
  function texts(root) { const w = document.createTreeWalker(root, NodeFilter.SHOW_TEXT), a = [];
                         while (w.nextNode()) a.push(w.currentNode); return a; }
  function width(n) { const r = document.createRange(); r.selectNodeContents(n);
                      return r.getBoundingClientRect().width; }
  const out = {};
  (window.PROBE_EPISODES || [0]).forEach(k => {
    location.hash = "episode=" + k; render();
    const box = document.getElementById("episode"), resp = [...box.querySelectorAll(".resp")];
    const seen = {text: box.textContent, widths: resp.map(width), markers: [...box.querySelectorAll(".cf")]
                  .map(m => m.textContent), isolation: resp.map(n => [getComputedStyle(n).unicodeBidi, n.dir])};
    const nodes = resp.length ? texts(resp[0]) : [], five = nodes.find(n => n.data.includes("5")),
          one = nodes.find(n => n.data.includes("1"));
    if (five && one) { seen.five_x = x(five, five.data.indexOf("5")); seen.one_x = x(one, one.data.indexOf("1")); }
    seen.action = [...box.querySelectorAll("*")].filter(n => n.textContent === ACTION)
      .map(n => [n.tagName, getComputedStyle(n).unicodeBidi]);
    out[k] = seen;
  });
  const pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script></body>"""


def probe(page: Path, episodes: list[int]) -> dict:
    """What Chromium drew of ``episodes`` of ``page`` (PROBE), run on a copy of the page."""
    probed = page.with_name("probed.html")
    setup = (f"<script>window.PROBE_EPISODES = {json.dumps(episodes)}; "
             f"const ACTION = {json.dumps(FAKE_FIELDS)};</script>")
    probed.write_text(page.read_text().replace("</body>", setup + PROBE), encoding="utf-8")
    dom = chromium("--dump-dom", probed.resolve().as_uri())
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert found, dom[-3000:]
    return {int(k): v for k, v in json.loads(html.unescape(found.group(1))).items()}


@pytest.fixture(scope="module")
def hostile_page(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hostile")
    file = write_lines(folder / "e.jsonl", [json.dumps(hostile_episode(), ensure_ascii=False)])
    return make_view(file)


@pytest.fixture(scope="module")
def seen(hostile_page) -> dict:
    """What Chromium drew of the hostile episode (one browser run for the tests that read it)."""
    return probe(hostile_page, [0])[0]


@needs_chromium
def test_chromium_draws_a_bidi_override_as_markers_and_the_digits_in_their_order(hostile_page, seen):
    assert seen["five_x"] < seen["one_x"]  # drawn "51", as the grader read it, never "15"
    assert seen["markers"][:2] == ["⟨U+202E⟩", "⟨U+202C⟩"]  # the controls shown, the text recoverable
    assert RLO not in seen["text"] and PDF not in seen["text"]
    assert all(style == ["isolate", "auto"] for style in seen["isolation"])  # each text isolated from the page
    assert page_data(hostile_page)["episodes"][0]["turns"][0]["response"] == BIDI  # the data keeps the text


@needs_chromium
def test_chromium_draws_a_zero_width_space_unlike_its_absence(seen):
    assert "⟨U+200B⟩" in seen["markers"] and ZWSP not in seen["text"]
    assert seen["widths"][1] > seen["widths"][2] + 10  # \boxed{5<ZWSP>} is wider than \boxed{5}


@needs_chromium
def test_chromium_quotes_an_action_in_its_own_element(seen):
    assert seen["action"] == [["Q", "isolate"]]  # one quoting element holds the whole action, isolated


@needs_chromium
def test_chromium_shows_records_whose_turns_or_texts_were_dropped(tmp_path):
    full = record("eval", 0, 0, 0, won=True, turns=2)
    no_turns = {k: v for k, v in full.items() if k != "turns"}
    null_turns = {**full, "group": 1, "turns": None}
    no_texts = {**full, "group": 2, "turns": [{k: v for k, v in t.items() if k not in ("seen", "response")}
                                              for t in full["turns"]]}
    # as arena_train.episodes cuts a record to bound its file: "cut" says what went
    cut_turns = {**full, "group": 3, "turns": [], "cut": "turns"}
    cut_texts = {**full, "group": 4, "turns": [{**t, "seen": [], "response": ""} for t in full["turns"]],
                 "cut": "texts"}
    file = write_lines(tmp_path / "e.jsonl", [json.dumps(r) for r in (no_turns, null_turns, no_texts, cut_turns,
                                                                       cut_texts)])
    page = make_view(file)
    assert len(page_data(page)["episodes"]) == 5
    seen = probe(page, [0, 1, 2, 3, 4])
    assert all("turns not recorded" in seen[k]["text"] for k in (0, 1, 3))
    assert seen[2]["text"].count("response not recorded") == 2 and "saw: not recorded" in seen[2]["text"]
    assert seen[4]["text"].count("texts not recorded") == 2 and "same prompt" not in seen[4]["text"]
    assert seen[4]["text"].count("action") == 4  # the actions and flags stay
    shot = tmp_path / "dropped.png"
    chromium(f"--screenshot={shot}", "--window-size=1100,900", f"{page.resolve().as_uri()}#episode=2")
    assert shot.stat().st_size > 5_000


@needs_chromium
def test_screenshot_of_the_hostile_episode(hostile_page, tmp_path):
    """A picture of what a user sees (kept at /tmp/viewer_hostile.png to look at)."""
    shot = tmp_path / "hostile.png"
    chromium(f"--screenshot={shot}", "--window-size=1100,900", f"{hostile_page.resolve().as_uri()}#episode=0")
    assert shot.stat().st_size > 10_000
    shutil.copy(shot, Path("/tmp/viewer_hostile.png"))


GOOD = json.dumps(record("train", 1, 0, 0, won=True))


def with_turn(**changes) -> str:
    r = record("train", 1, 0, 1, won=False)
    r["turns"][0].update(changes)
    return json.dumps(r)


@pytest.mark.parametrize(("line", "reason"), [
    ('{"schema": 1, "source": "train", "won"', "not JSON"),
    ("[1, 2, 3]", "a JSON array"),
    (json.dumps({**record("train", 1, 0, 1, won=False), "turns": "up up down"}), "'turns'"),
    (with_turn(response=5), "'response'"),
    (json.dumps({**record("train", 1, 0, 1, won=False), "iteration": "1"}), "'iteration'"),
    (with_turn(reward=float("nan")), "NaN"),
    (with_turn(reward=1.0).replace('"reward": 1.0', '"reward": 1e999'), "finite"),
    (b'{"schema": 1, "response": "\xff\xfe"}', "UTF-8"),
    (json.dumps({**record("train", 1, 0, 1, won=False), "schema": 2}), "schema"),
    (json.dumps({k: v for k, v in record("train", 1, 0, 1, won=False).items() if k != "won"}), "'won'"),
], ids=["bad-json", "array", "turns-string", "numeric-response", "mixed-iteration", "nan", "overflow", "not-utf8",
        "other-schema", "no-won"])
def test_a_malformed_record_is_one_line_naming_the_file_and_line(tmp_path, line, reason):
    folder = tmp_path / "r"
    path = write_lines(folder / "episodes" / "train_000001.jsonl", [GOOD, line])
    with pytest.raises(SystemExit) as err:
        view_main(Args(source=folder))
    message = str(err.value)
    assert message.startswith(f"error: {path} line 2: ") and reason in message and "\n" not in message


def run_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "r"
    write_lines(folder / "episodes" / "eval_000000.jsonl", [json.dumps(record("eval", 0, g, 0, won=g == 0))
                                                           for g in range(4)])
    write_lines(folder / "metrics.jsonl", [json.dumps({"iteration": 0, "eval/success_rate": 0.25})])
    return folder


def notes(page: Path) -> list[str]:
    found = re.search(r'<script type="application/json" id="summary">(.*?)</script>', page.read_text(), re.S)
    return json.loads(found.group(1))["notes"]


def test_a_verdict_without_its_gain_is_a_page_saying_so(tmp_path):
    folder = run_folder(tmp_path)
    point = {"iteration": 0, "success": 0.25, "low": 0.05, "high": 0.7, "episodes": 4}
    (folder / "summary.json").write_text(json.dumps({"verdict": {"start": point, "best": point, "final": point}}))
    said = notes(make_view(folder))
    assert any(str(folder / "summary.json") in n and "gain" in n for n in said), said


def test_an_oversized_summary_is_a_page_saying_so(tmp_path, monkeypatch):
    monkeypatch.setattr(view, "LINE_BYTES", 1_000)
    folder = run_folder(tmp_path)
    (folder / "summary.json").write_text(json.dumps({"verdict": None, "padding": "p" * 2_000}))
    said = notes(make_view(folder))
    assert any(str(folder / "summary.json") in n and "over 1000 bytes" in n for n in said), said


def test_a_non_integer_eval_episodes_is_a_page_saying_so(tmp_path):
    folder = run_folder(tmp_path)
    (folder / "args.json").write_text(json.dumps({"env_id": ["ARL/Sokoban-Mini-v0"], "eval_episodes": "many"}))
    said = notes(make_view(folder))
    assert any(str(folder / "args.json") in n and "eval_episodes" in n for n in said), said


def test_a_metrics_line_with_a_text_iteration_is_one_line_naming_the_file(tmp_path):
    folder = run_folder(tmp_path)
    write_lines(folder / "metrics.jsonl", [json.dumps({"iteration": 0}), json.dumps({"iteration": "1"})])
    said = f"error: {folder / 'metrics.jsonl'}: the iteration of its record 2 is '1'"
    with pytest.raises(SystemExit, match=re.escape(said)):
        make_view(folder)


def test_a_lone_surrogate_is_a_page(tmp_path):
    """JSON may escape half of a surrogate pair; the page keeps it (as an escape) rather than failing to write."""
    file = write_lines(tmp_path / "e.jsonl", [GOOD.replace("<action>up</action>", "\\ud800 up")])
    assert page_data(make_view(file))["episodes"][0]["turns"][0]["response"] == "\ud800 up"


def test_a_cut_text_is_marked_outside_the_text(tmp_path):
    """A text cut for the page keeps exactly its first characters; the count of the rest travels beside it, so a
    response that itself ends like a cut mark cannot pass for one."""
    long = "x" * 50 + "\n[... 3 more characters in the file]"
    file = write_lines(tmp_path / "e.jsonl", [json.dumps(record("train", 1, 0, 0, won=True, response=long))])
    turn = page_data(make_view(file, turn_chars=20))["episodes"][0]["turns"][0]
    assert turn["response"] == "x" * 20 and turn["response_more"] == len(long) - 20


def test_a_line_over_the_size_limit_is_left_out_and_the_page_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(view, "LINE_BYTES", 10_000)
    huge = GOOD.replace("<action>up</action>", "y" * 20_000)
    file = write_lines(tmp_path / "e.jsonl", [GOOD, huge, GOOD])
    page = make_view(file)
    assert len(page_data(page)["episodes"]) == 2
    assert any(str(file) in n and "line 2" in n and "left out" in n for n in notes(page)), notes(page)


def test_the_page_says_how_many_records_its_budget_left_out(tmp_path):
    file = write_lines(tmp_path / "e.jsonl", [json.dumps(record("train", i, 0, 0, won=False)) for i in range(40)])
    page = make_view(file, max_bytes=5_000)
    held = len(page_data(page)["episodes"])
    assert 0 < held < 40
    assert any(f"{40 - held} of the 40 records" in n for n in notes(page)), notes(page)


def test_records_are_streamed_not_read_whole(tmp_path):
    """8 MB of records, a page of 300 kB: the viewer's memory stays near the page's, not the file's."""
    lines = [json.dumps(record("train", 1 + k // 10, 0, k % 10, won=False, turns=1, response="z" * 4000))
             for k in range(2000)]
    file = write_lines(tmp_path / "e.jsonl", lines)
    assert file.stat().st_size > 8e6
    tracemalloc.start()
    try:
        page = make_view(file, max_bytes=300_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert page_data(page)["total"] == 2000 and peak < 4e6, peak
