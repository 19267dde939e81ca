"""Report artefacts from synthetic runs: table numbers, files produced, the PNG opens."""

from __future__ import annotations

import json

import matplotlib.image as mpimg
import numpy as np
import pytest
from test_eval_stability import monitored_rows, synthetic_rows, write_run

from eval.report import Args, find_run_dirs, load_runs, main, results_table, seed_band
from eval.stability import StabilityConfig


def make_runs(root):
    for seed in (1, 2):
        for method, peak, collapse in (("GRPO", 0.6, None), ("GSPO", 0.8, None), ("SAPO", 0.7, 40)):
            rows = synthetic_rows(n=60, peak=peak, collapse_at=collapse, seed=seed)
            write_run(root / f"{method}__Sokoban-v0__s{seed}", rows,
                      config={"exp_name": method.lower(), "env_id": "ARL/Sokoban-v0", "seed": seed})
    write_run(root / "GRPO__TIRMath-v0__s1", synthetic_rows(n=30, peak=0.4),
              config={"exp_name": "GRPO", "env_id": "ARL/TIRMath-v0", "seed": 1})
    return root


def test_table_numbers_and_relative_change(tmp_path):
    runs, problems = load_runs(find_run_dirs([make_runs(tmp_path / "runs")]), None, StabilityConfig())
    assert problems == [] and len(runs) == 7
    table = results_table(runs)
    assert table.columns == ["Sokoban Score", "Sokoban Succ.", "TIRMath Score", "TIRMath Succ."]
    rows = {method: (dim, cells, avg) for dim, method, cells, avg in table.rows}
    assert [m for _, m, _, _ in table.rows] == ["GRPO", "GSPO", "SAPO"]
    grpo, gspo = rows["GRPO"][1][1], rows["GSPO"][1][1]
    finals = [r.stability.final_success * 100 for r in runs if r.method == "GSPO"]
    assert gspo.mean == pytest.approx(np.mean(finals)) and gspo.std == pytest.approx(np.std(finals, ddof=1))
    assert gspo.n == 2 and gspo.rel == pytest.approx(100 * (gspo.mean - grpo.mean) / grpo.mean)
    assert rows["SAPO"][1][1].rel < 0 < gspo.rel and rows["GSPO"][0] == "IS"
    assert rows["GSPO"][1][2] is None  # GSPO never ran on TIRMath
    # Avg compares with GRPO over the same cells only (the paper's 6-vs-8-cell convention).
    assert rows["GSPO"][2].rel == pytest.approx(
        100 * (np.mean([c.mean for c in rows["GSPO"][1][:2]]) / np.mean([c.mean for c in rows["GRPO"][1][:2]]) - 1))


def test_a_mixture_run_is_a_run_per_env(tmp_path):
    sokoban, webshop = synthetic_rows(n=30, peak=0.8, seed=1), synthetic_rows(n=30, peak=0.2, seed=2)
    rows = []
    for a, b in zip(sokoban, webshop):
        row = {"iteration": a["iteration"], "rollout/success_rate": 0.5, "actor/grad_norm": 1.0}
        row.update({f"env/Sokoban-Mini/{k.split('/')[1]}": v for k, v in a.items() if k.startswith("rollout/")})
        row.update({f"env/WebShop/{k.split('/')[1]}": v for k, v in b.items() if k.startswith("rollout/")})
        row.update({"eval/success_rate": 0.5, "eval/Sokoban-Mini/success_rate": 0.9, "eval/WebShop/success_rate": 0.1})
        rows.append(row)
    write_run(tmp_path / "mix", rows, config={"exp_name": "grpo", "seed": 1,
                                              "env_id": ["ARL/Sokoban-Mini-v0", "ARL/WebShop-v0"]})
    write_run(tmp_path / "one", sokoban, config={"exp_name": "grpo", "seed": 1, "env_id": ["ARL/Sokoban-Mini-v0"]})
    runs, problems = load_runs([tmp_path / "mix", tmp_path / "one"], None, StabilityConfig())
    assert problems == [] and [r.env for r in runs] == ["ARL/Sokoban-Mini-v0", "ARL/WebShop-v0",
                                                        "ARL/Sokoban-Mini-v0"]
    alone = runs[2].stability
    assert runs[0].stability.final_success == alone.final_success != runs[1].stability.final_success
    assert (runs[0].stability.eval_final_success, runs[1].stability.eval_final_success) == (0.9, 0.1)
    assert results_table(runs, source="eval").rows[0][2][3].mean == pytest.approx(10.0)
    table = results_table(runs, source="rollout")  # the mixture's Sokoban-Mini beside the run of Sokoban-Mini alone
    assert table.columns == ["Sokoban-Mini Score", "Sokoban-Mini Succ.", "WebShop Score", "WebShop Succ."]
    cells = table.rows[0][2]
    assert (cells[1].mean, cells[1].n, cells[3].n) == (pytest.approx(100 * alone.final_success), 2, 1)


