"""The pristine forker of the TIR-Math sandbox and the hardened child it forks (stdlib only).

Why a separate process: a child forked from the fork server would inherit the server's heap, which
has handled earlier requests and replies (another episode's code, output, answers). The zygote is
forked by the server right after the imports and the warm-up, before the server handles anything,
and never reads a request body or an output: per call it receives only the limits and up to five pipe
ends (``SCM_RIGHTS`` over a socketpair), forks, closes them and reports the wait status. The child
reads its code from its own pipe and writes straight into the server's output pipes.

Where the server made PID and IPC namespaces, the zygote is their init (pid 1): no host process has
a pid inside, SysV/POSIX IPC objects stay inside, and when the zygote dies (it is killed with the
server by its parent-death signal) the kernel kills every process of the namespace. After each call
it kills whatever is left in the namespace (``kill(-1)``), so no call outlives its turn.
"""

from __future__ import annotations

import io
import json
import math
import os
import pathlib
import resource
import select
import signal
import socket
import sys
import tempfile
import traceback

NOBODY = 65534
#: modules user code may not import (re-import is blocked by the audit hook too)
BLOCKED_MODULES = ("ctypes", "_ctypes", "_posixsubprocess", "socket", "_socket", "multiprocessing",
                   "_multiprocessing", "pty", "resource", "mmap", "fcntl")
_FORBIDDEN_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                     "os.fork", "os.forkpty", "os.kill", "os.killpg", "signal.pthread_kill",
                     "os.setuid", "os.setgid", "sys.remote_exec", "os.startfile", "pty.spawn",
                     "winreg.", "mmap.__new__", "resource.setrlimit", "resource.prlimit")
_WRITE_EVENTS = ("os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
                 "os.utime", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
                 "shutil.rmtree", "shutil.chown", "os.chdir")
#: control message with the pipe ends of one call: limits only, never code or answers
MAX_HEADER = 4096
#: fallback levels (no per-call tmpfs): how often (seconds) the zygote counts the entries of a call's working
#: directory and their blocks against the call's budget (the namespace level's tmpfs size and inode count)
DISK_POLL = 0.01


# --- the zygote ---------------------------------------------------------------------
def serve(ctl: socket.socket, plan, confine) -> None:
    """The zygote's loop: one fork per header until the server closes the socket."""
    confine.set_parent_death_signal(signal.SIGKILL)  # a server gone before this line closes ``ctl``
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(ctl, MAX_HEADER, 5)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)
        header = json.loads(msg)
        if header.get("op") == "kill":  # for a call that ended before the request arrived
            _close_all(fds)
            continue
        me = os.getpid()
        try:
            pid = os.fork()
        except OSError as e:
            _close_all(fds)
            ctl.send(json.dumps({"status": None, "error": repr(e)}).encode())
            continue
        if pid == 0:
            try:
                ctl.close()
                _child_main(header, fds, plan, confine, me)
            finally:
                os._exit(1)  # never return into the zygote's loop
        _close_all(fds)
        budget = None if plan.level == "namespace" else (header["workdir"], disk_budget(int(header["fsize"])),
                                                          int(header["max_files"]))
        status, usage, limit = _await(ctl, pid, plan, budget)
        ctl.send(json.dumps({"status": status, "rusage": usage, "limit": limit}).encode())


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def disk_budget(fsize: int) -> int:
    """Bytes a call may keep in its working directory: the size of the namespace level's per-call tmpfs."""
    return max(64 << 20, 4 * fsize)


