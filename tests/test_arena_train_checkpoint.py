"""arena_train.checkpoint: save, keep the newest two, find the latest, resume into prepared objects; and every
fault a run's files can suffer (truncated or altered file, lost or garbled pointer, a crash mid-write, a full
disk), injected for real."""

from __future__ import annotations

import json
import resource
import signal
import textwrap

import pytest
import torch
from conftest import needs_accelerate, run_two_processes

from arena_train.checkpoint import (
    MANIFEST,
    CheckpointError,
    find_resume_checkpoint,
    latest_checkpoint,
    resume_latest,
    save_checkpoint,
    verify_checkpoint,
)
from arena_train.models import load_model_and_tokenizer


@pytest.fixture
def prepared(tiny_model):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model, _ = load_model_and_tokenizer(tiny_model, torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def step(model, optimizer) -> None:
    loss = model(input_ids=torch.tensor([[3, 4, 5, 6]])).logits.square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_no_checkpoint_means_start_from_scratch(prepared, tmp_path):
    accelerator, _, _ = prepared
    assert latest_checkpoint(tmp_path) is None
    assert resume_latest(accelerator, tmp_path) == 0


def test_latest_checkpoint_is_the_newest_and_two_are_kept(prepared, tmp_path):
    accelerator, model, optimizer = prepared
    saved = {}
    for iteration in (1, 2, 3):
        step(model, optimizer)
        save_checkpoint(accelerator, tmp_path, iteration)
        saved[iteration] = snapshot(model)
    folder, iteration = latest_checkpoint(tmp_path)
    assert iteration == 3 and folder.name == "iter_000003"
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("iter_*")) == ["iter_000002", "iter_000003"]
    step(model, optimizer)  # move on, then come back
    assert any(not torch.equal(v, saved[3][k]) for k, v in model.state_dict().items())
    assert resume_latest(accelerator, tmp_path) == 3
    assert all(torch.equal(v, saved[3][k]) for k, v in model.state_dict().items())


def test_resumed_optimizer_continues_exactly(prepared, tmp_path):
    accelerator, model, optimizer = prepared
    step(model, optimizer)
    save_checkpoint(accelerator, tmp_path, 1)
    step(model, optimizer)
    expected = snapshot(model)
    resume_latest(accelerator, tmp_path)
    step(model, optimizer)  # AdamW moments restored: the same second step
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())


def saved_run(prepared, run_dir, iterations=(1, 2)):
    """Checkpoints at ``iterations`` -> the weights at each."""
    accelerator, model, optimizer = prepared
    weights = {}
    for iteration in iterations:
        step(model, optimizer)
        save_checkpoint(accelerator, run_dir, iteration)
        weights[iteration] = snapshot(model)
    step(model, optimizer)  # the live weights move on
    return weights


def same(model, weights) -> bool:
    return all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_manifest_lists_every_file_and_verifies(prepared, tmp_path):
    saved_run(prepared, tmp_path, (1,))
    folder = tmp_path / "checkpoints" / "iter_000001"
    files = json.loads((folder / MANIFEST).read_text())["files"]
    assert set(files) == {p.name for p in folder.iterdir() if p.name != MANIFEST}
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl"} <= set(files)
    assert verify_checkpoint(folder) == 1
    assert not list((tmp_path / "checkpoints").glob("*.partial")), "no temporary left behind"


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_damaged_file_is_an_error_naming_it(prepared, tmp_path, damage):
    accelerator, _, _ = prepared
    saved_run(prepared, tmp_path)
    rng = tmp_path / "checkpoints" / "iter_000002" / "random_states_0.pkl"
    data = rng.read_bytes()
    if damage == "truncate":
        rng.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        rng.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    else:
        rng.unlink()
    with pytest.raises(SystemExit, match=r"random_states_0\.pkl.*--resume-fallback") as exc:
        resume_latest(accelerator, tmp_path)
    assert str(exc.value).count("\n") == 0, "one line"


def test_fallback_resumes_the_newest_intact_checkpoint_only_when_asked(prepared, tmp_path):
    accelerator, model, _ = prepared
    weights = saved_run(prepared, tmp_path)
    (tmp_path / "checkpoints" / "iter_000002" / "model.safetensors").write_bytes(b"\0" * 100)
    with pytest.raises(SystemExit, match="model.safetensors"):
        resume_latest(accelerator, tmp_path)
    assert resume_latest(accelerator, tmp_path, fallback=True) == 1
    assert same(model, weights[1])


def test_deleted_pointer_is_an_error_not_a_fresh_start(prepared, tmp_path):
    accelerator, model, _ = prepared
    weights = saved_run(prepared, tmp_path)
    (tmp_path / "checkpoints" / "latest.json").unlink()
    with pytest.raises(SystemExit, match="latest.json is missing"):
        resume_latest(accelerator, tmp_path)
    assert resume_latest(accelerator, tmp_path, fallback=True) == 2
    assert same(model, weights[2])


def test_garbled_pointer_is_an_error(prepared, tmp_path):
    saved_run(prepared, tmp_path, (1,))
    (tmp_path / "checkpoints" / "latest.json").write_text('{"dir": "iter_0')
    with pytest.raises(CheckpointError, match="latest.json is unreadable"):
        find_resume_checkpoint(tmp_path)
    assert find_resume_checkpoint(tmp_path, fallback=True)[1] == 1


