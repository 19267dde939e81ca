"""A run folder is data, never instructions: loading one runs none of its code, writes stay inside it, the env
servers a run plays on are the command line's, one live run holds a folder, and the verdict counts every
held-out episode. Each case is the attack a hostile folder makes (or the loss a cap made), carried out."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import needs_accelerate

from arena_train.checkpoint import (
    CheckpointError,
    load_checkpoint,
    pickled_code_problem,
    resume_latest,
    save_checkpoint,
    write_manifest,
)
from arena_train.episodes import episode_file, read_episodes, write_episodes
from arena_train.logger import MetricsLogger
from arena_train.monitor import CollapseConfig, CollapseMonitor
from arena_train.run import LOCK, Run, discard_unstarted, first_missing, prepare_run_dir, run_dir_problem
from arena_train.safe_files import LinkError, atomic_write_text
from arena_train.verdict import run_verdict, verdict_line

ROOT = Path(__file__).resolve().parents[1]


class Payload:
    """What a hostile checkpoint pickles: unpickling it writes ``marker`` (standing for any code)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def plant_payload(folder: Path, marker: Path, name: str = "custom_checkpoint_0.pkl") -> None:
    """``name`` in checkpoint ``folder`` made a payload, and the manifest rewritten to match (as its author can)."""
    torch.save({"state": Payload(marker)}, folder / name)
    write_manifest(folder, json.loads((folder / "manifest.json").read_text())["iteration"])


def link(at: Path, target: Path) -> Path:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(target)
    return target


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder outside every run, with a file a planted link points at."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "precious.txt").write_text("precious")
    return folder


def untouched(outside: Path) -> bool:
    return sorted(p.name for p in outside.iterdir()) == ["precious.txt"] and \
        (outside / "precious.txt").read_text() == "precious"


@pytest.fixture
def prepared():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


# --- 1. loading a checkpoint runs none of its code ----------------------------------------------------------------
def test_a_resigned_pickle_beside_the_json_state_never_runs(prepared, tmp_path):
    accelerator, _, _ = prepared
    monitor = CollapseMonitor(CollapseConfig())
    monitor.update(1, {"actor/grad_norm": 1.0})
    save_checkpoint(accelerator, tmp_path / "r", 1, states={"monitor": monitor})
    folder = tmp_path / "r" / "checkpoints" / "iter_000001"
    assert (folder / "monitor.json").is_file() and not list(folder.glob("custom_checkpoint_*"))
    marker = tmp_path / "ran"
    plant_payload(folder, marker)
    fresh = CollapseMonitor(CollapseConfig())
    assert resume_latest(accelerator, tmp_path / "r", states={"monitor": fresh}) == 1
    assert not marker.exists() and fresh.state_dict() == monitor.state_dict()


def test_a_checkpoint_of_an_older_run_resumes_its_plain_state_and_refuses_code(prepared, tmp_path):
    accelerator, _, _ = prepared
    monitor = CollapseMonitor(CollapseConfig())
    monitor.update(1, {"actor/grad_norm": 2.0})
    save_checkpoint(accelerator, tmp_path / "r", 1, states={"monitor": monitor})
    folder = tmp_path / "r" / "checkpoints" / "iter_000001"
    (folder / "monitor.json").unlink()  # as Accelerate's register_for_checkpointing wrote it before
    torch.save(monitor.state_dict(), folder / "custom_checkpoint_0.pkl")
    write_manifest(folder, 1)
    fresh = CollapseMonitor(CollapseConfig())
    assert resume_latest(accelerator, tmp_path / "r", states={"monitor": fresh}) == 1
    assert fresh.state_dict() == monitor.state_dict()
    marker = tmp_path / "ran"
    plant_payload(folder, marker)
    with pytest.raises(SystemExit, match=r"custom_checkpoint_0\.pkl holds more than plain data") as exc:
        resume_latest(accelerator, tmp_path / "r", states={"monitor": CollapseMonitor(CollapseConfig())})
    assert "\n" not in str(exc.value) and not marker.exists()