def _await(ctl: socket.socket, pid: int, plan, budget: tuple[str, int, int] | None = None
           ) -> tuple[int, dict, str | None]:
    """Wait for the child (or the server's ``kill``); afterwards nothing of the call is left running. Returns the
    wait status, the child's resource usage (for the record of how each call ended) and the limit the zygote
    killed it at (``"disk"``: ``budget`` = (working directory, bytes, entries) exceeded; fallback levels only)."""
    pidfd = os.pidfd_open(pid)
    limit = None
    try:
        while True:
            ready = select.select([ctl, pidfd], [], [], None if budget is None or limit else DISK_POLL)[0]
            if pidfd in ready:
                break
            if ctl in ready:
                if not ctl.recv(MAX_HEADER):  # the server is gone: die with the whole namespace
                    os._exit(0)
                _kill_call(pid, plan)
            elif _over_budget(*budget):
                limit = "disk"
                _kill_call(pid, plan)
    finally:
        os.close(pidfd)
    _pid, status, ru = os.wait4(pid, 0)
    usage = {"cpu_s": round(ru.ru_utime + ru.ru_stime, 4), "maxrss_kb": ru.ru_maxrss, "minflt": ru.ru_minflt,
             "majflt": ru.ru_majflt, "nvcsw": ru.ru_nvcsw, "nivcsw": ru.ru_nivcsw}
    _kill_call(pid, plan)
    if plan.pidns:  # reap what the call left (re-parented to us as the namespace's init)
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
    return status, usage, limit


def _over_budget(workdir: str, max_bytes: int, max_files: int) -> bool:
    """Whether the tree under ``workdir`` holds more than ``max_files`` inodes or ``max_bytes`` of blocks; it
    stops counting as soon as it does, so a check costs at most ``max_files`` ``lstat`` calls. It descends through
    directory descriptors opened with ``O_NOFOLLOW`` (never a link, any depth: one descriptor per level in
    flight), so the program cannot point it elsewhere."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        todo = [os.open(workdir, flags)]
    except OSError:
        return False
    used, seen = 0, set()  # inodes counted: a rename during the walk can show one twice; a hard link is one
    try:
        while todo:
            fd = todo.pop()
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        st = entry.stat(follow_symlinks=False)
                        if st.st_ino in seen:
                            continue
                        seen.add(st.st_ino)
                        used += st.st_blocks * 512
                        if len(seen) > max_files or used > max_bytes:
                            return True
                        if entry.is_dir(follow_symlinks=False):
                            todo.append(os.open(entry.name, flags, dir_fd=fd))
            except OSError:  # a name removed or replaced meanwhile: counted at the next check
                pass
            finally:
                os.close(fd)
    finally:
        for fd in todo:
            os.close(fd)
    return False


def _kill_call(pid: int, plan) -> None:
    """Kill every process of the call: all of the namespace but us, or the child's process group."""
    targets = [(os.kill, -1)] if plan.pidns else [(os.killpg, pid), (os.kill, pid)]
    for kill, target in targets:
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# --- the hardened child -------------------------------------------------------------
def _audit_hook_factory(workdir: str, read_roots: list[str]):
    read_ok = tuple(read_roots) + (workdir,)
    read_files = ("/dev/null", "/dev/urandom", "/dev/zero")
    realpath, fsdecode, os_sep = os.path.realpath, os.fsdecode, os.sep

    def under(path: str, roots) -> bool:
        return any(path == r or path.startswith(r + os_sep) for r in roots)

    def resolve(p):
        if type(p) not in (str, bytes, int) and type(p) not in (pathlib.PosixPath, pathlib.PurePosixPath):
            raise PermissionError("sandbox: only str/bytes/pathlib paths are allowed")
        return None if isinstance(p, int) else realpath(fsdecode(os.fspath(p)))

    def hook(event, args):
        if event == "open":
            path = resolve(args[0])
            if path is None:
                return
            mode, flags = args[1], args[2]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            if under(path, (workdir,)) or (not writing and (path in read_files or under(path, read_ok))):
                return
            raise PermissionError(f"sandbox: access to {path!r} outside the working directory is not allowed")
        if event == "import" and args[0].split(".")[0] in BLOCKED_MODULES:
            raise PermissionError(f"sandbox: import of {args[0]!r} is not allowed")
        if event.startswith(("socket.", "ctypes.")) or event.startswith(_FORBIDDEN_EVENTS):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event in ("os.rename", "os.link", "shutil.move", "shutil.copyfile", "shutil.copytree"):
            for p in args[:2]:
                if not under(resolve(p), (workdir,)):
                    raise PermissionError(f"sandbox: {event} outside the working directory is not allowed")
        elif event == "os.symlink":
            if not under(resolve(args[1]), (workdir,)):
                raise PermissionError("sandbox: os.symlink outside the working directory is not allowed")
        elif event.startswith(_WRITE_EVENTS):
            if args and not isinstance(args[0], int) and not under(resolve(args[0]), (workdir,)):
                raise PermissionError(f"sandbox: {event} outside the working directory is not allowed")
        elif event in ("os.listdir", "os.scandir", "glob.glob"):
            p = resolve(args[0]) if args and args[0] is not None else None
            if p is not None and not under(p, read_ok):
                raise PermissionError(f"sandbox: listing {p!r} is not allowed")

    return hook


