"""benchmarks/bench_defaults.py: a short smoke of the command (sft.py, one script, one iteration, a few held-out
rooms) and its table's place in the docs."""

from __future__ import annotations

import json

import pytest
from conftest import load_benchmark

BENCH = load_benchmark("bench_defaults")


def test_write_doc_replaces_only_the_marked_block(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# Title\n\ntext before\n")
    BENCH.write_doc(doc, "table one")
    BENCH.write_doc(doc, "table two")
    text = doc.read_text()
    assert text.startswith("# Title\n\ntext before\n") and "table two" in text and "table one" not in text
    assert text.count(BENCH.START) == text.count(BENCH.END) == 1
    doc.write_text(text + "\ntext after\n")
    BENCH.write_doc(doc, "table three")
    assert doc.read_text().endswith(f"{BENCH.START}\ntable three\n{BENCH.END}\n\ntext after\n")


def test_a_measured_row_replaces_its_recorded_one_and_other_machines_rows_stay_out(tmp_path, capsys):
    recorded = [{"script": "sft", "seed": 1, "cpu_s": 1}, {"script": "grpo", "seed": 1, "cpu_s": 2},
                {"script": "grpo", "seed": 2, "cpu_s": 3}]
    merged = BENCH.merge(recorded, [{"script": "grpo", "seed": 1, "cpu_s": 9}])
    assert sorted((r["script"], r["seed"], r["cpu_s"]) for r in merged) == [("grpo", 1, 9), ("grpo", 2, 3),
                                                                            ("sft", 1, 1)]
    path = tmp_path / "record.json"
    path.write_text(json.dumps({"cpu": "CPU A", "torch_threads": 1, "rows": recorded}))
    assert BENCH.read_record(path, "CPU A", 1) == recorded
    assert BENCH.read_record(path, "CPU B", 1) == [] and "CPU B" in capsys.readouterr().err
    assert BENCH.read_record(tmp_path / "none.json", "CPU A", 1) == []


@pytest.mark.slow
def test_smoke_runs_sft_and_a_script_and_writes_the_table(tmp_path, monkeypatch):
    monkeypatch.setenv("ARENA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out, doc, record = tmp_path / "runs", tmp_path / "doc.md", tmp_path / "record.json"
    argv = ["--scripts", "grpo", "--seeds", "1", "--eval-seeds", "3", "--out", str(out), "--doc", str(doc),
            "--record", str(record),
            "--sft-args", "--num-episodes 20 --num-steps 2 --batch-size 8 --warmup-steps 1 --eval-every 1 "
                          "--eval-start 1 --eval-episodes 2 --max-turns 2",
            "--rl-args", "--num-iterations 1 --num-groups 1 --group-size 2 --max-turns 2 --mini-batch-size 4 "
                         "--micro-batch-size 4 --eval-every 0 --checkpoint-every 0"]
    BENCH.main(argv)
    rows = json.loads(record.read_text())["rows"]
    assert [r["script"] for r in rows] == ["sft", "grpo"]
    grpo = rows[1]
    assert grpo["iterations"] == 1 and grpo["rooms"] == 3 and grpo["wall_s"] > 0 and grpo["cpu_s"] > 0
    assert grpo["gain"]["mean"] == pytest.approx(grpo["final"] - grpo["start"])
    table = doc.read_text()
    assert "| grpo | 1 | 1 |" in table and BENCH.cpu_model() in table
    # a second call trains nothing: the finished runs and evaluations are reused, the table is the same
    (out / "seed1" / "grpo.log").unlink()
    BENCH.main([*argv, "--table-only"])
    assert doc.read_text() == table and not (out / "seed1" / "grpo.log").exists()