def test_a_rollback_onto_a_checkpoint_with_a_payload_runs_none_of_it(prepared, tmp_path):
    from arena_train.monitor import Decision, restore_healthy

    accelerator, _, optimizer = prepared
    monitor = CollapseMonitor(CollapseConfig(on_collapse="rollback"))
    monitor.checkpointed(1)
    save_checkpoint(accelerator, tmp_path / "r", 1, states={"monitor": monitor})
    marker = tmp_path / "ran"
    plant_payload(tmp_path / "r" / "checkpoints" / "iter_000001", marker)
    folder = restore_healthy(accelerator, tmp_path / "r", monitor, Decision("rollback", 1, 0.5, "x"), 5, optimizer)
    assert folder.name == "iter_000001" and not marker.exists() and monitor.state["checkpoints"] == [1, 5]


def test_a_payload_in_the_optimizer_file_is_refused_unrun(prepared, tmp_path):
    accelerator, _, _ = prepared
    save_checkpoint(accelerator, tmp_path / "r", 1)
    folder = tmp_path / "r" / "checkpoints" / "iter_000001"
    marker = tmp_path / "ran"
    plant_payload(folder, marker, "optimizer.bin")
    with pytest.raises(CheckpointError, match="optimizer.bin|holds more than plain data"):
        load_checkpoint(accelerator, folder)
    assert not marker.exists()
    pickle.loads(pickle.dumps(Payload(marker)))  # a real payload: unpickled, it runs
    assert marker.read_text() == "ran"


def test_a_payload_in_the_rng_file_is_refused_not_skipped(prepared, tmp_path):
    """Accelerate skips an RNG file it cannot load with a log line: the run would go on with other streams."""
    accelerator, _, _ = prepared
    save_checkpoint(accelerator, tmp_path / "r", 1)
    marker = tmp_path / "ran"
    plant_payload(tmp_path / "r" / "checkpoints" / "iter_000001", marker, "random_states_0.pkl")
    with pytest.raises(SystemExit, match=r"random_states_0\.pkl holds more than plain data") as exc:
        resume_latest(accelerator, tmp_path / "r")
    assert "\n" not in str(exc.value) and not marker.exists()


