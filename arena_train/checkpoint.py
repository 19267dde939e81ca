"""Checkpoints that are whole or absent: ``<run_dir>/checkpoints/iter_NNNNNN`` (Accelerate state: model, optimizer,
RNG states, plus ``manifest.json`` with every file's size and SHA-256) and ``latest.json``, the pointer.

A checkpoint is written under a temporary name, fsynced, given its manifest and only then renamed into place;
the pointer is replaced atomically after that, so a crash at any moment leaves the previous checkpoint and its
pointer intact. ``--resume`` verifies the manifest before loading: a damaged checkpoint is an error naming the
file, and the newest intact earlier checkpoint is used instead only when asked (``fallback``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from arena_train.safe_files import TMP_SUFFIX as _TMP_SUFFIX
from arena_train.safe_files import atomic_write_text, fsync_dir

MANIFEST = "manifest.json"
POINTER = "latest.json"
_NAME = re.compile(r"^iter_(\d{6,})$")
#: The files in which Accelerate pickles registered objects (``register_for_checkpointing``) and loads them with
#: ``torch.load(weights_only=False)``: code, if their writer wanted. Checkpoints of runs before the JSON states hold
#: the alarm's state there; it is read as plain data only (``_legacy_state``), never handed to Accelerate.
_CUSTOM = re.compile(r"^custom_checkpoint_(\d+)\.pkl$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (missing, truncated or altered file, unreadable pointer)."""


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
        name, iteration = str(info["dir"]), int(info["iteration"])
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{pointer} is unreadable ({err})") from None
    if not _NAME.match(name):  # "../elsewhere" would load a checkpoint from outside the run
        raise CheckpointError(f"{pointer} names {name!r}, not a checkpoint folder (iter_NNNNNN) of the run")
    return run_dir / "checkpoints" / name, iteration


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


def save_checkpoint(accelerator, run_dir: Path, iteration: int, keep: int = 2,
                    states: Mapping[str, Any] | None = None) -> None:
    """Write checkpoint ``iteration`` whole or not at all, then point ``latest.json`` at it; the newest
    ``keep`` checkpoints stay. ``states`` (name -> an object with ``state_dict``/``load_state_dict`` of plain JSON
    data, the collapse alarm's) are written as ``<name>.json`` beside the tensors, by the main process: JSON
    carries no code, where Accelerate's ``register_for_checkpointing`` pickles.

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
            if accelerator.is_main_process:
                for state_name, obj in (states or {}).items():
                    atomic_write_text(tmp / f"{state_name}.json", json.dumps(obj.state_dict()))
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


@contextmanager
def _without_pickled_objects(folder: Path) -> Iterator[Path]:
    """``folder`` as Accelerate may load it: itself, or (a checkpoint of a run before the JSON states) a temporary
    folder of links to every entry but the ``custom_checkpoint_*.pkl`` files, which Accelerate would unpickle with
    ``weights_only=False``. Its other files are loaded with ``weights_only=True`` or from safetensors."""
    entries = sorted(os.listdir(folder))
    if not any(_CUSTOM.match(name) for name in entries):
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix="arlarena-load-") as view:
        for name in entries:
            if not _CUSTOM.match(name):
                os.symlink(folder.resolve() / name, Path(view) / name)
        yield Path(view)


def _legacy_state(folder: Path, index: int) -> Any:
    """The plain data of ``custom_checkpoint_<index>.pkl`` (a run before the JSON states), read with
    ``weights_only=True``: a file that holds anything else (code) is a ``CheckpointError`` naming it."""
    import torch

    path = folder / f"custom_checkpoint_{index}.pkl"
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError) as err:
        raise CheckpointError(f"{path} holds more than plain data ({_first_line(err)}); it is not loaded") from None


def _first_line(err: BaseException) -> str:
    """The first sentence of ``err``'s message (torch's weights-only refusals run to a page), or its type's name."""
    text = str(err).strip()
    return text.splitlines()[0].split(". ")[0] if text else type(err).__name__


