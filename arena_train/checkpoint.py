"""Checkpoints that are whole or absent: ``<run_dir>/checkpoints/iter_NNNNNN`` (Accelerate state: model, optimizer,
RNG states, plus ``manifest.json`` with every file's size and SHA-256) and ``latest.json``, the pointer.

A checkpoint is written under a temporary name, fsynced, given its manifest and only then renamed into place;
the pointer is replaced atomically after that, so a crash at any moment leaves the previous checkpoint and its
pointer intact. ``--resume`` verifies the manifest before loading: a damaged checkpoint is an error naming the
file, and the newest intact earlier checkpoint is used instead only when asked (``fallback``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

MANIFEST = "manifest.json"
POINTER = "latest.json"
_NAME = re.compile(r"^iter_(\d{6,})$")
_TMP_SUFFIX = ".partial"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (missing, truncated or altered file, unreadable pointer)."""


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` durable (POSIX needs the directory itself synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` so that a reader sees the old or the new content, never a mix."""
    tmp = path.with_name(f".{path.name}{_TMP_SUFFIX}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: Path, iteration: int) -> None:
    """fsync every file of ``folder`` and record its size and checksum (read back from disk) in the manifest."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        files[str(path.relative_to(folder))] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    atomic_write_text(folder / MANIFEST, json.dumps({"iteration": iteration, "files": files}, indent=1))


def verify_checkpoint(folder: Path) -> int:
    """The iteration of an intact checkpoint; ``CheckpointError`` naming the first missing or damaged file."""
    manifest_path = folder / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        iteration, files = int(manifest["iteration"]), manifest["files"]
    except FileNotFoundError:
        raise CheckpointError(f"{manifest_path} is missing: {folder} is incomplete") from None
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{manifest_path} is unreadable ({err})") from None
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path} is missing")
        size = path.stat().st_size
        if size != expected["size"]:
            raise CheckpointError(f"{path} is damaged: {size} bytes, the manifest says {expected['size']}")
        if _sha256(path) != expected["sha256"]:
            raise CheckpointError(f"{path} is damaged: its checksum differs from the manifest's")
    return iteration


def checkpoint_folders(run_dir: Path) -> list[tuple[int, Path]]:
    """(iteration, folder) of every renamed-into-place checkpoint of ``run_dir``, oldest first."""
    root = run_dir / "checkpoints"
    found = [(int(m.group(1)), p) for p in root.glob("iter_*") if p.is_dir() and (m := _NAME.match(p.name))]
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> tuple[Path, int] | None:
    """(folder, iteration) the pointer names, or None when the run has no checkpoint at all.

    ``CheckpointError`` when the pointer is unreadable, or missing while checkpoint folders exist.
    """
    pointer = run_dir / "checkpoints" / POINTER
    if not pointer.exists():
        if checkpoint_folders(run_dir):
            raise CheckpointError(f"{pointer} is missing but {run_dir / 'checkpoints'} holds checkpoints")
        return None
    try:
        info = json.loads(pointer.read_text())
        return run_dir / "checkpoints" / info["dir"], int(info["iteration"])
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{pointer} is unreadable ({err})") from None


def find_resume_checkpoint(run_dir: Path, fallback: bool = False) -> tuple[Path, int] | None:
    """The verified checkpoint to resume from (None: the run has none). Without ``fallback`` any damage is a
    ``CheckpointError``; with it, the newest checkpoint folder that verifies is taken."""
    try:
        found = latest_checkpoint(run_dir)
        if found is not None:
            verify_checkpoint(found[0])
        return found
    except CheckpointError as err:
        if not fallback:
            raise CheckpointError(f"{err}. Pass --resume-fallback to resume from the newest intact earlier "
                                  f"checkpoint, or --overwrite to start the run over") from None
        damage = str(err)
    found = newest_verified_checkpoint(run_dir)
    if found is None:
        raise CheckpointError(f"{damage}, and no earlier checkpoint of {run_dir} is intact")
    print(f"warning: {damage}; falling back to {found[0]}", flush=True)
    return found