def test_report_files(tmp_path, capsys):
    out = tmp_path / "report"
    assert main(Args([make_runs(tmp_path / "runs")], out=out)) == 0
    for name in ("table.md", "table.tex", "report.md", "report.html", "stability.json",
                 "dynamics_Sokoban.png", "dynamics_Sokoban.pdf", "dynamics_TIRMath.png"):
        assert (out / name).stat().st_size > 0, name
    image = mpimg.imread(out / "dynamics_Sokoban.png")
    assert image.ndim == 3 and image.shape[0] > 300 and float(image.std()) > 0
    md = (out / "table.md").read_text()
    assert "| IS | GSPO |" in md and "±" in md and "%)" in md
    tex = (out / "table.tex").read_text()
    assert r"\toprule" in tex and r"$\pm$" in tex and r"\%)" in tex and r"\\%" not in tex
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," in page and "success_drop@40" in page
    stab = {s["run"]: s for s in json.loads((out / "stability.json").read_text())}
    assert stab["SAPO__Sokoban-v0__s1"]["collapsed"] and not stab["GSPO__Sokoban-v0__s1"]["collapsed"]


def test_sweep_results_file_and_bad_inputs(tmp_path, capsys):
    runs_dir = make_runs(tmp_path / "runs")
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"runs": [
        {"run_dir": str(runs_dir / "GSPO__Sokoban-v0__s1"), "method": "GSPO_X", "env": "ARL/Sokoban-v0",
         "dimension": "Custom"},
        {"run_dir": str(tmp_path / "pending"), "method": "GRPO", "env": "ARL/Sokoban-v0"}]}))
    runs, problems = load_runs([], results, StabilityConfig())
    assert [(r.method, r.dimension) for r in runs] == [("GSPO_X", "Custom")] and len(problems) == 1
    assert main(Args([tmp_path / "nothing"], out=tmp_path / "o")) == 2
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    assert main(Args([], results=bad, out=tmp_path / "o")) == 2
    assert "not a sweep results file" in capsys.readouterr().err


def test_seed_band_aligns_iterations_and_ignores_nonfinite():
    its, mean, std = seed_band([(np.array([0.0, 1, 2]), np.array([1.0, 2, np.inf])),
                                (np.array([1.0, 2, 3]), np.array([4.0, 6, 8]))])
    assert list(its) == [0, 1, 2, 3]
    assert mean == pytest.approx([1, 3, 6, 8]) and std == pytest.approx([0, 1, 0, 0])


def test_report_shows_the_in_run_alarm_beside_the_post_hoc_verdict(tmp_path):
    lines, monitor = monitored_rows("rollback")
    run = write_run(tmp_path / "runs" / "GRPO__Sokoban-v0__s1", lines,
                    config={"exp_name": "grpo", "env_id": "ARL/Sokoban-v0", "seed": 1})
    (run / "summary.json").write_text(json.dumps(monitor.summary()))
    out = tmp_path / "report"
    assert main(Args([tmp_path / "runs"], out=out)) == 0
    md = (out / "report.md").read_text()
    assert "| in-run alarm |" in md and "grad_spike@31->rollback(20), grad_spike@51->rollback(40) |" in md
    assert "- GRPO__Sokoban-v0__s1: grad_spike@51->rollback(40) (onset 50): actor/grad_norm" in md
    assert "grad_explode@" in md  # the post-hoc column of the same row
    assert "In-run alarm events:" in (out / "report.html").read_text()
    stab = json.loads((out / "stability.json").read_text())[0]
    assert [a["action"] for a in stab["alarms"]] == ["rollback", "rollback"]


def test_the_success_panel_shows_held_out_success_when_every_run_logged_it(tmp_path):
    from eval.report import success_panel

    with_eval = [dict(row, **({"eval/success_rate": 0.4} if row["iteration"] % 10 == 0 else {}))
                 for row in synthetic_rows(n=30, peak=0.6, seed=1)]
    write_run(tmp_path / "a", with_eval, config={"exp_name": "grpo", "seed": 1, "env_id": "ARL/Sokoban-v0"})
    write_run(tmp_path / "b", synthetic_rows(n=30, peak=0.6, seed=2),
              config={"exp_name": "grpo", "seed": 2, "env_id": "ARL/Sokoban-v0"})
    runs, _ = load_runs([tmp_path / "a", tmp_path / "b"], None, StabilityConfig())
    assert success_panel(runs[:1])[0] == "eval/success_rate" and "held-out" in success_panel(runs[:1])[1]
    assert success_panel(runs) == ("rollout/success_rate", "rollout success rate (no held-out evaluation logged)")
