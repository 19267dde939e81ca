"""eval.budget: the BC/RL split of a fixed budget, the choice by final success, a minimal end-to-end curve."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eval import budget, mini_arena


@settings(deadline=None)
@given(budget_s=st.floats(1, 5000), share=st.floats(0, 0.99), bc=st.floats(0.01, 5), rl=st.floats(0.1, 30),
       startup=st.floats(0, 30))
def test_split_spends_at_most_each_share_of_the_budget(budget_s, share, bc, rl, startup):
    bc_steps, rl_iterations = budget.split_budget(budget_s, share, bc, rl, startup)
    assert bc_steps >= 1 and rl_iterations >= 0
    if bc_steps > 1:
        assert bc_steps * bc <= (1 - share) * budget_s + 1e-6
    if rl_iterations:
        assert startup + rl_iterations * rl <= share * budget_s + 1e-6
    more_rl = budget.split_budget(budget_s, min(share + 0.1, 0.99), bc, rl, startup)
    assert more_rl[0] <= bc_steps and more_rl[1] >= rl_iterations


@pytest.mark.parametrize("call", [(100, 1.0, 1, 1), (100, -0.1, 1, 1), (0, 0.5, 1, 1), (100, 0.5, 0, 1),
                                  (100, 0.5, 1, 1, -1)])
def test_bad_splits_are_clear_errors(call):
    with pytest.raises(ValueError):
        budget.split_budget(*call)


def test_main_rejects_a_bad_share_before_running_anything(tmp_path):
    with pytest.raises(SystemExit, match="RL share"):
        budget.main(budget.Args(rl_shares=[0.5, 1.0], out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def point(share, seed, final, bc):
    return {"share": share, "seed": seed, "bc_steps": 10, "rl_iterations": 2, "final_success": final,
            "bc_success": bc, "gain": final - bc, "train_s": 1.0}


def test_the_split_is_chosen_by_final_success_not_by_gain():
    points = [point(0.25, s, 0.60, 0.55) for s in (1, 2)] + [point(0.75, s, 0.50, 0.20) for s in (1, 2)]
    summary = budget.summarize(points)
    assert [row["share"] for row in summary] == [0.25, 0.75]
    assert summary[1]["gain"]["mean"] > summary[0]["gain"]["mean"]  # the weaker start gains more ...
    assert budget.best_share(summary) == 0.25  # ... and still ends lower
    tie = budget.summarize([point(0.5, 1, 0.5, 0.4), point(0.0, 1, 0.5, 0.5)])
    assert budget.best_share(tie) == 0.0


def test_point_settings_spend_the_plan_and_keep_the_arena_flags(tmp_path):
    args = budget.Args(arena=mini_arena.Args(env_id="ARL/Sokoban-v0", rl_script="grpo"))
    arena = budget.arena_settings(args, bc_steps=120, rl_iterations=0, seed=4, out=tmp_path)
    assert (arena.env_id, arena.rl_script, arena.bc_max_steps, arena.bc_target) == ("ARL/Sokoban-v0", "grpo", 120, 1.0)
    assert arena.skip_rl and arena.seeds == [4] and arena.bc_eval_start <= 120
    command = mini_arena.rl_command(arena, 4, tmp_path / "bc", tmp_path)
    assert command[command.index("--eval-every") + 1] == "0"  # held-out checks are not spent inside the budget


@pytest.mark.slow
def test_minimal_budget_curve_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("ARENA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    arena = mini_arena.Args(bc_episodes=12, bc_batch_size=8, bc_eval_every=2, bc_eval_episodes=2, bc_eval_start=2,
                            num_groups=2, group_size=2, mini_batch_size=16, rl_eval_episodes=2, eval_episodes=3,
                            max_response_tokens=8)
    args = budget.Args(budget_s=10, rl_shares=[0.0, 0.5], seeds=[3], bc_step_s=1.0, rl_iteration_s=2.5,
                       rl_startup_s=0.0, arena=arena, out=tmp_path / "out")
    results = budget.main(args)
    by_share = {p["share"]: p for p in results["points"]}
    assert (by_share[0.0]["bc_steps"], by_share[0.0]["rl_iterations"]) == (10, 0)
    assert (by_share[0.5]["bc_steps"], by_share[0.5]["rl_iterations"]) == (5, 2)
    assert "rl_s" in by_share[0.5]["timing"] and "rl_s" not in by_share[0.0]["timing"]
    assert all(0 <= p["final_success"] <= 1 for p in results["points"])
    assert results["best_share"] in (0.0, 0.5)
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["summary"] == results["summary"] and saved["args"]["arena"]["bc_episodes"] == 12
    assert (tmp_path / "out" / "budget_curve.png").stat().st_size > 1000
    assert "| 0.5 | 5 | 2 |" in (tmp_path / "out" / "report.md").read_text()
    assert not (tmp_path / "out" / "share0.5" / "seed3" / "bc").exists()  # models deleted after evaluation


def test_merge_makes_one_curve_of_parallel_runs_and_refuses_mixed_ones(tmp_path):
    def finished(name, points, **overrides):
        folder = tmp_path / name
        folder.mkdir()
        args = {"budget_s": 100.0, "bc_step_s": 0.25, "rl_iteration_s": 3.5, "rl_startup_s": 15.0, "seeds": [],
                "rl_shares": [], "out": str(folder), "arena": {"rl_script": "sampo"}, "keep_models": False,
                "merge": [], **overrides}
        (folder / "results.json").write_text(json.dumps({"args": args, "points": points, "wall_s": 10.0}))
        return folder

    a = finished("a", [point(0.5, 1, 0.7, 0.5), point(0.5, 2, 0.8, 0.5)])
    b = finished("b", [point(0.0, 1, 0.65, 0.65)], keep_models=True)
    results = budget.main(budget.Args(merge=[a, b], out=tmp_path / "all"))
    assert [row["share"] for row in results["summary"]] == [0.0, 0.5] and results["best_share"] == 0.5
    assert results["args"]["seeds"] == [1, 2] and results["wall_s"] == 20.0
    assert (tmp_path / "all" / "budget_curve.png").is_file() and (tmp_path / "all" / "report.md").is_file()
    with pytest.raises(SystemExit, match="different settings"):
        budget.merge_points([a, finished("c", [point(0.25, 1, 0.6, 0.5)], budget_s=200.0)])
    with pytest.raises(SystemExit, match="twice"):
        budget.merge_points([a, finished("d", [point(0.5, 2, 0.6, 0.5)])])
    with pytest.raises(SystemExit, match="no results.json"):
        budget.merge_points([tmp_path / "missing"])
