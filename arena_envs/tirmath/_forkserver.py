"""Fork server for the TIR-Math sandbox (run as ``python -I _forkserver.py``; stdlib only).

Why a separate process: forking the training process (torch threads, GBs of RSS) per
call is slow and unsafe, and a cold ``python -c`` pays the ~0.6 s sympy import each
time. This server imports sympy/math-verify once, then forks one hardened child per
request. It is started with a scrubbed environment, so children inherit no secrets.

Protocol on stdin/stdout: 4-byte big-endian length + UTF-8 JSON, one reply per request.
The first message is a handshake listing which containment layers work here.

Layers applied to every child (see ``_harden``): own session (killable as a group),
network namespace (server-wide, when permitted), uid drop to ``nobody`` when running
as root, ``PR_SET_NO_NEW_PRIVS``, parent-death signal, rlimits (address space, CPU,
processes, file size, open files, core), fresh private working directory, minimal
environment, and a Python audit hook that rejects sockets, ctypes, process creation,
signals to other processes and file access outside the working directory. The audit
hook is a best-effort Python-level layer (PEP 578 hooks are bypassable by native
code); the kernel-enforced layers are the actual boundary.
"""

from __future__ import annotations

import ctypes
import io
import json
import logging
import math
import os
import pathlib
import resource
import select
import shutil
import signal
import struct
import sys
import sysconfig
import tempfile
import time
import traceback

PRELOAD = ("sympy", "numpy", "math_verify", "fractions", "decimal", "itertools", "functools",
           "collections", "cmath", "random", "statistics", "heapq", "bisect", "json", "pprint")
NOBODY = 65534
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_KEEPCAPS, PR_SET_NO_NEW_PRIVS = 1, 8, 38
CAP_DAC_READ_SEARCH = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
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
_LIBC = ctypes.CDLL(None, use_errno=True)


# --- framing ------------------------------------------------------------------------
def _read_exact(fd: int, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _recv(fd: int) -> dict:
    (n,) = struct.unpack(">I", _read_exact(fd, 4))
    return json.loads(_read_exact(fd, n).decode("utf-8"))


def _send(fd: int, msg: dict) -> None:
    data = json.dumps(msg).encode("utf-8")
    _write_all(fd, struct.pack(">I", len(data)) + data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# --- server-wide setup --------------------------------------------------------------
def _unshare_network() -> str | None:
    """Move the whole server (hence every child) into an empty network namespace."""
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET
    if _LIBC.unshare(flags) != 0:
        return f"unshare failed: {os.strerror(ctypes.get_errno())}"
    return None


def _set_caps(keep: int) -> None:
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)(keep, keep, 0, 0, 0, 0)  # effective, permitted, inheritable x2
    if _LIBC.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _drop_to_nobody(keep_read_search: bool) -> None:
    if keep_read_search:
        _LIBC.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0)
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    if keep_read_search:
        _set_caps(1 << CAP_DAC_READ_SEARCH)


def _warm_up() -> None:
    """Run typical sympy/math-verify calls once so forked children inherit warm lazy imports
    and parser tables (cuts a first ``solve``/``parse`` from ~0.3-0.5 s to milliseconds)."""
    import sympy as sp
    from math_verify import parse, verify

    x, k = sp.symbols("x"), sp.symbols("k", integer=True)
    sp.solve([sp.Eq(2 * x + 1, x - 3)], [x])
    sp.roots(sp.Poly(x**2 - 3 * x + 2, x), multiple=True)
    sp.integrate(sp.diff(x**3 - x, x), (x, 0, 2))
    sp.summation(2 * k + 1, (k, 1, 5))
    sp.latex(sp.Rational(3, 4) * sp.sqrt(2))
    verify(parse("\\boxed{\\frac{1}{2}}", parsing_timeout=None), parse("0.5", parsing_timeout=None),
           timeout_seconds=None)


def _python_roots() -> list[str]:
    """Directories user code may read from (the Python installation and site-packages)."""
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {p for p in sys.path if p and os.path.isdir(p) and "site-packages" in p}
    return sorted({os.path.realpath(r) for r in roots if os.path.isdir(r)})


