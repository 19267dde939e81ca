"""Stability diagnostics on synthetic metric logs that do and do not collapse."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arena_train.monitor import CollapseConfig, CollapseMonitor
from eval.runlog import RunLog
from eval.stability import Args, StabilityConfig, analyze_dir, first_sustained, format_table, main, running_median


def synthetic_rows(n=80, collapse_at=None, seed=0, peak=0.8, nan_grad_at=None, format_drop_at=None):
    """A plausible training log: success rises to ``peak``; after ``collapse_at`` it falls to ~0.05
    with grad norm x50 and valid-format ratio 0.2 (the SAPO/CISPO picture)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        collapsed = collapse_at is not None and i >= collapse_at
        success = 0.05 if collapsed else peak * (1 - math.exp(-i / 12)) + rng.normal(0, 0.02)
        grad = (50.0 if collapsed else 1.0) * (1 + 0.1 * rng.random())
        fmt_ok = 0.2 if collapsed or (format_drop_at is not None and i >= format_drop_at) else 0.95
        rows.append({
            "iteration": i, "rollout/success_rate": float(np.clip(success, 0, 1)),
            "rollout/episode_return": 10 * float(np.clip(success, 0, 1)),
            "rollout/valid_format_ratio": fmt_ok, "rollout/response_length": 20 + i / 10,
            "actor/grad_norm": float("nan") if i == nan_grad_at else grad,
            "actor/kl_ref": 0.001 * (1 + i / n), "actor/entropy": 1.0 - i / (2 * n),
        })
    return rows


def write_run(run_dir: Path, rows, config=None, extra_lines=()):
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if config is not None:
        (run_dir / "config.json").write_text(json.dumps(config))
    return run_dir


def test_healthy_run_does_not_collapse(tmp_path):
    r = analyze_dir(write_run(tmp_path / "ok", synthetic_rows()))
    assert not r.collapsed and r.collapse_iteration is None and r.triggers == []
    assert 0.7 < r.best_success <= 1 and 0.7 < r.final_success <= r.best_success + 1e-9
    assert 0 < r.auc_success < r.best_success
    assert r.unchecked == []


def test_collapsing_run_reports_each_criterion_with_its_iteration(tmp_path):
    r = analyze_dir(write_run(tmp_path / "bad", synthetic_rows(collapse_at=50)))
    fired = {t.criterion: t for t in r.triggers}
    assert set(fired) == {"success_drop", "format", "grad_explode"}
    assert fired["success_drop"].iteration == 50 and fired["success_drop"].confirmed == 59
    assert fired["format"].iteration == 50 and fired["grad_explode"].iteration == 50
    assert r.collapsed and r.collapse_iteration == 50
    assert r.final_success == pytest.approx(0.05)


def test_short_dip_is_not_a_collapse_and_patience_is_configurable(tmp_path):
    rows = synthetic_rows()
    for row in rows[40:45]:  # a 5-iteration dip
        row["rollout/success_rate"] = 0.1
    run = write_run(tmp_path / "dip", rows)
    assert not analyze_dir(run).collapsed
    strict = analyze_dir(run, StabilityConfig(success_patience=5))
    assert [t.criterion for t in strict.triggers] == ["success_drop"] and strict.collapse_iteration == 40


def test_nonfinite_grad_and_kl_blowup(tmp_path):
    rows = synthetic_rows(nan_grad_at=30)
    rows[60]["actor/kl_ref"] = 5.0
    r = analyze_dir(write_run(tmp_path / "nan", rows))
    assert {(t.criterion, t.iteration) for t in r.triggers} == {("grad_nonfinite", 30), ("kl_blowup", 60)}


def test_never_learning_format_is_not_collapse(tmp_path):
    rows = synthetic_rows(peak=0.0)
    for row in rows:
        row["rollout/valid_format_ratio"] = 0.1
    assert not analyze_dir(write_run(tmp_path / "flat", rows)).collapsed


def test_bad_input_is_reported_not_raised(tmp_path, capsys):
    rows = synthetic_rows(n=20)
    for row in rows:
        del row["actor/kl_ref"]
    run = write_run(tmp_path / "messy", rows, config={"exp_name": "gspo", "env_id": "ARL/Sokoban-v0", "seed": 3},
                    extra_lines=['{"iteration": 20, "rollout/succ', "[1, 2]", ""])
    r = analyze_dir(run)
    assert r.skipped_lines == 2 and r.iterations == 20 and r.unchecked == ["actor/kl_ref"]
    assert (r.method, r.env, r.seed) == ("gspo", "ARL/Sokoban-v0", 3)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    assert math.isnan(analyze_dir(empty).best_success)
    out = tmp_path / "s.json"
    assert main(Args([run, tmp_path / "missing"], json=out)) == 2
    assert "missing" in capsys.readouterr().err
    assert json.loads(out.read_text())[0]["run"] == "messy"


