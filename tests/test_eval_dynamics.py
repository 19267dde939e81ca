"""eval.dynamics: runs side by side with their alarm events marked."""

from __future__ import annotations

import json

import pytest

from eval.dynamics import Args, alarm_events, main


def write_run(folder, events):
    folder.mkdir(parents=True)
    lines = [{"iteration": i, "rollout/success_rate": 0.5 - 0.02 * i, "actor/grad_norm": 1.0 + i,
              "actor/entropy": 0.3, "actor/kl_ref": 0.01 * i, "rollout/valid_format_ratio": 1.0,
              **({"eval/success_rate": 0.4} if i % 2 == 0 else {})} for i in range(1, 9)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "summary.json").write_text(json.dumps({"stability/events": events}))


def test_plots_runs_with_their_events(tmp_path):
    write_run(tmp_path / "a", [{"iteration": 6, "action": "rollback", "signal": "grad_spike"}])
    write_run(tmp_path / "b", [])
    assert alarm_events(tmp_path / "a")[0]["action"] == "rollback" and alarm_events(tmp_path / "b") == []
    main(Args(runs=[tmp_path / "a", tmp_path / "b"], out=tmp_path / "fig.png", labels=["alarm", "none"], start=0.4))
    assert (tmp_path / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_labels_must_match_runs(tmp_path):
    write_run(tmp_path / "a", [])
    with pytest.raises(SystemExit, match="--labels has 2 names for 1 runs"):
        main(Args(runs=[tmp_path / "a"], out=tmp_path / "fig.png", labels=["x", "y"]))
