"""eval.view: the page's content and bounds, and what a real browser (headless Chromium) renders of it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from arena_train.episodes import SCHEMA, episode_file, write_episodes
from eval.view import Args, make_view
from eval.view import main as view_main

HOSTILE = ("<script>document.title='PWNED'</script></textarea></script>"
           "<img src=x onerror=\"document.title='PWNED'\">&amp;")


def record(source: str, iteration: int, group: int, sample: int, won: bool, response: str = "<action>up</action>",
           turns: int = 3, observation: str = "# # #\n# P #\n# # #") -> dict:
    return {
        "schema": SCHEMA, "source": source, "iteration": iteration, "env_id": "ARL/Sokoban-Mini-v0",
        "split": "train" if source == "train" else "test", "task_seed": 7 + group, "group": group, "sample": sample,
        "episode": group * 3 + sample, "return": float(won), "episode_return": float(won), "length": turns,
        "won": won, "stop": "won" if won else "max_turns",
        "turns": [{"turn": t, "seen": [{"role": "user", "content": observation}] if t == 0 else [],
                   "response": response, "action": "up", "format_ok": True, "action_valid": True,
                   "reward": float(won and t == turns - 1), "format_penalty": 0.0, "stop": "eos",
                   "advantage": (0.5 if won else -0.5) if source == "train" else None} for t in range(turns)],
    }


@pytest.fixture
def run(tmp_path) -> Path:
    """A run folder: 2 iterations, each with a group of 3 training episodes, and held-out evaluations at 0 and 2
    (4 episodes each); one training response carries markup."""
    folder = tmp_path / "r"
    metrics = []
    for iteration in (0, 1, 2):
        if iteration:
            train = [record("train", iteration, 0, s, won=s == 0, response=HOSTILE if (iteration, s) == (2, 1)
                            else "<action>up</action>") for s in range(3)]
            write_episodes(episode_file(folder, "train", iteration), train)
        line = {"iteration": iteration}
        if iteration != 1:
            held_out = [record("eval", iteration, g, 0, won=g < iteration) for g in range(4)]
            write_episodes(episode_file(folder, "eval", iteration), held_out)
            line["eval/success_rate"] = sum(r["won"] for r in held_out) / 4
        if iteration:
            line["rollout/success_rate"] = 1 / 3
        metrics.append(line)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (folder / "args.json").write_text(json.dumps({"env_id": ["ARL/Sokoban-Mini-v0"], "eval_episodes": 4}))
    return folder


def page_data(page: Path) -> dict:
    text = page.read_text()
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', text, re.S)
    return json.loads(found.group(1))


def test_the_page_holds_every_episode_as_inert_data_and_the_curve(run):
    page = make_view(run)
    text = page.read_text()
    assert page == run / "view.html"
    for needle in ("<script>document", "</textarea>", "<img", "onerror=\"", "&amp;"):
        assert needle not in text  # the markup of the response never reaches the page as markup
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing external
    data = page_data(page)
    assert data["total"] == len(data["episodes"]) == 14
    assert any(t["response"] == HOSTILE for e in data["episodes"] for t in e["turns"])  # the text itself survives
    assert text.count('class="heldout-point"') == 2 and 'class="rollout"' in text


def test_the_page_stays_within_its_budget_for_a_long_run(tmp_path):
    """250 iterations of 16 training episodes (10 turns, text of a Sokoban prompt) and 26 held-out evaluations of
    100 episodes: about 20 MB of records; the page keeps the first, best and last evaluations and spread iterations
    within its budget."""
    folder = tmp_path / "long"
    observation = "Push every box (X) onto a target (O).\n" + "# _ _ X _ O #\n" * 6 + "Actions: up, down, left, right"
    big = record("train", 1, 0, 0, won=False, response="<think>the box is left of me</think><action>left</action>",
                 turns=10, observation=observation)
    line = len(json.dumps(big).encode())
    lines, total = [], 0
    for iteration in range(0, 251):
        if iteration:
            write_episodes(episode_file(folder, "train", iteration),
                           [{**big, "iteration": iteration, "group": s // 8, "sample": s % 8} for s in range(16)])
            total += 16
        if iteration % 10 == 0:
            write_episodes(episode_file(folder, "eval", iteration),
                           [{**big, "source": "eval", "iteration": iteration, "group": g, "won": g < iteration // 5}
                            for g in range(100)])
            total += 100
        lines.append({"iteration": iteration, "rollout/success_rate": 0.5})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    assert total * line > 15e6  # the records are several times the page's budget
    page = make_view(folder)
    assert page.stat().st_size < 5e6
    data = page_data(page)
    held = {(e["source"], e["iteration"]) for e in data["episodes"]}
    assert {("eval", 0), ("eval", 250), ("train", 1), ("train", 250)} <= held and data["total"] == total


def test_a_bad_source_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        view_main(Args(source=tmp_path / "nowhere"))


def chromium(*args: str) -> str:
    proc = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Chromium is not installed (apt-get install chromium; .ci/run installs it)")
def test_chromium_renders_the_list_a_filter_an_episode_and_its_group(run, tmp_path):
    page = make_view(run)
    url = page.resolve().as_uri()
    data = page_data(page)
    dom = chromium("--dump-dom", url)
    assert re.search(r'id="count">14<', dom) and dom.count('class="ep') == 14  # every episode listed
    won = sum(e["won"] for e in data["episodes"])
    dom = chromium("--dump-dom", url + "#won=1")
    assert re.search(rf'id="count">{won}<', dom) and dom.count('class="ep') == won < 14  # the filter applies
    hostile = next(k for k, e in enumerate(data["episodes"]) if e["turns"][0]["response"] == HOSTILE)
    dom = chromium("--dump-dom", f"{url}#episode={hostile}")
    episode = dom[dom.index('id="episode"'):dom.index('id="group"')]
    assert episode.count('class="turn"') == 3  # the conversation, turn by turn
    assert "&lt;script&gt;document.title='PWNED'&lt;/script&gt;&lt;/textarea&gt;" in episode
    assert "&lt;img src=x onerror=" in episode
    assert "PWNED" not in dom[:dom.index("</title>")] and "<img" not in dom  # nothing ran, no element was made
    group = dom[dom.index('id="group"'):]
    assert group.count('class="col') == 3 and "adv 0.5" in group and "adv -0.5" in group  # G side by side
    shot = tmp_path / "view.png"
    chromium(f"--screenshot={shot}", "--window-size=1100,1300", f"{url}#episode={hostile}")
    assert shot.stat().st_size > 10_000
