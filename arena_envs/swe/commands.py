"""The SWE-Mini command language: parsing and the file commands, on an in-memory working copy.

One command per action; only ``edit`` spans several lines::

    ls [dir]                    list files (under dir)
    open <file> [line]          show WINDOW numbered lines (around line)
    search <text>               every line containing text (case-sensitive), as file:line: content
    edit <file> <start>-<end>   replace lines start..end (1-based, inclusive) by the lines that follow,
    <new lines>                 up to an optional end_of_edit line; end = start - 1 inserts before start,
    end_of_edit                 an empty block deletes the lines
    run_tests [pattern]         run the visible tests whose id contains pattern
    submit                      finish: the hidden tests decide the reward

Bad input (unknown command, path outside the working copy, lines out of range, oversized edits)
gives a :class:`CommandError` whose text is the observation; nothing here raises anything else.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

COMMANDS = ("ls", "open", "search", "edit", "run_tests", "submit")
#: Lines shown by ``open``.
WINDOW = 40
#: Characters of one line shown by ``open`` and ``edit``.
LINE_CHARS = 400
#: Hits shown by ``search``.
MAX_HITS = 25
#: Largest file an edit may produce, and largest working copy (characters).
MAX_FILE_CHARS = 100_000
MAX_REPO_CHARS = 1_000_000
END_OF_EDIT = "end_of_edit"
_RANGE = re.compile(r"(\d{1,9})\s*[-:]\s*(\d{1,9})")


class CommandError(ValueError):
    """An invalid command; ``str(error)`` is the observation."""


@dataclass(frozen=True)
class Command:
    name: str
    args: str = ""  # the rest of the first line, stripped
    block: tuple[str, ...] = ()  # edit only


def parse(action: str) -> Command:
    """The command of ``action`` (surrounding blank lines and a code fence around it are ignored)."""
    lines = action.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    first = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    lines = lines[first:]  # one slice: popping blank lines one by one is quadratic in their number
    if lines and lines[0].strip().startswith("```") and len(lines) > 1 and lines[-1].strip() == "```":
        lines = lines[1:-1]
    if not lines or not lines[0].strip():
        raise CommandError(f"Empty command. Commands: {', '.join(COMMANDS)}.")
    head = lines[0].strip().split(None, 1)
    name, args = head[0].lower(), head[1] if len(head) > 1 else ""
    if name not in COMMANDS:
        raise CommandError(f"Unknown command {head[0][:40]!r}. Commands: {', '.join(COMMANDS)}.")
    block = lines[1:]
    if name != "edit":
        if any(ln.strip() for ln in block):
            raise CommandError(f"{name} takes a single line; only edit has a block of new lines.")
        return Command(name, args.strip())
    if block and block[-1].strip() == END_OF_EDIT:
        block = block[:-1]
    elif any(ln.strip() == END_OF_EDIT for ln in block):
        raise CommandError(f"Text after {END_OF_EDIT}: one edit per action.")
    return Command(name, args.strip(), tuple(block))


def resolve(files: dict[str, str], path: str, directory: bool = False) -> str:
    """Normalised repository path of ``path``; must name a file (or a directory with files)."""
    path = path.strip().strip("'\"`")
    norm = posixpath.normpath(path) if path else "."
    if posixpath.isabs(norm) or norm == ".." or norm.startswith("../"):
        raise CommandError(f"{path[:80]!r} is outside the repository.")
    if directory:
        if norm == "." or any(p.startswith(norm + "/") for p in files):
            return norm
        if norm in files:
            return norm
        raise CommandError(f"No such directory: {norm[:80]}")
    if norm not in files:
        raise CommandError(f"No such file: {norm[:80]}. Use ls to list the files.")
    return norm


def ls(files: dict[str, str], args: str) -> str:
    root = resolve(files, args, directory=True) if args else "."
    if root in files:
        return root
    shown = sorted(p for p in files if root == "." or p.startswith(root + "/"))
    return "\n".join(shown)


def numbered(text: str, start: int, stop: int) -> str:
    """Lines start..stop-1 (0-based) with 1-based numbers; overlong lines are cut at LINE_CHARS."""
    lines = text.split("\n")
    return "\n".join(f"{i + 1:4d}| {_cut(lines[i])}" for i in range(max(start, 0), min(stop, len(lines))))


def _cut(line: str) -> str:
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + f"... ({len(line) - LINE_CHARS} more characters)"


def line_count(text: str) -> int:
    return len(text.split("\n"))


def open_file(files: dict[str, str], args: str) -> tuple[str, str]:
    """(path, observation) of ``open <file> [line]``."""
    parts = args.rsplit(None, 1)
    line = None
    if len(parts) == 2 and parts[1].isdigit():
        args, line = parts[0], int(parts[1][:9])
    path = resolve(files, args)
    total = line_count(files[path])
    if line is not None and not 1 <= line <= total:
        raise CommandError(f"{path} has {total} lines; line {line} is out of range.")
    start = 0 if line is None else max(0, min(line - 1 - WINDOW // 2, total - WINDOW))
    stop = start + WINDOW
    more = f"\n({total - stop} more lines; open {path} {stop + 1})" if stop < total else ""
    header = f"[{path}: lines {start + 1}-{min(stop, total)} of {total}]"
    return path, f"{header}\n{numbered(files[path], start, stop)}{more}"


def search(files: dict[str, str], args: str) -> str:
    if not args:
        raise CommandError("search needs a text to look for.")
    hits = [f"{p}:{i + 1}: {ln.strip()[:160]}" for p in sorted(files) for i, ln in enumerate(files[p].split("\n"))
            if args in ln]
    if not hits:
        return f"No matches for {args[:80]!r}."
    more = f"\n({len(hits) - MAX_HITS} more matches)" if len(hits) > MAX_HITS else ""
    return f"{len(hits)} match(es) for {args[:80]!r}:\n" + "\n".join(hits[:MAX_HITS]) + more


def edit(files: dict[str, str], command: Command) -> tuple[str, str]:
    """Apply an edit in place; (path, observation showing the edited region)."""
    parts = command.args.rsplit(None, 1)
    match = _RANGE.fullmatch(parts[-1]) if len(parts) == 2 else None
    if match is None:
        raise CommandError("Usage: edit <file> <start>-<end>, then the new lines (and optionally end_of_edit).")
    path = resolve(files, parts[0])
    start, end = int(match.group(1)), int(match.group(2))
    lines = files[path].split("\n")
    if not (1 <= start <= len(lines) + 1 and start - 1 <= end <= len(lines)):
        raise CommandError(f"{path} has {len(lines)} lines; {start}-{end} is not a valid range "
                           "(end = start - 1 inserts before start).")
    new_lines = lines[:start - 1] + list(command.block) + lines[end:]
    text = "\n".join(new_lines)
    if len(text) > MAX_FILE_CHARS:
        raise CommandError(f"Edit rejected: {path} would exceed {MAX_FILE_CHARS} characters.")
    if sum(len(t) for p, t in files.items() if p != path) + len(text) > MAX_REPO_CHARS:
        raise CommandError(f"Edit rejected: the repository would exceed {MAX_REPO_CHARS} characters.")
    files[path] = text
    shown_from, region_end = max(0, start - 3), min(start - 1 + len(command.block) + 2, len(new_lines))
    shown_to = min(region_end, shown_from + WINDOW)  # at most WINDOW lines, like open
    more = f"\n({region_end - shown_to} more edited lines; open {path} {shown_to + 1})" if region_end > shown_to else ""
    return path, (f"Edited {path}: lines {start}-{end} replaced by {len(command.block)} line(s).\n"
                  f"{numbered(text, shown_from, shown_to)}{more}")
