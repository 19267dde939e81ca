"""Sweep grid expansion, resume logic and the results file, with a trivial command instead of training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.sweep import DONE_MARKER, FAILED_MARKER, SweepConfigError, load_sweep, main

# Writes one metrics line and counts its invocations; fails on seed 2 while FAIL_FILE exists.
FAKE = (
    "import json, pathlib, sys; d = pathlib.Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True); "
    "n = d / 'calls'; n.write_text(str(int(n.read_text()) + 1 if n.exists() else 1)); "
    "(d / 'metrics.jsonl').write_text(json.dumps({'iteration': 0, 'rollout/success_rate': 0.5}) + '\\n'); "
    "sys.exit(3 if sys.argv[2] == '2' and pathlib.Path(sys.argv[3]).exists() else 0)"
)


def write_config(tmp_path: Path, methods='["FAKE"]', extra="") -> Path:
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(f"""
[sweep]
name = "t"
runs_dir = "{tmp_path / 'runs'}"
envs = ["ARL/Sokoban-v0"]
seeds = [1, 2]
methods = {methods}

[methods.FAKE]
command = ["python", "-c", {json.dumps(FAKE)}, "{{run_dir}}", "{{seed}}", "{tmp_path / 'FAIL'}"]
dimension = "Test"
{extra}
""")
    return cfg


def calls(tmp_path: Path) -> dict[str, int]:
    return {p.parent.name: int(p.read_text()) for p in sorted((tmp_path / "runs").glob("*/calls"))}


def test_resume_skips_finished_runs_and_retries_failed_ones(tmp_path, capsys):
    cfg = write_config(tmp_path)
    (tmp_path / "FAIL").touch()
    assert main([str(cfg), "run"]) == 1
    assert calls(tmp_path) == {"FAKE__Sokoban-v0__s1": 1, "FAKE__Sokoban-v0__s2": 1}
    runs = tmp_path / "runs"
    assert (runs / "FAKE__Sokoban-v0__s1" / DONE_MARKER).is_file()
    assert (runs / "FAKE__Sokoban-v0__s2" / FAILED_MARKER).is_file()
    results = json.loads((runs / "results.json").read_text())["runs"]
    assert [r["status"] for r in results] == ["done", "failed"]
    assert results[0]["stability"]["best_success"] == 0.5 and results[0]["dimension"] == "Test"

    (tmp_path / "FAIL").unlink()
    assert main([str(cfg), "run"]) == 0
    assert calls(tmp_path) == {"FAKE__Sokoban-v0__s1": 1, "FAKE__Sokoban-v0__s2": 2}
    assert "skip (done): FAKE__Sokoban-v0__s1" in capsys.readouterr().out
    assert not (runs / "FAKE__Sokoban-v0__s2" / FAILED_MARKER).exists()
    meta = json.loads((runs / "FAKE__Sokoban-v0__s2" / "sweep_run.json").read_text())
    assert (meta["method"], meta["env"], meta["seed"]) == ("FAKE", "ARL/Sokoban-v0", 2)

    assert main([str(cfg), "run"]) == 0  # everything done: nothing runs again
    assert calls(tmp_path) == {"FAKE__Sokoban-v0__s1": 1, "FAKE__Sokoban-v0__s2": 2}


def test_array_index_runs_one_point(tmp_path):
    cfg = write_config(tmp_path)
    assert main([str(cfg), "run", "--index", "1"]) == 0
    assert calls(tmp_path) == {"FAKE__Sokoban-v0__s2": 1}
    assert main([str(cfg), "run", "--index", "7"]) == 2


def test_training_script_summary_counts_as_finished(tmp_path):
    cfg = write_config(tmp_path)
    finished = tmp_path / "runs" / "FAKE__Sokoban-v0__s1"
    finished.mkdir(parents=True)
    (finished / "summary.json").write_text("{}")
    assert main([str(cfg), "run"]) == 0
    assert calls(tmp_path) == {"FAKE__Sokoban-v0__s2": 1}


def test_grid_and_method_mapping(tmp_path, capsys):
    cfg = write_config(tmp_path, methods='["GRPO_ST", "DAPO_GiGPO", "SAMPO"]',
                       extra='[grid]\n"--learning-rate" = ["1e-5", "3e-5"]\n[method_args]\nSAMPO = ["--x", "1"]\n')
    sweep = load_sweep(cfg, launcher="accelerate launch --num_processes 8")
    assert len(sweep.jobs) == 3 * 2 * 2 and len({j.name for j in sweep.jobs}) == 12
    first = sweep.jobs[0]
    assert first.argv[:6] == ["accelerate", "launch", "--num_processes", "8", "algos/grpo.py", "--loss-agg-mode"]
    assert first.argv[6] == "seq-mean-token-mean" and first.overrides == {"--learning-rate": "1e-5"}
    assert first.argv[-8:] == ["--env-id", "ARL/Sokoban-v0", "--seed", "1", "--run-name", first.name,
                               "--output-dir", str(tmp_path / "runs")]
    dapo = next(j for j in sweep.jobs if j.method == "DAPO_GiGPO")
    assert dapo.argv[4:7] == ["algos/dapo.py", "--advantage", "gigpo"] and dapo.dimension == "Dyn. sampling"
    assert ["--x", "1"] == next(j for j in sweep.jobs if j.method == "SAMPO").argv[-10:-8]
    assert main([str(cfg), "print"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 12
    assert main([str(cfg), "array"]) == 0
    assert "--array=0-11" in capsys.readouterr().out


@pytest.mark.parametrize("body", ["not toml [", '[sweep]\nmethods = ["NOPE"]\nenvs = ["e"]\nseeds = [1]',
                                  '[sweep]\nmethods = "GRPO"\nenvs = ["e"]\nseeds = [1]', "[sweep]\n"])
def test_bad_config_is_a_clear_error(tmp_path, body, capsys):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    with pytest.raises(SweepConfigError):
        load_sweep(cfg)
    assert main([str(cfg), "run"]) == 2
    assert "error:" in capsys.readouterr().err


def test_shipped_config_loads():
    sweep = load_sweep(Path(__file__).parents[1] / "eval" / "configs" / "four_dims.toml")
    assert {j.method for j in sweep.jobs} >= {"GRPO", "GSPO", "SAMPO"}
    assert all(j.argv[0] == "python" and j.argv[1].startswith("algos/") for j in sweep.jobs)


def test_kl_off_config_is_the_stress_setting_with_one_change():
    """stress_kl_off.toml's runs are stress.toml's, flag for flag, but for --kl-coef 0 (a lever, not a new setting)."""
    configs = Path(__file__).parents[1] / "eval" / "configs"
    stress = {(j.method, j.seed): j.argv for j in load_sweep(configs / "stress.toml").jobs}
    kl_off = load_sweep(configs / "stress_kl_off.toml").jobs
    assert {j.method for j in kl_off} == {"SAPO", "CISPO", "GSPO", "SAMPO", "GRPO"} and len(kl_off) == 15
    for job in kl_off:
        base = stress[job.method, job.seed]
        assert job.overrides == {"--kl-coef": "0"} and job.argv[:2] == base[:2]
        flags = job.argv[2:]
        assert flags[:2] == ["--kl-coef", "0"] and "--kl-coef" not in flags[2:]
        strip = {base[-3], base[-1]}  # the run name and runs folder differ by design
        assert [a for a in flags[2:] if a not in strip | {job.name, "runs/stress_kl_off"}] == \
            [a for a in base[2:] if a not in strip]


# A stand-in training script: records its flags; fails while FAIL exists after writing metrics (and a checkpoint
# pointer when asked), as a run killed mid-way would leave its folder.
SCRIPT = """
import json, pathlib, sys
a = sys.argv[1:]
d = pathlib.Path(a[a.index("--output-dir") + 1]) / a[a.index("--run-name") + 1]
d.mkdir(parents=True, exist_ok=True)
with open(d / "argv.jsonl", "a") as f:
    f.write(json.dumps(a) + "\\n")