def _probe_uid_drop(roots: list[str]) -> dict:
    """In a throw-away child: can ``nobody`` read the Python installation? (decides CAP kept)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            _drop_to_nobody(False)
            ok = all(os.access(p, os.R_OK | os.X_OK) for p in roots)
            os.write(w, b"1" if ok else b"0")
        except BaseException:
            os.write(w, b"E")
        os._exit(0)
    os.close(w)
    out = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    return {b"1": {"uid_drop": "nobody"},
            b"0": {"uid_drop": "nobody+CAP_DAC_READ_SEARCH (python install not readable by nobody)"},
            }.get(out, {"uid_drop": None})


# --- the hardened child -------------------------------------------------------------
def _audit_hook_factory(workdir: str, read_roots: list[str]):
    allowed_path_types = (str, bytes, int, pathlib.PurePosixPath)
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


def _harden(req: dict, workdir: str, layers: dict) -> None:
    """Kernel-level limits first (cannot be undone by the code), then the Python hook."""
    os.setsid()
    if layers.get("uid_drop"):
        _drop_to_nobody(keep_read_search="CAP" in layers["uid_drop"])
    _LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    mem = int(req["mem_mb"]) << 20
    cpu = max(1, math.ceil(float(req["timeout"])))
    for lim, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, (cpu, cpu + 1)),
                       (resource.RLIMIT_NPROC, 0), (resource.RLIMIT_FSIZE, int(req["fsize"])),
                       (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(lim, value if isinstance(value, tuple) else (value, value))
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(PATH="/usr/bin:/bin", HOME=workdir, TMPDIR=workdir, LANG="C.UTF-8",
                      OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONHASHSEED="0")
    tempfile.tempdir = workdir
    sys.dont_write_bytecode = True
    for name in BLOCKED_MODULES:
        sys.modules.pop(name, None)


def _child_main(req: dict, workdir: str, out_w: int, err_w: int, layers: dict, read_roots: list[str]):
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.closerange(3, 1 << 16)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    code = 1
    try:
        _harden(req, workdir, layers)
        if req.get("audit", True):
            _strip_unaudited(sys.modules)
            sys.addaudithook(_audit_hook_factory(workdir, read_roots))
        code = _verify_in_child(req) if req["op"] == "verify" else _exec_user_code(req["code"])
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
    from math_verify import parse, verify

    gold = parse(req["gold"], parsing_timeout=None)
    pred = parse(req["pred"], parsing_timeout=None)
    ok = bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None)
    sys.stdout.write(req["nonce"] + ("1" if ok else "0"))
    return 0


# --- running one request ------------------------------------------------------------
def _rmtree(path: str) -> None:
    def onerror(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)


def _run(req: dict, base_tmp: str, layers: dict, read_roots: list[str]) -> dict:
    timeout = float(req["timeout"])
    keep, kill_at = int(req["max_output"]), int(req["kill_output"])
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="tirsb-", dir=base_tmp))
    if layers.get("uid_drop"):
        os.chown(workdir, NOBODY, NOBODY)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(out_r)
        os.close(err_r)
        _child_main(req, workdir, out_w, err_w, layers, read_roots)
    os.close(out_w)
    os.close(err_w)
    deadline = start + timeout
    bufs = {out_r: bytearray(), err_r: bytearray()}
    total, reason, status = 0, None, None
    poller = select.poll()
    for fd in bufs:
        poller.register(fd, select.POLLIN | select.POLLHUP)
    open_fds = set(bufs)
    while open_fds:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            reason = "timeout"
            break
        for fd, _ev in poller.poll(remaining * 1000):
            chunk = os.read(fd, 65536)
            if not chunk:
                poller.unregister(fd)
                open_fds.discard(fd)
                continue
            total += len(chunk)
            room = keep - len(bufs[fd])
            if room > 0:
                bufs[fd] += chunk[:room]
        if total > kill_at:
            reason = "output_limit"
            break
    while status is None:
        if reason is None and time.monotonic() >= deadline:
            reason = "timeout"
        if reason is not None:
            _kill_group(pid)
            status = os.waitpid(pid, 0)[1]
            break
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        else:
            time.sleep(0.002)
    _kill_group(pid)  # stragglers in the child's session, if any slipped through
    elapsed = time.monotonic() - start
    for fd in bufs:
        os.close(fd)
    _rmtree(workdir)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    if reason is None and sig == signal.SIGXCPU:
        reason = "cpu_timeout"
    return {"stdout": bytes(bufs[out_r]).decode("utf-8", "replace"),
            "stderr": bytes(bufs[err_r]).decode("utf-8", "replace"),
            "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": sig, "limit": reason, "output_bytes": total, "elapsed": elapsed}


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def main() -> None:
    base_tmp = sys.argv[1]
    # The protocol owns the original stdout; anything printed by imports goes to stderr.
    rfd, wfd = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    layers: dict = {"netns": None, "uid_drop": None, "preloaded": []}
    err = _unshare_network()
    layers["netns"] = "empty network namespace" if err is None else None
    layers["netns_error"] = err
    logging.disable(logging.WARNING)  # math-verify warns about its disabled timeouts
    for name in PRELOAD:
        try:
            __import__(name)
            layers["preloaded"].append(name)
        except ImportError:
            pass
    try:
        _warm_up()
        layers["warmed"] = True
    except Exception:  # noqa: BLE001 - a missing optional package only costs speed
        layers["warmed"] = False
    read_roots = _python_roots()
    if os.geteuid() == 0:
        layers.update(_probe_uid_drop(read_roots))
    layers["rlimit_nproc"] = "enforced" if layers["uid_drop"] or os.geteuid() != 0 else "ignored for root"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _send(wfd, {"ready": True, "layers": layers, "pid": os.getpid()})
    while True:
        try:
            req = _recv(rfd)
        except (EOFError, OSError, ValueError):
            return
        try:
            reply = _run(req, base_tmp, layers, read_roots)
        except Exception as e:  # noqa: BLE001 - keep serving; report the internal failure
            reply = {"stdout": "", "stderr": f"sandbox internal error: {e!r}", "exit_code": None,
                     "signal": None, "limit": "internal", "output_bytes": 0, "elapsed": 0.0}
        _send(wfd, reply)


if __name__ == "__main__":
    main()