def test_a_payload_in_a_sharded_checkpoint_is_refused_unrun(tmp_path):
    """FSDP2's sharded checkpoints are read by torch.distributed.checkpoint with plain pickle (.metadata) and
    ``weights_only=False`` (non-tensor entries): both are checked first."""
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "ran"
    folder = tmp_path / "iter_000001"
    state = {"w": torch.randn(3, 2), "h": torch.ones(2, dtype=torch.bfloat16).t(), "step": 3,
             "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99)}]}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder / "pytorch_model_fsdp_0")))
    assert pickled_code_problem(folder) is None  # plain state passes
    dcp.save({"w": torch.randn(2), "param_groups": Payload(marker)},
             storage_writer=dcp.FileSystemWriter(str(folder / "optimizer_0")))
    assert "__0_0.distcp holds more than plain data in entry 'param_groups'" in pickled_code_problem(folder)
    (folder / "optimizer_0" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    assert "optimizer_0/.metadata holds more than plain data (it names builtins.exec)" in pickled_code_problem(folder)
    assert not marker.exists()


@pytest.mark.slow
@needs_accelerate
def test_a_real_fsdp2_checkpoint_resumes_and_a_payload_in_it_is_refused(tiny_model, tmp_path):
    from conftest import launch_config

    proc = launch_config("fsdp2", "grpo", tiny_model, tmp_path, "--checkpoint-every", "1", "--num-iterations", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "fsdp2" / "checkpoints" / "iter_000001"
    assert list(folder.rglob(".metadata")) and pickled_code_problem(folder) is None
    marker = tmp_path / "ran"
    metadata = sorted(folder.rglob(".metadata"))[0]
    original = metadata.read_bytes()
    metadata.write_bytes(pickle.dumps(Payload(marker)))
    write_manifest(folder, 1)
    proc = launch_config("fsdp2", "grpo", tiny_model, tmp_path, "--resume", "--num-iterations", "2")
    assert not marker.exists(), "the sharded checkpoint's pickle ran in the trainer"
    assert proc.returncode != 0 and f"{metadata} holds more than plain data" in proc.stderr
    metadata.write_bytes(original)
    write_manifest(folder, 1)
    proc = launch_config("fsdp2", "grpo", tiny_model, tmp_path, "--resume", "--num-iterations", "2")
    assert proc.returncode == 0 and "resumed from" in proc.stdout + proc.stderr, proc.stderr[-3000:]


# --- 2. writes stay inside the folder -----------------------------------------------------------------------------
def test_a_planted_temporary_name_is_never_followed(tmp_path, outside):
    target = outside / "precious.txt"
    link(tmp_path / ".args.json.partial", target)  # the old predictable temporary of args.json
    atomic_write_text(tmp_path / "args.json", "{}")
    assert untouched(outside) and (tmp_path / "args.json").read_text() == "{}"


@pytest.mark.parametrize("name", ["args.json", "summary.json"])
def test_the_loggers_files_replace_a_link_instead_of_following_it(tmp_path, outside, name):
    run = tmp_path / "r"
    link(run / name, outside / "precious.txt")
    link(run / f".{name}.partial", outside / "precious.txt")  # the old predictable temporary
    logger = MetricsLogger(run, 1, config={"lr": 1.0})
    logger.close(summary={"done": True})
    assert untouched(outside) and not (run / name).is_symlink() and json.loads((run / name).read_text())


def test_metrics_are_never_appended_through_a_link(tmp_path, outside):
    run = tmp_path / "r"
    logger = MetricsLogger(run, 1)
    (run / "metrics.jsonl").unlink(missing_ok=True)
    link(run / "metrics.jsonl", outside / "precious.txt")
    with pytest.raises(OSError):
        logger.log(1, {"x": 1.0})
    logger.close()
    assert untouched(outside)


def test_the_checkpoint_pointer_is_written_in_the_folder(prepared, tmp_path, outside):
    accelerator, _, _ = prepared
    link(tmp_path / "r" / "checkpoints" / ".latest.json.partial", outside / "precious.txt")
    link(tmp_path / "r" / "checkpoints" / "latest.json", outside / "precious.txt")
    save_checkpoint(accelerator, tmp_path / "r", 1)
    pointer = tmp_path / "r" / "checkpoints" / "latest.json"
    assert untouched(outside) and not pointer.is_symlink() and json.loads(pointer.read_text())["iteration"] == 1


def test_episode_files_are_never_written_or_dropped_through_a_linked_folder(tmp_path, outside):
    run = tmp_path / "r"
    (outside / "train_000003.jsonl").write_text("theirs\n")
    link(run / "episodes", outside)
    with pytest.raises(LinkError, match="episodes is a symbolic link"):
        write_episodes(episode_file(run, "eval", 3), [{"schema": 1, "won": True}], inside=run)
    host = SimpleNamespace(accelerator=SimpleNamespace(is_main_process=True), run_dir=run)
    with pytest.raises(LinkError, match="episodes is a symbolic link"):
        Run._drop_episodes_from(host, 3)
    assert (outside / "train_000003.jsonl").read_text() == "theirs\n"
    assert sorted(p.name for p in outside.iterdir()) == ["precious.txt", "train_000003.jsonl"]


def test_a_linked_episode_file_is_dropped_itself(tmp_path, outside):
    run = tmp_path / "r"
    (run / "episodes").mkdir(parents=True)
    link(run / "episodes" / "eval_000004.jsonl", outside / "precious.txt")
    Run._drop_episodes_from(SimpleNamespace(accelerator=SimpleNamespace(is_main_process=True), run_dir=run), 3)
    assert list((run / "episodes").iterdir()) == [] and untouched(outside)


@pytest.mark.parametrize("name", ["episodes", "final", "checkpoints", "metrics.jsonl", "args.json", "tb"])
def test_resume_refuses_a_run_folder_entry_that_is_a_link(tmp_path, outside, name):
    run = tmp_path / "r"
    run.mkdir()
    if name != "checkpoints":
        (run / "checkpoints").mkdir()
    if name != "args.json":
        (run / "args.json").write_text("{}")
    link(run / name, outside if "." not in name else outside / "precious.txt")
    problem = run_dir_problem(run, resume=True, overwrite=False)
    assert problem.startswith(f"error: {run / name} is a symbolic link") and "\n" not in problem
    assert untouched(outside)


def test_a_link_inside_the_checkpoints_is_refused_too(tmp_path, outside):
    run = tmp_path / "r"
    (run / "checkpoints").mkdir(parents=True)
    link(run / "checkpoints" / "iter_000003", outside)
    assert f"{run / 'checkpoints' / 'iter_000003'} is a symbolic link" in run_dir_problem(run, True, False)


def test_the_viewer_replaces_a_planted_page_link(tmp_path, outside):
    from eval.view import make_view

    run = tmp_path / "r"
    write_episodes(episode_file(run, "eval", 0), [viewer_record()])
    (run / "metrics.jsonl").write_text('{"iteration": 0, "eval/success_rate": 1.0}\n')
    link(run / "view.html", outside / "precious.txt")
    page = make_view(run)
    assert page == run / "view.html" and not page.is_symlink() and page.resolve() == page.resolve(strict=True)
    assert untouched(outside) and "<html" in page.read_text()


def viewer_record() -> dict:
    return {"schema": 1, "source": "eval", "iteration": 0, "env_id": "ARL/Sokoban-Mini-v0", "split": "test",
            "task_seed": 1, "group": 0, "sample": 0, "episode": 0, "return": 1.0, "episode_return": 1.0, "length": 1,
            "won": True, "stop": "won",
            "turns": [{"turn": 0, "seen": [{"role": "user", "content": "go"}], "response": "<action>up</action>",
                       "action": "up", "format_ok": True, "action_valid": True, "reward": 1.0,
                       "format_penalty": 0.0, "stop": "eos", "advantage": None}]}


def test_the_report_replaces_planted_links_in_its_folder(tmp_path, outside):
    from test_eval_report import make_runs

    from eval.report import Args, main

    out = tmp_path / "report"
    for name in ("table.md", "report.html", "stability.json"):
        link(out / name, outside / "precious.txt")
    link(out / ".report.md.partial", outside / "precious.txt")
    assert main(Args([make_runs(tmp_path / "runs")], out=out)) == 0
    assert untouched(outside) and not any((out / name).is_symlink() for name in ("table.md", "report.html",
                                                                                "stability.json", "report.md"))


def test_the_collapse_plot_replaces_a_planted_link(tmp_path, outside):
    from test_collapse_plot import EVALS, write_run

    from eval.collapse_plot import Args, main

    write_run(tmp_path / "runs", "SAPO", 1, EVALS[("SAPO", 1)], kl_jump=False, alarm_at=None)
    out = tmp_path / "plot.png"
    link(out, outside / "precious.txt")
    assert main(Args(runs=[tmp_path / "runs"], out=out)) == 0
    assert untouched(outside) and not out.is_symlink() and out.read_bytes()[:4] == b"\x89PNG"


# --- 3. the env servers are the command line's --------------------------------------------------------------------
def recorded_run(tmp_path: Path, **values) -> Path:
    run = tmp_path / "runs" / "r"
    (run / "checkpoints").mkdir(parents=True)
    record = {"exp_name": "grpo", "env_id": "ARL/Sokoban-Mini-v0", "num_iterations": 4, **values}
    (run / "args.json").write_text(json.dumps(record))
    return run


def test_resume_never_plays_on_the_recorded_env_servers(tmp_path):
    from conftest import load_script

    from arena_train.cli import parse_args

    recorded_run(tmp_path, env_servers=["http://203.0.113.9:8000"])
    cls = load_script("grpo").Args
    argv = ["--output-dir", str(tmp_path / "runs"), "--run-name", "r", "--resume"]
    with pytest.raises(SystemExit) as exc:
        parse_args(cls, {}, argv)
    message = str(exc.value)
    assert "http://203.0.113.9:8000" in message and "--env-servers" in message and "\n" not in message
    assert parse_args(cls, {}, [*argv, "--env-servers"]).engine.env_servers == ()  # the flag alone: local envs
    mine = parse_args(cls, {}, [*argv, "--env-servers", "http://127.0.0.1:9"]).engine.env_servers
    assert mine == ("http://127.0.0.1:9",)


def test_a_run_says_which_env_servers_it_plays_on_before_opening_one(monkeypatch, capsys):
    import arena_train.run as run_module

    def refuse(*args, **kwargs):
        raise RuntimeError("no session opened in this test")

    monkeypatch.setattr(run_module, "MixtureRollout", refuse)
    host = SimpleNamespace(engine=SimpleNamespace(env_servers=("http://203.0.113.9:8000",), env_workers=0,
                                                  env_step_timeout=1.0, overlap_turns=False),
                           accelerator=SimpleNamespace(print=print), mixture=None, world=1,
                           eval=SimpleNamespace(eval_episodes=2, eval_split=None))
    with pytest.raises(RuntimeError, match="no session"):
        Run.rollouts(host, None, 2, 2, None, None)
    assert "env servers: the training episodes play on http://203.0.113.9:8000" in capsys.readouterr().out


# --- 4. one live run per folder -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def accelerator():
    from accelerate import Accelerator

    return Accelerator(cpu=True)


def test_a_second_start_or_resume_of_a_live_run_is_refused(accelerator, tmp_path):
    run = tmp_path / "r"
    lock = prepare_run_dir(accelerator, run, resume=False, overwrite=False)
    (run / "checkpoints").mkdir()
    for resume, overwrite in ((True, False), (False, True), (False, False)):
        with pytest.raises(SystemExit, match="is in use by a live run") as exc:
            prepare_run_dir(accelerator, run, resume=resume, overwrite=overwrite)
        assert "\n" not in str(exc.value) and str(os.getpid()) in str(exc.value)
    assert (run / "checkpoints").is_dir()  # the refused --overwrite deleted nothing
    os.close(lock)
    os.close(prepare_run_dir(accelerator, run, resume=True, overwrite=False))


def test_a_crashed_run_leaves_no_lock_behind(accelerator, tmp_path):
    run = tmp_path / "r"
    code = ("import os, sys; from arena_train.run import lock_run; from pathlib import Path; "
            "fd, problem = lock_run(Path(sys.argv[1])); assert problem is None; os._exit(9)")
    assert subprocess.run([sys.executable, "-c", code, str(run)], cwd=ROOT, timeout=60).returncode == 9
    assert (run / LOCK).is_file()
    os.close(prepare_run_dir(accelerator, run, resume=False, overwrite=False))


def test_a_failed_start_keeps_what_another_program_put_in_the_folder(tmp_path):
    run = tmp_path / "out" / "r"
    created = first_missing(run)
    (run / "checkpoints").mkdir(parents=True)
    (run / "args.json").write_text("{}")
    (run / "launcher.log").write_text("another program's file")
    discard_unstarted(SimpleNamespace(run_dir=run, logger=None), created)
    assert sorted(p.name for p in run.iterdir()) == ["launcher.log"]


# --- 5. the verdict counts every held-out episode ---------------------------------------------------------------
def held_out(iteration: int, episodes: int, turn_text: int) -> list[dict]:
    """``episodes`` failed 50-turn held-out records of ~``50 * turn_text`` bytes each (ALFWorld's are ~135 KB)."""
    return [{"schema": 1, "source": "eval", "iteration": iteration, "env_id": "ARL/ALFWorld-v0", "split": "test",
             "task_seed": 1_000_000_000 + k, "group": k, "sample": 0, "episode": k, "return": 0.0,
             "episode_return": 0.0, "length": 50, "won": (k + iteration) % 3 == 0, "stop": "max_turns",
             "turns": [{"turn": t, "seen": [{"role": "user", "content": "x" * turn_text}], "response": "y" * 100,
                        "action": "look", "format_ok": True, "action_valid": True, "reward": 0.0,
                        "format_penalty": 0.0, "stop": "eos", "advantage": None} for t in range(50)]}
            for k in range(episodes)]


def test_the_verdict_counts_all_128_held_out_episodes_of_the_gpu_recipe(tmp_path):
    run = tmp_path / "r"
    for iteration in (0, 10):
        write_episodes(episode_file(run, "eval", iteration), held_out(iteration, 128, 2600), inside=run)
        assert (run / "episodes" / f"eval_{iteration:06d}.jsonl").stat().st_size <= 4_000_000
        records = read_episodes(episode_file(run, "eval", iteration))
        assert len(records) == 128 and records[0].get("cut") is None and records[-1]["cut"] == "texts"
    verdict = run_verdict(run)
    assert verdict["gain"]["pairs"] == 128 and verdict["start"]["episodes"] == verdict["final"]["episodes"] == 128
    assert verdict["start"]["success"] == sum(r["won"] for r in held_out(0, 128, 0)) / 128
    line = verdict_line(verdict)
    assert "(iteration 0, 128 episodes)" in line and "(paired, 128 task seeds" in line


# --- end to end: algos/grpo.py --resume of a hostile folder -------------------------------------------------------
def grpo(out: Path, model: str, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    small = ["--num-groups", "2", "--group-size", "2", "--max-turns", "2", "--max-response-tokens", "4",
             "--mini-batch-size", "8", "--micro-batch-size", "8", "--eval-every", "0", "--checkpoint-every", "1",
             "--on-collapse", "stop"]
    return subprocess.run([sys.executable, str(ROOT / "algos" / "grpo.py"), "--model-path", model, "--output-dir",
                           str(out), "--run-name", "r", *small, *argv], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trained")
    proc = grpo(out, tiny_model, "--num-iterations", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_resume_of_a_folder_with_a_resigned_payload_runs_none_of_it(trained, tiny_model, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(trained, out, symlinks=True)
    marker = tmp_path / "ran"
    plant_payload(out / "r" / "checkpoints" / "iter_000001", marker)
    proc = grpo(out, tiny_model, "--resume", "--num-iterations", "2")
    assert not marker.exists(), "the checkpoint's pickle ran in the trainer"
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_resume_through_a_planted_link_is_refused_and_writes_nothing_outside(trained, tiny_model, tmp_path, outside):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(trained, out, symlinks=True)
    (outside / "train_000002.jsonl").write_text("theirs\n")
    shutil.rmtree(out / "r" / "episodes")
    link(out / "r" / "episodes", outside)
    proc = grpo(out, tiny_model, "--resume", "--num-iterations", "2")
    assert proc.returncode != 0 and f"{out / 'r' / 'episodes'} is a symbolic link" in proc.stderr
    assert sorted(p.name for p in outside.iterdir()) == ["precious.txt", "train_000002.jsonl"]
    assert (outside / "train_000002.jsonl").read_text() == "theirs\n"
