"""arena_train.run: the run folder (a new run never writes into an old run's files; --resume, --overwrite and
their errors) and the default CPU thread count."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from arena_train.memory import dry_run_exit_code
from arena_train.run import (
    LOCK,
    clear_run,
    default_threads,
    discard_unstarted,
    first_missing,
    prepare_run_dir,
    run_dir_problem,
)


@pytest.fixture(scope="module")
def accelerator():
    from accelerate import Accelerator

    return Accelerator(cpu=True)


def old_run(run_dir):
    """A finished run's files, plus a launcher's log that is not the run's."""
    (run_dir / "checkpoints" / "iter_000001").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"iteration": 1}\n')
    (run_dir / "stdout.log").write_text("launcher output\n")
    return run_dir


def test_a_new_folder_is_created(accelerator, tmp_path):
    prepare_run_dir(accelerator, tmp_path / "a" / "b", resume=False, overwrite=False)
    assert (tmp_path / "a" / "b").is_dir()


def test_an_existing_run_without_resume_is_an_error_and_stays_untouched(accelerator, tmp_path):
    run_dir = old_run(tmp_path / "r")
    with pytest.raises(SystemExit, match="already holds a run .*--resume.*--overwrite") as exc:
        prepare_run_dir(accelerator, run_dir, resume=False, overwrite=False)
    assert "\n" not in str(exc.value)
    assert (run_dir / "metrics.jsonl").read_text() == '{"iteration": 1}\n'


def test_other_files_do_not_make_a_run(tmp_path):
    (tmp_path / "stdout.log").write_text("x")
    assert run_dir_problem(tmp_path, resume=False, overwrite=False) is None


def test_overwrite_deletes_the_run_and_only_the_run(accelerator, tmp_path):
    run_dir = old_run(tmp_path / "r")
    os.close(prepare_run_dir(accelerator, run_dir, resume=False, overwrite=True))
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK, "stdout.log"]  # the lock is no file of the run
    clear_run(run_dir)  # nothing left to delete is fine
    assert run_dir_problem(run_dir, resume=False, overwrite=False) is None


def test_resume_of_an_existing_run_is_allowed(tmp_path):
    assert run_dir_problem(old_run(tmp_path / "r"), resume=True, overwrite=False) is None


def test_resume_and_overwrite_together_is_an_error(tmp_path):
    assert "give one of them" in run_dir_problem(tmp_path, resume=True, overwrite=True)


def test_resume_of_metrics_without_a_checkpoint_is_an_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"iteration": 1}\n')
    assert "no checkpoint to resume from" in run_dir_problem(tmp_path, resume=True, overwrite=False)


def test_an_unwritable_folder_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    problem = run_dir_problem(blocker / "run", resume=False, overwrite=False)
    assert problem.startswith(f"error: the output folder {blocker / 'run'} is not writable")
    assert "--output-dir" in problem


# ---- a start-up error leaves no run folder
def test_a_start_that_logged_nothing_leaves_no_folder_nor_the_folders_it_made(tmp_path):
    run_dir = tmp_path / "out" / "runs" / "r"
    created = first_missing(run_dir)
    assert created == tmp_path / "out" and first_missing(tmp_path) is None
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "args.json").write_text("{}")
    discard_unstarted(SimpleNamespace(run_dir=run_dir, logger=SimpleNamespace(logged=0)), created)
    assert list(tmp_path.iterdir()) == []


def test_only_the_run_and_the_empty_folders_its_start_made_go(tmp_path):
    run_dir = tmp_path / "out" / "runs" / "r"
    created = first_missing(run_dir)
    run_dir.mkdir(parents=True)
    (tmp_path / "out" / "sweep.log").write_text("another program's file")
    discard_unstarted(SimpleNamespace(run_dir=run_dir, logger=None), created)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["sweep.log"]


def test_a_run_that_logged_a_line_is_kept(tmp_path):
    run_dir = tmp_path / "r"
    created = first_missing(run_dir)
    run_dir.mkdir()
    discard_unstarted(SimpleNamespace(run_dir=run_dir, logger=SimpleNamespace(logged=1)), created)
    assert run_dir.is_dir()


# ---- --dry-run's exit status
@pytest.mark.parametrize(("launcher", "code", "expected"), [
    (None, 0, 0), (None, 1, 1), ("ACCELERATE_MIXED_PRECISION", 0, 0), ("ACCELERATE_MIXED_PRECISION", 1, 0),
    ("TORCHELASTIC_RUN_ID", 1, 0)])
def test_dry_run_does_not_fit_is_status_1_except_under_a_launcher(monkeypatch, capsys, launcher, code, expected):
    for name in ("ACCELERATE_MIXED_PRECISION", "TORCHELASTIC_RUN_ID", "RANK"):
        monkeypatch.delenv(name, raising=False)
    if launcher:
        monkeypatch.setenv(launcher, "x")
    assert dry_run_exit_code(code) == expected
    assert ("does not fit" in capsys.readouterr().out) == (launcher is not None and code == 1)


# ---- the default thread count
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def test_an_explicit_count_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert default_threads(5) == 5


def test_omp_num_threads_pins_the_default(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert default_threads(0) == 1


@pytest.mark.parametrize("omp", [None, "", "abc", "0"])
def test_otherwise_all_available_cores_split_between_local_processes(monkeypatch, omp):
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert default_threads(0) == CORES
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(CORES * 2))
    assert default_threads(0) == 1  # never 0
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "junk")
    assert default_threads(0) == CORES
