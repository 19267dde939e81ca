"""Writing into a folder without following what a stranger planted there.

A run folder (or a report folder) may come from someone else: an entry that is a symbolic link, or a predictable
temporary name made a link beforehand, would send a plain ``open`` to any file its owner chose. Every write here
walks from ``inside`` to the file's folder one component at a time with ``O_NOFOLLOW`` (a linked folder on the way
is an error naming it), writes a temporary opened ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a random name, and
renames it over the file: a link there is replaced, never followed. So the bytes land at the path named, and a
reader sees the old or the new content, never a mix.
"""

from __future__ import annotations

import io
import os
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

#: How a temporary's name ends (``.<name>.<random>.partial``); leftovers of a crash are recognised by it.
TMP_SUFFIX = ".partial"
_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class LinkError(OSError):
    """A folder on the way to a write is a symbolic link (or not a folder): the write would leave its folder."""


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` durable (POSIX needs the directory itself synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def open_folder(folder: Path, inside: Path | None = None, create: bool = True) -> Iterator[int]:
    """A descriptor of ``folder`` reached from ``inside`` (default: ``folder`` itself, taken as given) without
    following a link; missing folders on the way are made when ``create``. ``LinkError`` names a linked one."""
    inside = folder if inside is None else inside
    parts = folder.relative_to(inside).parts
    if create:
        inside.mkdir(parents=True, exist_ok=True)
    fd = os.open(inside, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for k, part in enumerate(parts):
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                child = os.open(part, _NOFOLLOW_DIR, dir_fd=fd)
            except OSError as err:
                where = inside.joinpath(*parts[:k + 1])
                if os.path.islink(where):
                    raise LinkError(f"{where} is a symbolic link (to {os.readlink(where)}); nothing is written "
                                    f"through it: remove it") from None
                raise LinkError(f"{where} is not a folder ({err.strerror})") from None
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, inside: Path | None = None) -> Path:
    """Replace ``path`` by ``data`` atomically, inside ``inside`` (default: ``path``'s folder) -> ``path``.

    The folders from ``inside`` down are made if missing and never followed if linked; a link at ``path`` itself
    is replaced by the file."""
    with open_folder(path.parent, inside) as folder:
        tmp = f".{path.name}.{secrets.token_hex(8)}{TMP_SUFFIX}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            os.unlink(tmp, dir_fd=folder)
            raise
        os.fsync(folder)
    return path


def atomic_write_text(path: Path, text: str, inside: Path | None = None) -> Path:
    """``atomic_write_bytes`` of ``text`` in UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"), inside)


def save_figure(fig, path: Path, **savefig_kwargs) -> Path:
    """``fig.savefig`` into ``path`` by ``atomic_write_bytes`` (matplotlib's own ``savefig(path)`` follows a link
    there); the format is the suffix's."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix.lstrip("."), **savefig_kwargs)
    return atomic_write_bytes(path, buffer.getvalue())


def append_line(path: Path, line: bytes) -> None:
    """Append ``line`` to ``path`` in a single ``write`` and fsync it (a crash tears the last line at most); a link
    at ``path`` is an error, not followed."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        written = os.write(fd, line)
        if written != len(line):
            raise OSError(f"short write to {path} ({written} of {len(line)} bytes)")
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_entries(folder: Path, names: Iterable[str], inside: Path | None = None) -> None:
    """Delete the entries ``names`` of ``folder`` (a link is removed itself, its target stays); ``folder`` is
    reached as ``open_folder`` does, and a missing one has nothing to delete."""
    if not os.path.lexists(folder):
        return
    with open_folder(folder, inside, create=False) as fd:
        for name in names:
            os.unlink(name, dir_fd=fd)


def list_entries(folder: Path, inside: Path | None = None) -> list[str]:
    """The entry names of ``folder`` (reached as ``open_folder`` does; none when it is missing), sorted."""
    if not os.path.lexists(folder):
        return []
    with open_folder(folder, inside, create=False) as fd:
        return sorted(os.listdir(fd))


def first_link(folder: Path, names: Iterable[str]) -> Path | None:
    """The first of ``folder``'s entries ``names`` (and everything below those that are folders) that is a
    symbolic link, or None: what a run must not write through."""
    for name in names:
        top = folder / name
        if top.is_symlink():
            return top
        for root, dirs, files in os.walk(top):
            for entry in sorted(dirs + files):
                if os.path.islink(os.path.join(root, entry)):
                    return Path(root) / entry
    return None