#: The globals a ``torch.distributed.checkpoint`` ``.metadata`` pickle (FSDP2's sharded checkpoints) may name: its
#: own dataclasses and enums, and ``torch.Size``; torch's dtypes, layouts and memory formats are allowed by type.
_DCP_CLASSES = {
    "torch.distributed.checkpoint.metadata": {"ChunkStorageMetadata", "_MEM_FORMAT_ENCODING", "TensorProperties",
                                              "TensorStorageMetadata", "BytesStorageMetadata", "StorageMeta",
                                              "Metadata", "MetadataIndex"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # how a layout is pickled (torch's weights-only unpickler allows it)
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath"},  # the checkpoint id torch records
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles a ``.metadata`` file naming only ``_DCP_CLASSES`` and torch's dtypes, layouts and memory formats:
    torch's reader uses plain ``pickle.load``, which would call whatever else the file names."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        found = getattr(torch, name, None) if module == "torch" else None
        if name in _DCP_CLASSES.get(module, ()) or isinstance(found, (torch.dtype, torch.layout, torch.memory_format)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}")


def _sharded_problem(metadata_path: Path) -> str | None:
    """Why the ``torch.distributed.checkpoint`` folder of ``metadata_path`` holds more than plain data (its
    ``.metadata``, or a non-tensor entry that torch's reader loads with ``weights_only=False``), or None."""
    import torch
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    try:
        with open(metadata_path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except (pickle.UnpicklingError, AttributeError, EOFError, TypeError, ValueError) as err:
        return f"{metadata_path} holds more than plain data ({_first_line(err)})"
    data = getattr(metadata, "storage_data", None) or {}
    for index, info in data.items():
        if not isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            continue
        path = metadata_path.parent / info.relative_path
        if info.transform_descriptors or path.parent != metadata_path.parent:
            return f"{metadata_path} names an entry {index.fqn!r} this project does not read ({info.relative_path})"
        with open(path, "rb") as f:
            f.seek(info.offset)
            entry = io.BytesIO(f.read(info.length))
        try:
            torch.load(entry, weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
            return f"{path} holds more than plain data in entry {index.fqn!r} ({_first_line(err)})"
    return None


def _rng_problem(path: Path) -> str | None:
    """Why Accelerate's RNG file ``path`` holds more than plain data, or None. Accelerate loads it with
    ``weights_only=True`` but skips a file it cannot load with a log line only: the run would go on with other
    random streams, no longer the straight run's."""
    from accelerate.utils import load

    try:
        load(path)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
        return f"{path} holds more than plain data ({_first_line(err)})"
    return None


def pickled_code_problem(folder: Path) -> str | None:
    """Why checkpoint ``folder`` cannot be loaded without running code (or is skipped in part), or None:
    Accelerate's own files are loaded with ``weights_only=True`` (and its ``custom_checkpoint_*.pkl`` never,
    ``_without_pickled_objects``), an RNG file it cannot load is skipped quietly, and FSDP2's sharded folders are
    read by ``torch.distributed.checkpoint`` with plain pickle: these are checked here first."""
    for path in sorted(folder.glob("random_states_*.pkl")):
        problem = _rng_problem(path)
        if problem is not None:
            return problem
    for metadata_path in sorted(folder.rglob(".metadata")):
        problem = _sharded_problem(metadata_path)
        if problem is not None:
            return problem
    return None


def load_states(folder: Path, states: Mapping[str, Any]) -> None:
    """Restore ``states`` (``save_checkpoint``'s) from ``folder``: ``<name>.json``, or in a checkpoint of a run
    before the JSON states the ``index``-th ``custom_checkpoint_<index>.pkl`` as plain data."""
    for index, (name, obj) in enumerate(states.items()):
        path = folder / f"{name}.json"
        obj.load_state_dict(json.loads(path.read_text()) if path.is_file() else _legacy_state(folder, index))


def resume_latest(accelerator, run_dir: Path, fallback: bool = False, states: Mapping[str, Any] | None = None) -> int:
    """Load the newest verified checkpoint of ``run_dir`` into the prepared objects and ``states`` (as
    ``save_checkpoint`` wrote them); -> its iteration (0 if the run has none). The main process verifies; a damaged
    checkpoint, or one whose states hold more than plain data, is one ``SystemExit`` naming the file."""
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
    try:
        load_checkpoint(accelerator, folder, states)
    except CheckpointError as err:  # every process finds it: the main one says it
        raise SystemExit(f"error: cannot resume: {err}" if accelerator.is_main_process else 1) from None
    accelerator.print(f"resumed from {folder} (iteration {iteration})")
    return iteration


def load_checkpoint(accelerator, folder: Path, states: Mapping[str, Any] | None = None) -> None:
    """Load checkpoint ``folder`` into the prepared objects and ``states``, never unpickling code
    (``_without_pickled_objects``, ``load_states``); ``CheckpointError`` names a file that holds some."""
    problem = pickled_code_problem(folder)
    if problem is not None:
        raise CheckpointError(f"{problem}; it is not loaded")
    if states:
        load_states(folder, states)  # first: a refused file leaves the prepared objects as they were
    with _without_pickled_objects(folder) as loadable:
        try:
            accelerator.load_state(str(loadable))
        except pickle.UnpicklingError as err:  # torch.load(weights_only=True) met a global it does not allow
            raise CheckpointError(f"a file of {folder} holds more than plain data ({_first_line(err)}); it is not "
                                  f"loaded") from None