(d / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "rollout/success_rate": 0.5}) + "\\n")
if pathlib.Path(__file__).with_name("CKPT").exists():
    (d / "checkpoints").mkdir(exist_ok=True)
    (d / "checkpoints" / "latest.json").write_text("{}")
sys.exit(3 if pathlib.Path(__file__).with_name("FAIL").exists() else 0)
"""


@pytest.mark.parametrize("checkpoint, expected", [(True, "--resume"), (False, "--overwrite")])
def test_rerun_of_a_failed_script_run_resumes_or_starts_over(tmp_path, checkpoint, expected):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    (tmp_path / "FAIL").touch()
    if checkpoint:
        (tmp_path / "CKPT").touch()
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(f"""
[sweep]
name = "t"
runs_dir = "{tmp_path / 'runs'}"
envs = ["ARL/Sokoban-v0"]
seeds = [1]
methods = ["S"]

[methods.S]
script = "{script}"
dimension = "Test"
""")
    assert main([str(cfg), "run"]) == 1
    (tmp_path / "FAIL").unlink()
    assert main([str(cfg), "run"]) == 0
    lines = (tmp_path / "runs" / "S__Sokoban-v0__s1" / "argv.jsonl").read_text().splitlines()
    first, second = (json.loads(line) for line in lines)
    assert "--resume" not in first and "--overwrite" not in first
    assert second[-1] == expected and expected not in second[:-1]
