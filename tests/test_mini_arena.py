"""eval.mini_arena: the whole pipeline end to end with tiny settings, reproducibility, bad input, summaries."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script
from hypothesis import given
from hypothesis import strategies as st

from arena_train.cli import parse_args
from eval import mini_arena
from eval.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--bc-episodes", "12", "--bc-max-steps", "4", "--bc-batch-size", "8", "--bc-eval-every", "2",
        "--bc-eval-episodes", "2", "--bc-eval-start", "2", "--rl-iterations", "2", "--num-groups", "2",
        "--group-size", "2",
        "--mini-batch-size", "16", "--rl-eval-every", "1", "--rl-eval-episodes", "2", "--eval-episodes", "3",
        "--max-response-tokens", "12"]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "ARENA_CACHE": str(tmp_path / "cache")}


def _without_times(record):
    """A record without wall times, throughputs and paths (what may differ between two runs of one seed)."""
    if isinstance(record, dict):
        return {k: _without_times(v) for k, v in record.items()
                if k not in ("seconds", "time_s", "timing", "command", "model") and not k.startswith(("perf/", "time"))}
    if isinstance(record, list):
        return [_without_times(v) for v in record]
    return record


@pytest.mark.slow
def test_pipeline_end_to_end(tmp_path):
    """Seeds 3 and 4 in processes of their own (evaluation in line), then seed 4 alone with its evaluation in the
    second process (--overlap): the same numbers for seed 4."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "eval.mini_arena", "--out", str(out), "--seeds", "3", "4", "--seed-workers", "2",
           *TINY]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "2 pipeline seeds, 2 at a time" in proc.stdout
    alone = tmp_path / "alone"
    cmd = [sys.executable, "-m", "eval.mini_arena", "--out", str(alone), "--seeds", "4", "--overlap", *TINY]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    full = json.loads((out / "results.json").read_text())
    assert [r["seed"] for r in full["per_seed"]] == [3, 4]
    seed4 = json.loads((alone / "results.json").read_text())["per_seed"][0]
    assert _without_times(seed4) == _without_times(full["per_seed"][1])
    seed = full["per_seed"][0]
    # BC stopped at a validation check; the RL script logged every iteration and its held-out evaluations
    assert seed["bc"]["step"] in (2, 4) and seed["bc"]["curve"][-1]["step"] >= seed["bc"]["step"]
    metrics = seed["rl"]["metrics"]
    assert [m["iteration"] for m in metrics] == [1, 2] and all("eval/success_rate" in m for m in metrics)
    assert seed["rl"]["command"][:3] == [sys.executable, "-m", "accelerate.commands.launch"]  # 2 RL processes
    assert any(c.endswith("sampo.py") for c in seed["rl"]["command"]) and "--cold-start-steps" in seed["rl"]["command"]
    # BC and RL are evaluated on the same held-out seeds, beside the expert and random baselines
    ev = seed["eval"]
    assert ev["bc"]["num_seeds"] == ev["rl"]["num_seeds"] == 3
    assert [b["name"] for b in ev["baselines"]] == ["expert", "teacher (greedy)", "random"]
    assert ev["baselines"][0]["success"]["mean"] == 1.0
    assert {"bc", "rl", "gain"} <= set(full["summary"])
    assert (out / "learning_curve.png").stat().st_size > 1000
    report = (alone / "report.md").read_text()
    assert "BC start" in report and "SAMPO" in report and "learning_curve.png" in report
    assert set(seed["timing"]) == {"bc_s", "rl_s", "eval_s"} and full["peak_rss_mb"] > 0
    # the report names its machine beside the figures and stage times, on the console too
    machine = json.loads((alone / "results.json").read_text())["machine"]
    assert machine == mini_arena.machine_info(1, 2, 2, 2) == full["machine"]
    assert f"Machine: {mini_arena.describe_machine(machine)}." in report and "Machine: " in proc.stdout


