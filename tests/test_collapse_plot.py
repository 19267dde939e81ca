"""eval.collapse_plot on a tiny synthetic runs folder: one line per seed, the half-of-start line, and the three
collapse markers where the runs' records put them."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from eval.collapse_plot import Args, draw, heldout_collapse, load_curves, main

EVALS = {  # (method, seed) -> held-out success at iterations 0, 10, 20, 30
    ("SAPO", 1): [0.40, 0.30, 0.15, 0.10],  # below half (0.20) from iteration 20 on: collapse at 20
    ("SAPO", 2): [0.40, 0.10, 0.30, 0.35],  # a dip it came back from: no collapse
    ("GRPO", 1): [0.40, 0.38, 0.42, 0.45],
}


def write_run(root: Path, method: str, seed: int, success: list[float], kl_jump: bool, alarm_at: int | None) -> None:
    run = root / f"{method}__s{seed}"
    run.mkdir(parents=True)
    rows = []
    for it in range(31):
        row = {"iteration": it, "actor/kl_ref": 0.5 if kl_jump and it >= 3 else 0.01}
        if it % 10 == 0:
            row["eval/success_rate"] = success[it // 10]
        rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "args.json").write_text(json.dumps({"kl_coef": 0.0, "eval_episodes": 100, "seed": seed,
                                               "env_id": ["ARL/Sokoban-Mini-v0"]}))
    (run / "sweep_run.json").write_text(json.dumps({"method": method, "seed": seed, "env": "ARL/Sokoban-Mini-v0"}))
    events = [] if alarm_at is None else [{"iteration": alarm_at, "signal": "kl_spike", "action": "warn"}]
    (run / "summary.json").write_text(json.dumps({"stability/events": events}))


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    write_run(root, "SAPO", 1, EVALS[("SAPO", 1)], kl_jump=True, alarm_at=12)
    write_run(root, "SAPO", 2, EVALS[("SAPO", 2)], kl_jump=False, alarm_at=None)
    write_run(root, "GRPO", 1, EVALS[("GRPO", 1)], kl_jump=False, alarm_at=None)
    return root


def test_heldout_collapse_is_the_stretch_below_half_that_reaches_the_end():
    its = np.array([0.0, 10, 20, 30])
    assert heldout_collapse(its, np.array([0.4, 0.1, 0.15, 0.1])) == 10.0
    assert heldout_collapse(its, np.array([0.4, 0.1, 0.3, 0.1])) == 30.0  # the last stretch, not the first dip
    assert heldout_collapse(its, np.array([0.4, 0.1, 0.15, 0.3])) is None  # came back
    assert heldout_collapse(its, np.array([0.4, 0.2, 0.2, 0.2])) is None  # half is not below half
    assert heldout_collapse(its, np.array([0.0, 0.0, 0.0, 0.0])) is None


def test_curves_carry_the_runs_records(runs: Path):
    curves, problems = load_curves([runs])
    assert problems == []
    assert [(c.method, c.seed) for c in curves] == [("GRPO", 1), ("SAPO", 1), ("SAPO", 2)]  # baseline first
    grpo, sapo1, sapo2 = curves
    assert sapo1.heldout_collapse == 20.0 and sapo2.heldout_collapse is None and grpo.heldout_collapse is None
    assert sapo1.verdict == "kl_blowup@3" and sapo1.alarm == "kl_spike@12"
    assert sapo2.verdict is None and sapo2.alarm is None
    assert (sapo1.start, sapo1.lowest, sapo1.final) == (0.40, (0.10, 30.0), 0.10)
    assert sapo2.lowest == (0.10, 10.0)


def scatter_points(ax, marker_path) -> list[tuple[float, float]]:
    """Offsets of the ax's scatter collections drawn with ``marker_path``'s marker."""
    out = []
    for coll in ax.collections:
        if np.array_equal(coll.get_paths()[0].vertices, marker_path.vertices):
            out += [tuple(map(float, p)) for p in coll.get_offsets()]
    return out


def test_draw_has_a_line_per_seed_the_half_line_and_the_markers(runs: Path):
    from matplotlib.markers import MarkerStyle

    curves, _ = load_curves([runs])
    fig = draw(curves, "title")
    try:
        grpo_ax, sapo_ax, legend_ax = fig.axes[:3]
        assert grpo_ax.get_title().startswith("GRPO: held-out collapse in 0 of 1")
        assert sapo_ax.get_title().startswith("SAPO: held-out collapse in 1 of 2")
        solid = [ln for ln in sapo_ax.get_lines() if ln.get_linestyle() == "-"]
        assert [list(ln.get_ydata()) for ln in solid] == [EVALS[("SAPO", 1)], EVALS[("SAPO", 2)]]
        assert list(solid[0].get_xdata()) == [0, 10, 20, 30]
        dashed = [ln for ln in sapo_ax.get_lines() if ln.get_linestyle() == "--"]
        assert len(dashed) == 1 and list(dashed[0].get_ydata()) == [pytest.approx(0.20)] * 2
        circle = MarkerStyle("o").get_path().transformed(MarkerStyle("o").get_transform())
        cross = MarkerStyle("x").get_path().transformed(MarkerStyle("x").get_transform())
        tri = MarkerStyle("v").get_path().transformed(MarkerStyle("v").get_transform())
        assert scatter_points(sapo_ax, circle) == [(20.0, pytest.approx(0.15))]
        assert scatter_points(sapo_ax, cross) == [(3.0, pytest.approx(0.37))]  # on the line between 0.40 and 0.30
        assert scatter_points(sapo_ax, tri) == [(12.0, pytest.approx(0.27))]
        assert scatter_points(grpo_ax, circle) == scatter_points(grpo_ax, cross) == scatter_points(grpo_ax, tri) == []
        labels = [t.get_text() for t in legend_ax.get_legend().get_texts()]
        assert labels[:2] == ["seed 1", "seed 2"] and any("half of the start" in t for t in labels)
    finally:
        plt.close(fig)


def test_cli_writes_the_png_and_the_table(runs: Path, tmp_path: Path, capsys):
    out = tmp_path / "fig" / "collapse.png"
    assert main(Args([runs], out=out)) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = capsys.readouterr().out
    assert ("| SAPO | 1 | 0.40 / 0.30 / 0.15 / 0.10 | 0.40 | 0.10 (30) | 0.10 | from 20 | kl_blowup@3 | kl_spike@12 |"
            in text)
    assert "| SAPO | 2 | 0.40 / 0.10 / 0.30 / 0.35 | 0.40 | 0.10 (10) | 0.35 | no | no | no |" in text


def test_cli_without_evaluations_is_an_error(tmp_path: Path, capsys):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"iteration": 0, "rollout/success_rate": 0.5}\n')
    assert main(Args([run], out=tmp_path / "x.png")) == 1
    assert "fewer than two held-out evaluations" in capsys.readouterr().out and not (tmp_path / "x.png").exists()


def test_default_title_names_env_kl_and_rooms(runs: Path):
    from eval.collapse_plot import default_title

    assert default_title([runs]) == "Sokoban-Mini, KL off: held-out greedy success (100 rooms) per method and seed"