def test_resumed_run_keeps_last_line_per_iteration(tmp_path):
    rows = synthetic_rows(n=10)
    rerun = dict(rows[5], **{"rollout/success_rate": 0.99})
    log = RunLog.load(write_run(tmp_path / "resumed", rows + [rerun]))
    its, vals = log.series("rollout/success_rate")
    assert list(its) == list(range(10)) and vals[5] == 0.99


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), max_size=30), st.integers(1, 6))
def test_first_sustained_matches_brute_force(flags, patience):
    hit = first_sustained(np.array(flags, dtype=bool), patience)
    runs = [i for i in range(len(flags) - patience + 1) if all(flags[i:i + patience])]
    if not runs:
        assert hit is None
    else:
        start, end = hit
        assert end == runs[0] + patience - 1 and all(flags[start:end + 1]) and (start == 0 or not flags[start - 1])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.001, 100.0), min_size=1, max_size=20), st.integers(1, 5))
def test_running_median_uses_only_the_past(vals, window):
    med = running_median(np.array(vals), window, 1)
    assert math.isnan(med[0])
    for i in range(1, len(vals)):
        assert med[i] == pytest.approx(float(np.median(vals[max(0, i - window):i])))


def monitored_rows(on_collapse: str):
    """synthetic_rows fed through the in-run alarm as a training script does: gradient norm x40 at iterations
    30-32 and from 50 on (until a rollback acts), checkpoints every 10; -> (metrics lines, monitor)."""
    monitor = CollapseMonitor(CollapseConfig(on_collapse=on_collapse))
    lines, spiking = [], False
    for row in synthetic_rows(n=80):
        it = row["iteration"]
        spiking = spiking or it == 50
        if 30 <= it <= 32 or spiking:
            row["actor/grad_norm"] *= 40
        step = monitor.update(it, row)
        lines.append({**row, **step.metrics})
        if step.decision.action == "rollback":
            monitor.restored(step.decision.checkpoint, it)
            spiking = False
        elif it % 10 == 0:
            monitor.checkpointed(it)
    return lines, monitor


@pytest.mark.parametrize("on_collapse", ["warn", "rollback"])
def test_in_run_alarms_from_summary_match_those_rebuilt_from_metrics(tmp_path, on_collapse):
    lines, monitor = monitored_rows(on_collapse)
    run = write_run(tmp_path / "run", lines)
    rebuilt = analyze_dir(run).alarms
    (run / "summary.json").write_text(json.dumps(monitor.summary()))
    recorded = analyze_dir(run).alarms
    assert [a.label() for a in rebuilt] == [a.label() for a in recorded]  # a stop/rollback names its checkpoint
    assert all(a.reason == "" for a in rebuilt) and all("grad_norm" in a.reason for a in recorded)
    labels = [a.label() for a in recorded]
    if on_collapse == "warn":
        assert labels == ["grad_spike@31", "grad_spike@51"]
    else:  # the second stretch is rolled back at its confirmation, to the checkpoint before its onset
        assert labels == ["grad_spike@31->rollback(20)", "grad_spike@51->rollback(40)"]
        assert recorded[1].onset == 50
    r = analyze_dir(run)
    assert "grad_explode" in {t.criterion for t in r.triggers}  # the post-hoc verdict beside it
    assert labels[0] in format_table([r]) and r.as_dict()["alarms"][0]["signal"] == "grad_spike"


def test_runs_without_the_monitor_have_no_alarms(tmp_path, capsys):
    run = write_run(tmp_path / "plain", synthetic_rows(n=20))
    (run / "summary.json").write_text("{not json")
    r = analyze_dir(run)
    assert r.alarms == [] and format_table([r]).splitlines()[1].split()[-2:] == ["no", "-"]
    lines, monitor = monitored_rows("warn")
    watched = write_run(tmp_path / "watched", lines)
    (watched / "summary.json").write_text(json.dumps(monitor.summary()))
    assert main(Args([watched])) == 0
    assert "watched: in-run alarm grad_spike@31, onset 30: actor/grad_norm" in capsys.readouterr().out