def test_bc_stage_is_reproducible(tmp_path, monkeypatch):
    monkeypatch.setenv("ARENA_CACHE", str(tmp_path / "cache"))
    args = mini_arena.resolve(mini_arena.Args(bc_episodes=8, bc_max_steps=2, bc_batch_size=4, bc_eval_every=2,
                                              bc_eval_episodes=1, max_response_tokens=4))
    first = mini_arena.run_bc(args, 5, tmp_path / "a")
    second = mini_arena.run_bc(args, 5, tmp_path / "b")
    assert first["curve"][0]["loss"] == second["curve"][0]["loss"] and first["examples"] == second["examples"]
    import torch
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("target", [1.0, 0.0])
def test_validation_in_the_second_process_changes_nothing(tmp_path, monkeypatch, target):
    """BC with its checks in the second process against checks in line: the same curve, checkpoint step and
    weights, also when the first check reaches the target (0.0) and training has gone on while it ran."""
    import torch
    from safetensors.torch import load_file

    from eval.side_process import SideProcess

    monkeypatch.setenv("ARENA_CACHE", str(tmp_path / "cache"))
    args = mini_arena.resolve(mini_arena.Args(bc_episodes=8, bc_max_steps=8, bc_batch_size=4, bc_eval_every=2,
                                              bc_eval_start=2, bc_eval_episodes=2, bc_target=target,
                                              max_response_tokens=4))
    side = SideProcess(1, 1)
    try:
        apart = mini_arena.run_bc(args, 5, tmp_path / "apart", side)
    finally:
        side.close()
    inline = mini_arena.run_bc(args, 5, tmp_path / "inline")
    strip = [[{k: v for k, v in c.items() if k != "time_s"} for c in r["curve"]] for r in (apart, inline)]
    assert strip[0] == strip[1] and len(strip[0]) == (1 if target == 0.0 else 4)
    assert apart["step"] == inline["step"] == (2 if target == 0.0 else apart["step"])
    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("apart", "inline"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_teacher_baseline_is_the_teacher_playing_the_held_out_rooms():
    import gymnasium as gym

    from arena_train.rollout import EVAL_SEED_OFFSET

    args = mini_arena.resolve(mini_arena.Args())
    seeds = [EVAL_SEED_OFFSET + k for k in range(12)]
    result = mini_arena.evaluate_teacher(args, seeds)
    env = gym.make(args.env_id, split="test").unwrapped
    wins = []
    for seed in seeds:  # the same rooms played directly, without prompts or parsing
        env.reset(seed=seed)
        for _ in range(gym.spec(args.env_id).max_episode_steps):
            _, _, done, _, info = env.step(env.teacher_plan(args.teacher)[0])
            if done:
                break
        wins.append(info["won"])
    assert result.name == "teacher (greedy)" and result.success.mean == sum(wins) / len(wins)
    assert [b.name for b in mini_arena.evaluate_baselines(args, seeds)] == ["expert", "teacher (greedy)", "random"]


@pytest.mark.parametrize("flag,value", [("--bc-max-steps", "0"), ("--think-horizon", "-1"), ("--num-groups", "0"),
                                        ("--rl-script", "nope"), ("--bc-threads", "0"), ("--rl-processes", "0")])
def test_bad_settings_exit_with_a_message(flag, value, capsys):
    args = mini_arena.Args(out=Path("unused"))
    setattr(args, flag.lstrip("-").replace("-", "_"), int(value) if value.lstrip("-").isdigit() else value)
    with pytest.raises(SystemExit) as err:
        mini_arena.resolve(args)
    assert flag in str(err.value) or value in str(err.value)


def test_rl_processes_fit_the_groups_and_evaluation_episodes(capsys):
    """The profile's 2 RL processes fall to 1 for a one-group try (each process plays an equal share); an explicit
    count that does not divide them stops before BC, naming the count that would."""
    args = mini_arena.resolve(mini_arena.Args(num_groups=1))
    assert args.rl_processes == 1 and "RL on 1 process(es)" in capsys.readouterr().out
    assert mini_arena.resolve(mini_arena.Args(num_groups=4, rl_eval_episodes=6)).rl_processes == 2
    assert mini_arena.resolve(mini_arena.Args(num_groups=6, rl_eval_episodes=9, rl_processes=3)).rl_processes == 3
    with pytest.raises(SystemExit, match="try --rl-processes 1"):
        mini_arena.resolve(mini_arena.Args(rl_eval_episodes=3, rl_processes=2))


def test_machine_info_names_the_cpu_cores_and_torch():
    import torch

    machine = mini_arena.machine_info(2, 1, 3, 4)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file() and "model name" in cpuinfo.read_text():
        assert machine["cpu"] in cpuinfo.read_text()
    assert machine["cores"] == len(os.sched_getaffinity(0)) and machine["torch"] == torch.__version__
    assert (machine["torch_threads"], machine["processes"], machine["bc_threads"], machine["rl_processes"]) == \
        (2, 1, 3, 4)
    assert "2 torch thread(s) per process, 1 process(es) at a time, BC on 3 thread(s), RL on 4 process(es)" in \
        mini_arena.describe_machine(machine)


def test_profiles_fill_every_unset_field():
    for profile in mini_arena.PROFILES:
        args = mini_arena.resolve(mini_arena.Args(profile=profile))
        assert all(v is not None for v in vars(args).values())


def test_rl_command_uses_the_scripts_flags():
    args = mini_arena.resolve(mini_arena.Args(rl_args=["--kl-coef", "0"]))
    cmd = mini_arena.rl_command(args, 7, Path("bc"), Path("runs"), port=29601)
    sampo = load_script("sampo")
    text = " ".join(cmd)
    assert "--seed 7" in text and f"--model-path {Path('bc').resolve()}" in text and "--prompt-style compact" in text
    assert cmd[-2:] == ["--kl-coef", "0"]
    script = next(k for k, c in enumerate(cmd) if c.endswith("sampo.py"))
    assert cmd[:script] == [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                            "--main_process_port", "29601"]  # the tiny profile's 2 RL processes
    parsed = parse_args(sampo.Args, sampo.GPU_PROFILE, cmd[script + 1:])  # every flag exists in the script
    assert parsed.num_iterations == args.rl_iterations and parsed.cold_start_steps == 0
    assert parsed.max_prompt_tokens == args.max_prompt_tokens == 512  # BC, RL and evaluation share the budget
    args.rl_processes = 1
    assert mini_arena.rl_command(args, 7, Path("bc"), Path("runs"))[:2] == [sys.executable, str(cmd[script])]


def test_bc_trains_on_its_threads_and_validates_on_the_evaluation_threads(tmp_path, monkeypatch):
    """--bc-threads sets the training steps' thread count only: validation in line runs at --torch-threads, as in
    the second process, so both give the same checks; the caller's count is restored afterwards."""
    import torch

    from arena_train import bc

    monkeypatch.setenv("ARENA_CACHE", str(tmp_path / "cache"))
    seen: dict[str, set[int]] = {"train": set(), "validate": set()}

    def counting(name, fn):
        def wrapped(*a, **k):
            seen[name].add(torch.get_num_threads())
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(mini_arena, "sft_loss", counting("train", bc.sft_loss))
    monkeypatch.setattr(bc, "validation_success", counting("validate", bc.validation_success))
    args = mini_arena.resolve(mini_arena.Args(bc_episodes=8, bc_max_steps=4, bc_batch_size=4, bc_eval_every=2,
                                              bc_eval_start=2, bc_eval_episodes=1, max_response_tokens=4,
                                              bc_threads=2, torch_threads=1))
    before = torch.get_num_threads()
    mini_arena.run_bc(args, 5, tmp_path / "bc")
    assert seen == {"train": {2}, "validate": {1}} and torch.get_num_threads() == before


@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=6))
def test_summary_over_seeds_is_the_mean_and_the_paired_gain(pairs):
    per_seed = [{"eval": {"bc": {"success": {"mean": b}}, "rl": {"success": {"mean": r}}}} for b, r in pairs]
    s = mini_arena.summarize_seeds(per_seed)
    n = len(pairs)
    assert math.isclose(s["bc"]["mean"], sum(b for b, _ in pairs) / n, abs_tol=1e-12)
    assert math.isclose(s["gain"]["mean"], s["rl"]["mean"] - s["bc"]["mean"], abs_tol=1e-9)
    assert s["gain"]["low"] <= s["gain"]["mean"] + 1e-12 <= s["gain"]["high"] + 2e-12
    assert s["bc"]["n"] == n


