"""Mistakes on the real command line end in one or two lines that say what to do, before anything heavy starts:
unknown env id, missing or wrong model path, missing optional extra, out-of-range values, an output folder that
cannot be written or already holds a run, a damaged run on ``--resume``. Each case runs the script itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GRPO = ROOT / "algos" / "grpo.py"
SFT = ROOT / "algos" / "sft.py"


def run(*argv: str, pythonpath: str | None = None, cwd: Path = ROOT,
        hub: str | None = None) -> subprocess.CompletedProcess:
    """``python *argv`` offline; ``hub``: the Hugging Face endpoint instead of offline mode."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    if hub is not None:
        env.pop("HF_HUB_OFFLINE")
        env["HF_ENDPOINT"] = hub
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, env.get("PYTHONPATH", str(ROOT))])
    return subprocess.run([sys.executable, *map(str, argv)], env=env, capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def short_error(proc: subprocess.CompletedProcess) -> str:
    """The error text, checked to be an error exit of at most two lines and no traceback."""
    assert proc.returncode != 0, proc.stdout[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert 1 <= len(lines) <= 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr


def test_unknown_env_id_lists_the_registered_ids(tmp_path):
    err = short_error(run(GRPO, "--env-id", "ARL/Sokoban-v9", "--model-path", "tiny", "--output-dir", tmp_path / "o"))
    assert "unknown env id 'ARL/Sokoban-v9'" in err and "ARL/Sokoban-v0" in err and "ARL/WebShop-v0" in err
    assert not (tmp_path / "o").exists()  # nothing on disk before the start-up checks pass


def test_unknown_env_id_in_sft():
    assert "unknown env id" in short_error(run(SFT, "--env-id", "nope"))


def test_evaluate_names_the_registered_ids_and_what_to_pass_as_model(tmp_path):
    assert "registered ids: ARL/Sokoban-v0" in short_error(run("-m", "eval.evaluate", "--env-id", "nope"))
    err = short_error(run("-m", "eval.evaluate", "--model", tmp_path / "none", "--num-seeds", "1"))
    assert "no such folder" in err and "'tiny'" in err


@pytest.mark.parametrize("kind", ["missing", "uncached-hub-id"])
def test_model_path_that_cannot_load_says_what_to_pass(kind, tmp_path):
    path = {"missing": str(tmp_path / "nowhere" / "model"), "uncached-hub-id": "nobody-org/no-such-model"}[kind]
    err = short_error(run(GRPO, "--model-path", path))
    assert f"--model-path {path}" in err and "'tiny'" in err


def test_missing_model_path_in_sft(tmp_path):
    assert "no such folder" in short_error(run(SFT, "--model-path", tmp_path / "a" / "b", "--output-dir", tmp_path))


def blocked(tmp_path: Path, package: str) -> str:
    """A folder to put first on PYTHONPATH in which ``import package`` fails as if it were not installed."""
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text(f'raise ModuleNotFoundError("No module named {package!r}")\n')
    return str(tmp_path)


@pytest.mark.parametrize(("env_id", "package"), [("ARL/TextWorld-v0", "textworld"), ("ARL/ALFWorld-v0", "alfworld")])
def test_missing_engine_extra_gives_the_pip_line(env_id, package, tmp_path):
    err = short_error(run(GRPO, "--env-id", env_id, "--model-path", "tiny", pythonpath=blocked(tmp_path, package)))
    assert f"{env_id} needs the {package} extra: pip install 'arlarena[{package}]'" in err


def test_missing_vllm_extra_gives_the_pip_line(tmp_path):
    err = short_error(run(GRPO, "--rollout-backend", "vllm", "--model-path", "tiny",
                          pythonpath=blocked(tmp_path, "vllm")))
    assert "pip install 'arlarena[vllm]'" in err


@pytest.mark.parametrize(("flag", "value", "expected"), [
    ("--top-p", "1.5", "--top-p must be in (0, 1]"), ("--learning-rate", "nan", "--learning-rate must be > 0")])
def test_out_of_range_value_names_the_flag(flag, value, expected, tmp_path):
    assert expected in short_error(run(GRPO, flag, value, "--model-path", "tiny", "--output-dir", tmp_path / "o"))
    assert not (tmp_path / "o").exists()  # nothing on disk before the start-up checks pass


def test_out_of_range_value_in_sft(tmp_path):
    assert "--eval-every must be >= 1" in short_error(run(SFT, "--eval-every", "0", "--output-dir", tmp_path))


def test_unwritable_output_folder_is_named(tiny_model, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    err = short_error(run(GRPO, "--model-path", tiny_model, "--output-dir", blocker))
    assert f"output folder {blocker}" in err and "not writable" in err and "--output-dir" in err


def test_existing_run_without_resume_is_refused_and_kept(tiny_model, tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"iteration": 1}\n')
    err = short_error(run(GRPO, "--model-path", tiny_model, "--output-dir", tmp_path, "--run-name", "r"))
    assert "already holds a run" in err and "--overwrite" in err
    assert (run_dir / "metrics.jsonl").read_text() == '{"iteration": 1}\n'


def test_existing_sft_output_needs_overwrite(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    err = short_error(run(SFT, "--output-dir", tmp_path, "--num-episodes", "1"))
    assert "already holds a run (config.json); pass --overwrite" in err


def test_resume_without_latest_json_is_an_error_not_a_fresh_start(tiny_model, tmp_path):
    run_dir = tmp_path / "r"
    (run_dir / "checkpoints" / "iter_000001").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"iteration": 1}\n')
    err = short_error(run(GRPO, "--model-path", tiny_model, "--output-dir", tmp_path, "--run-name", "r", "--resume"))
    assert "latest.json is missing" in err and "--resume-fallback" in err
    assert (run_dir / "metrics.jsonl").read_text() == '{"iteration": 1}\n'


#: A hub endpoint that refuses connections at once: the hub unreachable, with no network needed by the test.
NO_HUB = "http://127.0.0.1:9"
#: Start-up errors, each (flags, what its message says, a blocked package or None, the hub endpoint or None);
#: the unreachable hub id, a bad flag value and an unknown env id have their own tests, which check the same.
STARTUP_ERRORS = {
    "track-without-wandb": (["--track", "--model-path", "tiny"], 'pip install -e ".[wandb]"', "wandb", None),
    "prompt-too-long": (["--max-prompt-tokens", "8"], "more than --max-prompt-tokens 8", None, None),
    "unknown-chat-template": (["--chat-template", "qwen9"], "--chat-template qwen9: neither a .jinja file", None,
                              None),
    "chat-template-kwargs-not-json": (["--chat-template-kwargs", "enable_thinking=false"],
                                      "--chat-template-kwargs 'enable_thinking=false': not JSON", None, None),
}


@pytest.mark.parametrize("case", sorted(STARTUP_ERRORS))
def test_a_start_up_error_leaves_nothing_on_disk(case, tiny_model, tmp_path):
    """Every start-up error is one line and leaves no run folder (nor the output folder it would have made), so
    the corrected command is not refused as a second run; the prompt check comes after args.json was written."""
    flags, expected, blocked_package, hub = STARTUP_ERRORS[case]
    if "--model-path" not in flags:
        flags = [*flags, "--model-path", tiny_model]
    out = tmp_path / "out" / "runs"
    err = short_error(run(GRPO, *flags, "--output-dir", out, "--run-name", "r", hub=hub,
                          pythonpath=blocked(tmp_path, blocked_package) if blocked_package else None))
    assert expected in err
    assert not (tmp_path / "out").exists()


def test_an_unreachable_hub_id_is_one_line_within_seconds_and_leaves_nothing(tmp_path):
    started = time.perf_counter()
    err = short_error(run(GRPO, "--model-path", "someuser/not-a-model", "--output-dir", tmp_path / "out", hub=NO_HUB))
    assert time.perf_counter() - started < 40  # imports included; the hub library's retries took about 50 s
    assert err.startswith("error: --model-path someuser/not-a-model is not in the Hugging Face cache and the hub "
                          "cannot be reached") and "HF_HUB_OFFLINE=1" in err and "'tiny'" in err
    assert not (tmp_path / "out").exists()


def test_resume_of_a_run_that_does_not_exist_trains_nothing(tmp_path):
    (tmp_path / "grpo-a" / "checkpoints").mkdir(parents=True)
    err = short_error(run(GRPO, "--model-path", "tiny", "--output-dir", tmp_path, "--run-name", "grpo-typo",
                          "--resume"))
    assert f"no run in {tmp_path / 'grpo-typo'}; runs in {tmp_path}: grpo-a" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grpo-a"]


def test_dry_run_that_does_not_fit_ends_cleanly_under_accelerate_launch():
    """The plan's status 1 would become accelerate's CalledProcessError traceback: under a launcher the plan ends
    with a plain "does not fit" line and status 0 (python script.py --dry-run keeps status 1)."""
    proc = run("-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1", "--cpu",
               "--mixed_precision", "no", "--dynamo_backend", "no", GRPO, "--profile", "gpu", "--model-path",
               "Qwen/Qwen3-8B", "--dry-run")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "does NOT fit" in proc.stdout and proc.stdout.splitlines()[-1].startswith("does not fit (see above)")


@pytest.mark.slow
def test_mini_arena_passes_several_rl_flags(tmp_path):
    """The README's form (everything after --rl-args) and a quoted, repeated one reach the RL script."""
    out = tmp_path / "out"
    proc = run("-m", "eval.mini_arena", "--out", out, "--bc-episodes", "10", "--bc-max-steps", "2",
               "--bc-eval-episodes", "2", "--bc-eval-start", "1", "--bc-eval-every", "1", "--rl-iterations", "1",
               "--num-groups", "1", "--group-size", "2", "--mini-batch-size", "4", "--rl-eval-every", "1",
               "--rl-eval-episodes", "1", "--eval-episodes", "2",
               "--rl-args", "--cold-start-steps", "5", "--kl-coef", "0", "--rl-args", "--entropy-coef 0.5 --top-p 0.9",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    args = json.loads((out / "seed1" / "sampo" / "args.json").read_text())
    assert (args["cold_start_steps"], args["kl_coef"], args["entropy_coef"], args["top_p"]) == (5, 0, 0.5, 0.9)