def newest_verified_checkpoint(run_dir: Path, at_most: int | None = None) -> tuple[Path, int] | None:
    """(folder, iteration) of the newest checkpoint folder of ``run_dir`` that verifies, among those of iteration
    ``at_most`` or earlier when given (a collapse alarm's last healthy one); None when there is none. The
    pointer is not consulted: damaged or newer folders are passed over."""
    for iteration, folder in reversed(checkpoint_folders(run_dir)):
        if at_most is not None and iteration > at_most:
            continue
        try:
            verify_checkpoint(folder)
        except CheckpointError:
            continue
        return folder, iteration
    return None


def latest_checkpoint_iteration(run_dir: Path) -> int | None:
    """The iteration the pointer names, if it can be read."""
    try:
        found = latest_checkpoint(run_dir)
    except CheckpointError:
        return None
    return None if found is None else found[1]


def _rotate(ckpt_root: Path, current: int, keep: int) -> None:
    """Delete leftovers of interrupted writes and all but the ``keep - 1`` newest checkpoints older than
    ``current``; the one just written (and anything newer, left by a fallback) is never touched."""
    for partial in ckpt_root.glob(f"*{_TMP_SUFFIX}"):
        shutil.rmtree(partial, ignore_errors=True)
    older = [folder for iteration, folder in checkpoint_folders(ckpt_root.parent) if iteration < current]
    for folder in older[:max(len(older) - (keep - 1), 0)]:
        shutil.rmtree(folder, ignore_errors=True)


def save_checkpoint(accelerator, run_dir: Path, iteration: int, keep: int = 2) -> None:
    """Write checkpoint ``iteration`` whole or not at all, then point ``latest.json`` at it; the newest
    ``keep`` checkpoints stay.

    A failed write on any process (disk full, quota, I/O error) is reported once, by the main process, as a
    ``SystemExit`` naming the error and the previous checkpoint, which stays intact; the other processes exit
    quietly.
    """
    from arena_train.dist import global_sum

    ckpt_root = run_dir / "checkpoints"
    name = f"iter_{iteration:06d}"
    tmp, final = ckpt_root / f"{name}{_TMP_SUFFIX}", ckpt_root / name
    error = None
    try:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
    except OSError as err:
        error = err
    accelerator.wait_for_everyone()
    if error is None:
        try:
            accelerator.save_state(str(tmp))
        except Exception as err:  # noqa: BLE001 - torch/safetensors report a full disk as RuntimeError
            error = err
    failed = global_sum(accelerator, float(error is not None))
    if not failed and accelerator.is_main_process:
        try:
            write_manifest(tmp, iteration)
            if final.exists():  # a damaged checkpoint of this iteration, skipped by --resume-fallback
                shutil.rmtree(final)
            os.replace(tmp, final)
            fsync_dir(ckpt_root)
            atomic_write_text(ckpt_root / POINTER, json.dumps({"dir": name, "iteration": iteration}))
            _rotate(ckpt_root, iteration, keep)
        except Exception as err:  # noqa: BLE001 - reported below, once
            error = err
    failed = global_sum(accelerator, float(error is not None))
    if failed:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            previous = latest_checkpoint_iteration(run_dir)
            kept = f"the previous checkpoint (iteration {previous}) is intact" if previous else "none was kept"
            detail = f"{type(error).__name__}: {error}" if error is not None else "a failed write on another process"
            raise SystemExit(f"error: checkpoint {final} could not be written ({detail}); {kept}")
        raise SystemExit(1)


def resume_latest(accelerator, run_dir: Path, fallback: bool = False) -> int:
    """Load the newest verified checkpoint of ``run_dir`` into the prepared objects; -> its iteration (0 if the
    run has none). The main process verifies; a damaged checkpoint is one ``SystemExit`` naming the file."""
    from accelerate.utils import broadcast_object_list

    found: list = [None]
    if accelerator.is_main_process:
        try:
            found[0] = find_resume_checkpoint(run_dir, fallback)
        except CheckpointError as err:
            found[0] = f"error: cannot resume: {err}"
    if accelerator.num_processes > 1:
        broadcast_object_list(found)
    if isinstance(found[0], str):
        raise SystemExit(found[0] if accelerator.is_main_process else 1)
    if found[0] is None:
        return 0
    folder, iteration = found[0]
    accelerator.load_state(str(folder))
    accelerator.print(f"resumed from {folder} (iteration {iteration})")
    return iteration