def test_merge_combines_seeds_and_rejects_mismatches(tmp_path):
    def fake(folder: Path, seed: int, lr: float, cpu: str = "cpu A") -> Path:
        folder.mkdir()
        record = {"args": {"seeds": [seed], "out": str(folder), "merge": [], "learning_rate": lr, "rl_script": "sampo"},
                  "machine": {"cpu": cpu, "cores": 2, "torch": "2.x", "torch_threads": 1, "processes": 2},
                  "per_seed": [{"seed": seed, "eval": {"bc": {"success": {"mean": 0.4}},
                                                       "rl": {"success": {"mean": 0.5 + seed / 100}}}}],
                  "wall_s": 60.0, "peak_rss_mb": 100.0 * seed}
        (folder / "results.json").write_text(json.dumps(record))
        return folder

    a, b = fake(tmp_path / "a", 1, 1e-4), fake(tmp_path / "b", 2, 1e-4)
    merged = mini_arena.merge_results([a, b])
    assert merged["args"]["seeds"] == [1, 2] and merged["wall_s"] == 120.0 and merged["peak_rss_mb"] == 200.0
    assert math.isclose(merged["summary"]["gain"]["mean"], 0.115)
    assert [m["cpu"] for m in merged["machines"]] == ["cpu A"]  # one machine named once, each of several named
    assert [m["cpu"] for m in mini_arena.merge_results([a, fake(tmp_path / "d", 4, 1e-4, "cpu B")])["machines"]] \
        == ["cpu A", "cpu B"]
    for bad in ([a, a], [a, fake(tmp_path / "c", 3, 3e-4)], [a, tmp_path / "missing"]):
        with pytest.raises(SystemExit):
            mini_arena.merge_results(bad)


def test_sweep_config_covers_the_papers_methods():
    sweep = load_sweep(ROOT / "eval" / "configs" / "mini_arena.toml")
    methods = {j.method for j in sweep.jobs}
    assert methods == {"GRPO", "GRPO_ST", "GSPO", "SAPO", "CISPO", "GiGPO", "EMPG", "DAPO_GRPO", "DAPO_GiGPO", "SAMPO"}
    assert len(sweep.jobs) == 30 and {j.seed for j in sweep.jobs} == {1, 2, 3}
    for job in sweep.jobs:  # every run starts from its seed's BC checkpoint of the pipeline, on the mini-arena env
        text = " ".join(job.argv)
        assert f"--model-path runs/mini_arena/seed{job.seed}/bc" in text and "ARL/Sokoban-Mini-v0" in text