def _harden(req: dict, plan, confine, parent: int) -> None:
    """Kernel layers first (user code cannot undo them), environment after."""
    workdir = req["workdir"]
    os.setsid()
    mem = int(req["mem_mb"]) << 20
    cpu = max(1, math.ceil(float(req.get("cpu") or req["timeout"])))
    for lim, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, (cpu, cpu + 1)),
                       (resource.RLIMIT_NPROC, 0), (resource.RLIMIT_FSIZE, int(req["fsize"])),
                       (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(lim, value if isinstance(value, tuple) else (value, value))
    os.chdir(workdir)
    if plan.drop_privileges:
        confine.drop_privileges(plan.uid, plan.last_cap, plan.fs_uid)
    # after the uid change (which clears it); a zygote that died before this line is caught below
    confine.set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
    if plan.landlock_abi:
        confine.landlock_restrict(plan.landlock_abi, plan.landlock_read, [workdir], ["/dev/null"])
    os.environ.clear()
    os.environ.update(PATH="/usr/bin:/bin", HOME=workdir, TMPDIR=workdir, LANG="C.UTF-8",
                      OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONHASHSEED="0")
    tempfile.tempdir = workdir
    sys.dont_write_bytecode = True
    if plan.seccomp:
        confine.install_seccomp(confine.seccomp_filter(os.getpid()))
    for name in BLOCKED_MODULES:
        sys.modules.pop(name, None)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _read_exact(fd: int, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _child_main(header: dict, fds: list[int], plan, confine, parent: int):
    """``fds``: the body pipe (code, nonce), stdout and stderr pipes, the report pipe when the request
    asked for one (it becomes fd 3), and for ``verify`` the client's stream, from which only this
    child reads the answers (no other process ever holds them)."""
    body_r, out_w, err_w = fds[:3]
    report_w = fds[3] if header.get("report") else None
    req = {**header, **json.loads(_read_all(body_r).decode("utf-8"))}
    if header.get("private_bytes"):
        req.update(json.loads(_read_exact(fds[-1], int(header["private_bytes"])).decode("utf-8")))
    while report_w is not None and report_w < 4:  # out of the way of the four numbers set below
        report_w = os.dup(report_w)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    if report_w is not None:
        os.dup2(report_w, 3)
    os.closerange(3 if report_w is None else 4, 1 << 16)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    code = 1
    try:
        _harden(req, plan, confine, parent)
        if req.get("audit", True):
            _strip_unaudited(sys.modules)
            sys.addaudithook(_audit_hook_factory(req["workdir"], plan.read_roots))
        code = _verify_in_child(req) if req["op"] == "verify" else _exec_user_code(req.pop("code"))
    except BaseException:  # noqa: BLE001 - the child reports everything, then exits
        traceback.print_exc()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _strip_unaudited(modules: dict) -> None:
    """Remove process-control entry points that raise no audit event (pidfd signals, raw fork_exec)."""
    for mod, attrs in (("os", ("pidfd_open",)), ("posix", ("pidfd_open",)), ("signal", ("pidfd_send_signal",)),
                       ("subprocess", ("_fork_exec", "_posixsubprocess"))):
        for attr in attrs:
            if mod in modules and hasattr(modules[mod], attr):
                delattr(modules[mod], attr)


def _exec_user_code(source: str) -> int:
    import linecache

    linecache.cache["<code>"] = (len(source), None, source.splitlines(True), "<code>")
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(source, "<code>", "exec"), namespace)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return int(e.code or 0)
        print(e.code, file=sys.stderr)
        return 1
    except BaseException as e:  # noqa: BLE001 - user errors become the observation
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        traceback.print_exception(type(e), e, tb)
        return 1
    return 0


def _verify_in_child(req: dict) -> int:
    """math-verify on untrusted text: its expression parser evaluates strings, so it runs here."""
    ok = grade(req["gold"], req["pred"])
    sys.stdout.write(req["nonce"] + ("1" if ok else "0"))
    return 0


# --- the grading rules ------------------------------------------------------------
def grade(gold: str, pred: str) -> bool:
    """math-verify 0.9's verdict on two ``\\boxed{}`` answers, under rules that let no answer be paid on two
    golds of different value (docs/environments.md, "Answer checking"):

    * a percentage is read at face value only: ``50\\%`` is the number 50 (as math-verify already reads
      ``50 \\text{\\%}``, a unit), never also 0.5 -- math-verify pays ``50\\%`` on both ``50`` and ``\\frac{1}{2}``;
    * an interval, a finite set and a tuple are three kinds that never equal one another: math-verify pays
      ``(1, 3)`` (parsed as the open interval) on ``\\{1, 3\\}`` and a set on a tuple of the same elements;
    * a decimal is the exact number it writes (as ``answer.as_number`` reads it in-process): math-verify rounds
      both sides to 6 places, so ``0.333333`` was paid on ``\\frac{1}{3}`` and on ``0.333333``.

    Runs in the sandbox child (it evaluates its input); importable elsewhere for trusted text (tests).
    """
    from math_verify import grader, parse, verify

    _install_kind_rule(grader)
    golds = [_exact(x) for x in parse(gold, parsing_timeout=None)]
    preds = [_exact(x) for x in parse(pred, parsing_timeout=None)]
    return bool(golds) and bool(preds) and bool(verify(golds, preds, timeout_seconds=None))


def _exact(expr):
    """``x%`` -> ``x`` (latex2sympy writes a percentage as ``x * UnevaluatedExpr(1/100)``) and each decimal
    (a ``Float``, as precise as its digits) -> the rational it writes."""
    from sympy import Basic, Float, Integer, Rational, UnevaluatedExpr

    if not isinstance(expr, Basic):
        return expr
    swap = {UnevaluatedExpr(Rational(1, 100)): Integer(1)}
    swap.update({f: Rational(str(f)) for f in expr.atoms(Float) if f.is_finite})
    return expr.xreplace(swap)


def _set_kind(expr) -> str | None:
    from sympy import FiniteSet, Interval, Tuple, Union

    if isinstance(expr, Tuple):
        return "tuple"
    if isinstance(expr, FiniteSet):
        return "set"
    if isinstance(expr, (Interval, Union)):
        return "interval"
    return None


def _install_kind_rule(grader) -> None:
    """Wrap math-verify's set comparison (also reached for the elements of nested sets and tuples) so that
    two different kinds of collection compare unequal before any of its leniencies applies."""
    compare = grader.sympy_compare_sets
    if getattr(compare, "kind_rule", False):
        return

    def compare_sets(gold, pred, *args, **kwargs):
        kinds = _set_kind(gold), _set_kind(pred)
        if None not in kinds and kinds[0] != kinds[1]:
            return False
        return compare(gold, pred, *args, **kwargs)

    compare_sets.kind_rule = True
    grader.sympy_compare_sets = compare_sets
