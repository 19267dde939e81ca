"""eval.practitioner (the guide's reward-density and world-transfer studies) and the TextWorld ids they train on:
presets, the RL command lines each run gets, summaries and the report; one slow end-to-end run on real games."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from conftest import load_script
from hypothesis import given
from hypothesis import strategies as st

from arena_envs import env_recipe, held_out_split
from arena_train.cli import parse_args
from eval import mini_arena, practitioner

ROOT = Path(__file__).resolve().parents[1]
#: id -> (world_size, nb_objects, quest_length): the guide's w2-o3-q4, w4-o6-q8 and a doubled w8-o12-q16
WORLDS = {"ARL/TextWorld-Small-v0": (2, 3, 4), "ARL/TextWorld-Medium-v0": (4, 6, 8),
          "ARL/TextWorld-Large-v0": (8, 12, 16)}


@pytest.mark.parametrize("env_id", sorted(WORLDS))
def test_world_ids_make_the_guides_custom_worlds(env_id):
    env = gym.make(env_id)  # no game is generated before reset
    raw = env.unwrapped
    world_size, nb_objects, quest_length = WORLDS[env_id]
    assert raw.kind == "tw-custom" and raw.num_games == 20
    assert (raw.settings["world_size"], raw.settings["nb_objects"], raw.settings["quest_length"]) == WORLDS[env_id]
    # the turn budget is twice the quest's length (the guide: gains saturate at about 2x the optimal length)
    assert gym.spec(env_id).max_episode_steps == 2 * quest_length == env_recipe(env_id)["max_turns"]
    assert held_out_split(env_id) == "test" and gym.make(env_id, split="test").unwrapped.split == "test"
    env.close()


def test_mini_id_is_the_cooking_game_with_fewer_games():
    mini, full = gym.make("ARL/TextWorld-Mini-v0").unwrapped, gym.make("ARL/TextWorld-v0").unwrapped
    assert (mini.kind, mini.settings, mini.rewards) == (full.kind, full.settings, full.rewards) == \
        ("tw-cooking", full.settings, "dense")
    assert (mini.num_games, full.num_games) == (20, 100)
    # the same game seeds: Mini's games are the first 20 of TextWorld-v0's, in each split
    assert [mini.game_seed(i) for i in range(20)] == [full.game_seed(i) for i in range(20)]


@pytest.mark.parametrize("preset", sorted(practitioner.PRESETS))
def test_presets_fill_every_unset_field(preset):
    args = practitioner.resolve(practitioner.Args(preset=preset))
    assert all(v is not None for v in vars(args).values())
    assert args.env_id in args.eval_env_ids  # the training env's own held-out games are always evaluated


def test_bad_settings_exit_with_a_message():
    with pytest.raises(SystemExit, match="algos/nope.py"):
        practitioner.resolve(practitioner.Args(methods=["nope"]))
    with pytest.raises(SystemExit, match="--densities"):
        practitioner.resolve(practitioner.Args(densities=[]))


@pytest.mark.parametrize("method", ["grpo", "rloo", "ppo"])
@pytest.mark.parametrize("density", ["sparse", "dense"])
def test_each_run_gets_its_method_density_and_the_studys_settings(method, density):
    args = practitioner.resolve(practitioner.Args(preset="density", rl_args=["--kl-coef", "0"]))
    arena = practitioner.arena_args(args)
    assert (arena.env_id, arena.max_prompt_tokens, arena.rl_iterations) == (args.env_id, 1024, args.rl_iterations)
    run = practitioner.dataclasses.replace(arena, rl_script=method,
                                           rl_args=["--reward-density", density, *args.rl_args])
    cmd = mini_arena.rl_command(run, 2, Path("bc"), Path("runs"))
    script = load_script(method)
    parsed = parse_args(script.Args, script.GPU_PROFILE, cmd[2:])  # every flag exists in the script
    assert cmd[1].endswith(f"{method}.py")
    assert (parsed.reward_density, parsed.env_id, parsed.max_prompt_tokens, parsed.seed, parsed.kl_coef) == \
        (density, ["ARL/TextWorld-Mini-v0"], 1024, 2, 0.0)
    assert parsed.eval.eval_every == 0  # the study evaluates every model itself, on the same held-out seeds


def _per_seed(wins: dict[str, list[list[int]]], envs: list[str]) -> list[dict]:
    """Fake per-seed records: wins[name][seed index] = per-task-seed outcomes, the same on every env."""
    out = []
    for k in range(len(wins["bc"])):
        evals = {env: {name: {"success": {"mean": sum(w[k]) / len(w[k])}, "score": {"mean": 2.0 * sum(w[k])},
                              "valid_action": {"mean": 0.5}, "wins": w[k]} for name, w in wins.items()}
                 for env in envs}
        out.append({"seed": k + 1, "eval": evals})
    return out


@given(st.lists(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=3, max_size=3),
                min_size=1, max_size=4))
def test_summary_is_the_mean_over_seeds_and_the_pooled_paired_gain(seeds):
    wins = {"bc": [[a for a, _ in s] for s in seeds], "grpo/dense": [[b for _, b in s] for s in seeds]}
    summary = practitioner.summarize(_per_seed(wins, ["E"]), ["E"], ["bc", "grpo/dense"])["E"]
    n = len(seeds)
    assert math.isclose(summary["bc"]["success"]["mean"], sum(sum(w) / 3 for w in wins["bc"]) / n, abs_tol=1e-12)
    gain = summary["grpo/dense"]["paired_gain"]
    diffs = [b - a for s in seeds for a, b in s]
    assert gain["n"] == 3 * n and math.isclose(gain["mean"], sum(diffs) / len(diffs), abs_tol=1e-12)
    assert gain["low"] <= gain["mean"] + 1e-12 <= gain["high"] + 2e-12
    assert "paired_gain" not in summary["bc"] and summary["bc"]["success"]["n"] == n


def test_report_has_one_table_per_env_and_the_transfer_table(tmp_path):
    envs = ["ARL/TextWorld-Small-v0", "ARL/TextWorld-Large-v0"]
    wins = {"bc": [[1, 0, 0], [1, 0, 0]], "grpo/sparse": [[1, 1, 0], [1, 0, 1]]}
    args = practitioner.resolve(practitioner.Args(preset="transfer", seeds=[1, 2], eval_env_ids=envs))
    results = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "summary": practitioner.summarize(_per_seed(wins, envs), envs, list(wins)), "wall_s": 60.0,
               "cpu_s": 30.0}
    text = practitioner.write_report(results, tmp_path)
    assert text == (tmp_path / "report.md").read_text()
    assert "## ARL/TextWorld-Small-v0" in text and "## ARL/TextWorld-Large-v0" in text
    assert "| TextWorld-Small-v0 | TextWorld-Large-v0 |" in text  # the transfer table's header
    assert "| GRPO sparse | 66.7" in text and "| 50 | 33 / 33 | - |" in text and "| 50 | 67 / 67 | " in text
    assert "one BC start (seed 1) shared by every run" in text and "CPU time 0.5 min" in text
    practitioner.plot(results, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
    # --report-only: the same summary and report from results.json's per-seed records
    results["per_seed"] = _per_seed(wins, envs)
    (tmp_path / "report.md").unlink()
    (tmp_path / "results.json").write_text(json.dumps({**results, "summary": {}}))
    again = practitioner.main(practitioner.Args(out=tmp_path, report_only=True))
    assert again["summary"] == json.loads(json.dumps(results["summary"]))
    assert (tmp_path / "report.md").read_text() == text and (tmp_path / "practitioner.png").is_file()
    with pytest.raises(SystemExit, match="no results.json"):
        practitioner.main(practitioner.Args(out=tmp_path / "missing", report_only=True))


@pytest.mark.slow
def test_transfer_study_end_to_end(tmp_path):
    """BC on small worlds, one GRPO run, held-out evaluation on small and large worlds (real TextWorld games)."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "eval.practitioner", "--preset", "transfer", "--out", str(out), "--seeds", "3",
           "--eval-env-ids", "ARL/TextWorld-Small-v0", "ARL/TextWorld-Large-v0", "--bc-episodes", "3",
           "--bc-max-steps", "2", "--bc-batch-size", "4", "--bc-eval-every", "2", "--bc-eval-start", "2",
           "--bc-eval-episodes", "1", "--rl-iterations", "1", "--num-groups", "2", "--group-size", "2",
           "--mini-batch-size", "16", "--eval-episodes", "2", "--max-response-tokens", "6"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "ARENA_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    (seed,) = results["per_seed"]
    assert set(seed["eval"]) == {"ARL/TextWorld-Small-v0", "ARL/TextWorld-Large-v0"}
    for models in seed["eval"].values():
        assert set(models) == {"bc", "grpo/sparse"}
        assert all(len(m["wins"]) == 2 and m["success"]["n"] == 2 for m in models.values())
    assert "--reward-density sparse" in seed["runs"]["grpo/sparse"]["command"]
    assert (out / "bc" / "bc_summary.json").is_file() and (out / "seed3" / "sparse" / "grpo" / "final").is_dir()
    assert results["cpu_s"] > 0 and (out / "practitioner.png").stat().st_size > 1000
    report = (out / "report.md").read_text()
    assert "GRPO sparse" in report and "TextWorld-Large-v0" in report
    # --resume reuses the BC start and the run and only evaluates again
    again = subprocess.run(cmd + ["--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "reusing" in again.stdout
    assert json.loads((out / "results.json").read_text())["per_seed"][0]["eval"] == seed["eval"]