def test_no_intact_checkpoint_even_with_fallback(prepared, tmp_path):
    saved_run(prepared, tmp_path, (1,))
    (tmp_path / "checkpoints" / "iter_000001" / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="no earlier checkpoint .* is intact"):
        find_resume_checkpoint(tmp_path, fallback=True)


def test_crash_mid_write_leaves_the_previous_checkpoint_in_charge(prepared, tmp_path):
    """A killed save leaves only a ``.partial`` folder: resume ignores it and the next save removes it."""
    accelerator, model, _ = prepared
    weights = saved_run(prepared, tmp_path, (1,))
    partial = tmp_path / "checkpoints" / "iter_000002.partial"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    assert latest_checkpoint(tmp_path)[1] == 1
    assert resume_latest(accelerator, tmp_path) == 1 and same(model, weights[1])
    save_checkpoint(accelerator, tmp_path, 2)
    assert not partial.exists()
    assert verify_checkpoint(tmp_path / "checkpoints" / "iter_000002") == 2


def test_rotation_never_deletes_the_checkpoint_just_written(prepared, tmp_path):
    """Older runs' higher iterations sort last; the new checkpoint must survive them (and the pointer name it)."""
    accelerator, _, _ = prepared
    saved_run(prepared, tmp_path, (30,))
    for iteration in (1, 2, 3):
        save_checkpoint(accelerator, tmp_path, iteration)
        assert (tmp_path / "checkpoints" / f"iter_{iteration:06d}").is_dir()
        assert latest_checkpoint(tmp_path)[1] == iteration
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("iter_*"))
    assert names == ["iter_000002", "iter_000003", "iter_000030"]


def test_failed_write_is_one_message_and_keeps_the_previous_checkpoint(prepared, tmp_path):
    """A real write failure: the file-size limit makes the weights file fail as a full disk would."""
    accelerator, model, optimizer = prepared
    weights = saved_run(prepared, tmp_path, (1,))
    before = (tmp_path / "checkpoints" / "latest.json").read_text()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write with EFBIG instead of a signal
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
        with pytest.raises(SystemExit) as exc:
            save_checkpoint(accelerator, tmp_path, 2)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    message = str(exc.value)
    assert "iter_000002" in message and "previous checkpoint (iteration 1) is intact" in message
    assert message.count("\n") == 0
    assert (tmp_path / "checkpoints" / "latest.json").read_text() == before
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["iter_000001", "latest.json"]
    assert resume_latest(accelerator, tmp_path) == 1 and same(model, weights[1])


TWO_PROCESS_FAILED_WRITE = textwrap.dedent("""
    import resource, signal, sys
    from pathlib import Path
    import torch
    from accelerate import Accelerator
    from arena_train.checkpoint import save_checkpoint

    acc = Accelerator(cpu=True)
    model, optimizer = acc.prepare(torch.nn.Linear(64, 64), torch.optim.AdamW(torch.nn.Linear(1, 1).parameters()))
    run_dir = Path(sys.argv[1])
    save_checkpoint(acc, run_dir, 1)
    if acc.process_index == 1:  # only the other process's RNG-state file fails to be written
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        save_checkpoint(acc, run_dir, 2)
    finally:
        acc.end_training()
""")


@pytest.mark.slow
@needs_accelerate
def test_two_process_failed_write_is_reported_once_by_the_main_process(tmp_path):
    proc = run_two_processes(TWO_PROCESS_FAILED_WRITE, tmp_path, str(tmp_path / "run"))
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert output.count("could not be written") == 1, output[-4000:]
    assert "a failed write on another process" in output and "previous checkpoint (iteration 1) is intact" in output
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["iter_000001", "latest.json"]
    assert verify_checkpoint(tmp_path / "run" / "checkpoints" / "iter_000001") == 1


def test_the_tied_output_layer_saves_without_a_warning(tiny_model, tmp_path, caplog):
    """Accelerate reports the tied lm_head.weight at every save ("This should be OK, but check ..."); the scripts'
    accelerator drops that line, and only that one (the resumed weights are checked equal above)."""
    import logging

    from arena_train.sharding import TiedOutputNote, make_accelerator

    accelerator = make_accelerator("no")
    model, _ = load_model_and_tokenizer(tiny_model, torch.float32)
    assert model.config.tie_word_embeddings
    model = accelerator.prepare(model)
    with caplog.at_level(logging.WARNING):
        save_checkpoint(accelerator, tmp_path, 1)
    assert (tmp_path / "checkpoints" / "iter_000001").is_dir() and "Removed shared tensor" not in caplog.text

    def record(names: str) -> logging.LogRecord:
        return logging.LogRecord("accelerate.utils.other", logging.WARNING, "", 0,
                                 f"[RANK 0] Removed shared tensor {names} while saving. This should be OK", (), None)

    note = TiedOutputNote()
    assert not note.filter(record("{'lm_head.weight'}")) and not note.filter(record("{'module.lm_head.weight'}"))
    assert note.filter(record("{'model.layers.0.mlp.up_proj.weight'}"))
    assert note.filter(record("{'lm_head.weight', 'model.norm.weight'}"))
