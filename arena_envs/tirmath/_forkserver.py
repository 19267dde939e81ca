"""Fork server for the TIR-Math sandbox (stdlib only; started by ``sandbox.Sandbox`` through ``sandbox.BOOT``).

Why a separate process: forking the training process (torch threads, GBs of RSS) per
call is slow and unsafe, and a cold ``python -c`` pays the ~0.6 s sympy import each
time. This server imports sympy/math-verify once, confines itself, forks the *zygote*
(``_zygote.py``: a pristine copy that never handles a request body or a reply) and then,
per request, has the zygote fork one confined child. It is started with a scrubbed
environment, so children inherit no secrets.

Protocol on stdin/stdout: 4-byte big-endian length + UTF-8 JSON, one reply per request.
The first frame on stdin carries this module's and its siblings' sources and the temp base, so
neither the command line nor any module's file name names a host path (see ``sandbox.BOOT``). The first
message back is a handshake naming the boundary in force (``layers["boundary"]``). End of input
ends the server after its janitor has removed every per-call directory.

Boundary levels (the best one the kernel allows, capped by ``LEVEL``; see docs/sandbox.md):

* ``namespace``: after the imports the server itself moves into an empty network namespace
  and a private mount namespace whose root holds only read-only views of the Python
  installation, site-packages and system libraries, and a UTS namespace (hostname ``sandbox``),
  then makes PID and IPC namespaces whose
  init is the zygote; each run gets a fresh tmpfs working directory that is unmounted
  afterwards. Children then drop every capability, become ``nobody``, set ``no_new_privs``
  and enter Landlock and a deny-by-default seccomp filter.
* ``landlock``: no namespaces: Landlock limits file access to the read roots and a private
  directory, the same seccomp filter forbids new processes, IPC, sockets, pipes and calls on
  other processes.
* ``none``: rlimits and the Python audit hook only -- attribution, not containment.

The Python audit hook runs on every level but only to *name* a violation in the
observation; it is never relied on (user code can switch it off).
"""

from __future__ import annotations

import gc
import importlib.util
import json
import logging
import os
import pathlib
import queue
import select
import signal
import socket
import struct
import sys
import sysconfig
import tempfile
import threading
import time
import types


def _sibling(name: str):
    """A sibling module: from the sources the client sent (file name ``<sandbox:NAME>``), or by path when this
    module is imported as part of the package (tests)."""
    sources = globals().get("_SOURCES")
    if sources is None:
        spec = importlib.util.spec_from_file_location(f"_tirsb_{name}", pathlib.Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    module = types.ModuleType(f"_tirsb_{name}")
    exec(compile(sources[name], f"<sandbox:{name}>", "exec"), module.__dict__)
    return module


confine = _sibling("_confine")
zygote = _sibling("_zygote")

PRELOAD = ("sympy", "numpy", "math_verify", "fractions", "decimal", "itertools", "functools",
           "collections", "cmath", "random", "statistics", "heapq", "bisect", "json", "pprint")
LEVELS = ("namespace", "landlock", "none")
NOBODY = zygote.NOBODY
JAIL_WORKDIR = "/sandbox"
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32")  # shared libraries for lazily loaded extensions
SYSTEM_FILES = ("/etc/ld.so.cache",)
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
#: how long the server waits for the zygote's status after killing a call
KILL_GRACE = 5.0


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
class Plan:
    """What every child gets, decided once at start-up (after probing the kernel)."""

    def __init__(self, base_tmp: str):
        self.level = "none"
        self.drop_privileges = True  # every level reached by degradation still drops what it can
        self.uid: int | None = None  # uid children switch to (None: keep)
        self.fs_uid: int | None = None  # uid their file access is checked against, where it is not ``uid``
        self.workdir_base = base_tmp  # fallback levels: parent of per-run directories
        self.base_fd: int | None = None
        self.read_roots: list[str] = []  # what the Python hook and Landlock let children read
        self.landlock_abi = 0
        self.landlock_read: list[str] = []  # Landlock's read-only roots
        self.seccomp = False
        self.pidns = False  # the zygote is the init of fresh PID and IPC namespaces
        self.janitor: queue.SimpleQueue[str] = queue.SimpleQueue()  # fallback levels: directories to remove
        self.last_cap = 40
        self.layers: dict = {}


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
    roots |= {os.path.join(sys.base_prefix, "lib")}  # lib-dynload and libpython of the interpreter
    return sorted({os.path.realpath(r) for r in roots if os.path.isdir(r)})


def _outermost(paths) -> list[str]:
    """Drop paths nested in another one (a read-only bind mount cannot receive sub-mounts)."""
    out: list[str] = []
    for p in sorted({os.path.realpath(p) for p in paths if os.path.exists(p)}):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


def _nobody_access(roots: list[str]) -> str:
    """In a throw-away child: ``"read"`` if ``nobody`` (no capabilities) can read every root, ``"switch"`` if this
    process can become ``nobody`` but ``nobody`` cannot read them, ``"none"`` if it cannot become ``nobody``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            os.write(w, b"r" if all(os.access(p, os.R_OK | os.X_OK) for p in roots) else b"s")
        finally:
            os._exit(0)
    os.close(w)
    out = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    return {b"r": "read", b"s": "switch"}.get(out, "none")


def _choose_uid(plan: Plan, roots: list[str]) -> None:
    """Root's children become ``nobody`` at every level: real and effective uid, so ``RLIMIT_NPROC=0`` binds (it
    never binds a real uid 0: 2,000 threads started in 1.5 s). Where ``nobody`` cannot read the Python
    installation (``/root/.pyenv`` is mode 0700) file access alone stays uid 0 (``fs_uid``), still without any
    capability and within Landlock's read roots."""
    if os.geteuid() != 0:
        return  # an unprivileged server (or root of a user namespace): RLIMIT_NPROC binds its uid already
    access = _nobody_access(roots)
    if access == "none":
        return
    plan.uid = NOBODY
    plan.fs_uid = None if access == "read" else 0
    plan.layers["uid_drop"] = "nobody" if access == "read" else "nobody (file access as uid 0: nobody cannot read " \
                                                                   "the Python installation)"


def _enter_network_namespace(plan: Plan) -> str | None:
    """Server-wide (hence every child): an empty network namespace (in a user namespace when not root) and a
    UTS namespace whose hostname is ``sandbox`` (``uname`` would name the host)."""
    uid, gid = os.getuid(), os.getgid()
    try:
        if os.geteuid() == 0:
            confine.unshare(confine.CLONE_NEWNET | confine.CLONE_NEWUTS)
        else:
            confine.unshare(confine.CLONE_NEWUSER | confine.CLONE_NEWNET | confine.CLONE_NEWUTS)
            confine.map_user_namespace(uid, gid)
        socket.sethostname("sandbox")
    except OSError as e:
        plan.layers["netns_error"] = str(e)
        return f"no network/user namespace ({e})"
    plan.layers["netns"] = "empty network namespace"
    plan.layers["utsns"] = "hostname 'sandbox'"
    return None


def _enter_jail(plan: Plan, roots: list[str]) -> str | None:
    """Server-wide: a private mount namespace with a read-only root. Returns why not, or None."""
    dirs = _outermost(roots + [d for d in SYSTEM_DIRS if not os.path.islink(d)])
    files = [f for f in SYSTEM_FILES if os.path.isfile(f)]
    devices = [d for d in DEVICES if os.path.exists(d)]
    try:
        confine.build_jail(plan.workdir_base, dirs, files, devices, JAIL_WORKDIR)
    except OSError as e:
        return f"no private mount namespace ({e})"
    plan.layers["mountns"] = {"read_only": dirs + files + devices, "workdir": f"tmpfs at {JAIL_WORKDIR} per run"}
    plan.workdir_base = JAIL_WORKDIR
    _choose_uid(plan, roots)
    return None


def _plan(base_tmp: str, max_level: str, roots: list[str]) -> Plan:
    plan = Plan(base_tmp)
    plan.layers = {"boundary": "none", "fallback": None, "netns": None, "netns_error": None, "utsns": None,
                   "mountns": None, "pidns": None, "uid_drop": None, "landlock": None, "seccomp": None}
    plan.read_roots = roots
    plan.drop_privileges = max_level != "none"
    plan.landlock_abi = confine.landlock_abi() if max_level != "none" else 0
    plan.seccomp = max_level != "none" and confine.is_x86_64()
    try:
        plan.last_cap = int(pathlib.Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        pass
    reasons = []
    if max_level == "namespace":
        why = _enter_network_namespace(plan) or _enter_jail(plan, roots)
        if why is None:
            plan.level = "namespace"
        else:
            reasons.append(why)
    else:
        reasons.append(f"capped at {max_level!r}")
    if plan.level != "namespace":
        if max_level != "none":
            _choose_uid(plan, roots)
        if plan.landlock_abi and plan.seccomp:
            plan.level = "landlock"
        elif max_level != "none":
            reasons.append("no Landlock" if not plan.landlock_abi else "no seccomp filter for this architecture")
        plan.base_fd = os.open(base_tmp, os.O_RDONLY | os.O_DIRECTORY)
    plan.landlock_read = ["/"] if plan.level == "namespace" else plan.read_roots + [
        p for p in SYSTEM_DIRS + SYSTEM_FILES + DEVICES if os.path.exists(p)]
    plan.layers["boundary"] = plan.level
    plan.layers["fallback"] = "; ".join(reasons) or None
    plan.layers["landlock"] = f"ABI {plan.landlock_abi}" if plan.landlock_abi else None
    plan.layers["seccomp"] = ("deny by default: no new processes, exec, IPC, inotify, uid changes or calls on other "
                              "processes, no sockets or pipes, no file locks or page-cache probes"
                              ) if plan.seccomp else None
    plan.layers["capabilities"] = "all dropped (bounding set too), no_new_privs" if plan.drop_privileges else None
    plan.layers["rlimit_nproc"] = "enforced" if plan.uid is not None or os.geteuid() != 0 else "ignored for root"
    return plan


def _enter_process_namespaces(plan: Plan) -> None:
    """PID and IPC namespaces for the zygote and its children (only where the network namespace,
    hence the privilege to make namespaces, was obtained)."""
    if not plan.layers["netns"]:
        return
    try:
        confine.enter_process_namespaces()
    except OSError as e:
        plan.layers["pidns"] = f"unavailable ({e})"
        return
    plan.pidns = True
    plan.layers["pidns"] = "PID and IPC namespaces, the zygote as init"


# --- working directories ------------------------------------------------------------
def _remove_tree(parent_fd: int, name: str) -> None:
    """Delete ``name`` under ``parent_fd`` (fallback levels only), never following a link, at any depth.

    Runs after every process of the run is dead, so the tree no longer changes. At most two
    descriptors are open at a time (a 20,000-level chain cannot exhaust them): it walks down
    through ``O_NOFOLLOW`` opens and back up through ``..``, checking each parent's identity.
    Only directories inside the run's own directory are ever chmod-ed.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=parent_fd)
    except OSError:
        _unlink_quietly(name, parent_fd)  # the program replaced its directory with a link or file
        return
    trail: list[tuple[str, tuple[int, int]]] = []  # (name, identity of its parent) of each level entered
    try:
        while True:
            sub = _first_subdir(fd)
            if sub is not None:
                here = _identity(os.fstat(fd))
                os.chmod(sub, 0o700, dir_fd=fd)  # a real directory (scandir said so; the tree is still)
                child = os.open(sub, flags, dir_fd=fd)
                os.close(fd)
                fd = child
                trail.append((sub, here))
                continue
            if not trail:
                break
            done, parent_id = trail.pop()
            parent = os.open("..", flags, dir_fd=fd)
            os.close(fd)
            fd = parent
            if _identity(os.fstat(fd)) != parent_id:  # cannot happen in a still tree: stop rather than guess
                return
            os.rmdir(done, dir_fd=fd)
    except OSError:
        return
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent_fd)
    except OSError:
        pass


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _first_subdir(fd: int) -> str | None:
    """Unlink the entries of directory ``fd`` up to its first subdirectory; return that one's name."""
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                return entry.name
            _unlink_quietly(entry.name, fd)
    return None


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _new_workdir(plan: Plan, req: dict) -> str:
    if plan.level == "namespace":
        confine.mount_workdir(JAIL_WORKDIR, zygote.disk_budget(int(req["fsize"])), int(req["max_files"]) + 1,
                              plan.uid or 0)
        return JAIL_WORKDIR
    workdir = tempfile.mkdtemp(prefix="tirsb-", dir=plan.workdir_base)
    if plan.uid is not None and plan.fs_uid is None:
        os.chown(workdir, plan.uid, plan.uid)  # fresh, empty, created by us: nothing to redirect yet
    return workdir


def _discard_workdir(plan: Plan, workdir: str) -> None:
    """Namespace level: unmount. Fallback levels: queue for the janitor thread -- removing a tree costs
    one ``rmdir`` per directory (milliseconds each on some file systems), which must not delay the reply."""
    if plan.level == "namespace":
        confine.discard_workdir(workdir)
    else:
        plan.janitor.put(os.path.basename(workdir))


def _janitor(plan: Plan) -> None:
    """Remove queued directories until ``None`` arrives (the server is closing)."""
    while (name := plan.janitor.get()) is not None:
        _remove_tree(plan.base_fd, name)


def _scrub_host_names() -> None:
    """Forget what names the host outside the Python installation, before any child is forked: ``sys.argv`` and
    ``sys.orig_argv`` (``-c``, the level), ``sys.path`` entries that are not directories here, and the finders
    and modules of editable installs (they map package names to the project's checkout)."""
    sys.argv[:] = sys.argv[:1] + [a for a in sys.argv[1:] if a in LEVELS]
    sys.orig_argv[:] = [a for a in sys.orig_argv if not a.startswith("/") and "\n" not in a]
    sys.path[:] = [p for p in sys.path if os.path.isdir(p)]
    sys.path_importer_cache.clear()
    editable = [name for name in sys.modules if name.startswith("__editable__")]
    sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "__module__", "") not in editable
                        and getattr(type(f), "__module__", "") not in editable]
    sys.path_hooks[:] = [h for h in sys.path_hooks if getattr(h, "__module__", "") not in editable]
    for name in editable:
        del sys.modules[name]
    gc.collect()  # the finder's module namespace lives on in reference cycles until collected


# --- running one request ------------------------------------------------------------
#: request fields the zygote gets (limits); everything else (code, nonce) goes to the child's pipe
_HEADER_KEYS = ("op", "timeout", "cpu", "mem_mb", "fsize", "max_files", "audit", "private_bytes", "report")


class ZygoteLost(RuntimeError):
    """The zygote died or stopped answering: this server cannot serve any more calls."""


def _run(req: dict, plan: Plan, ctl: socket.socket, client_fd: int) -> dict:
    workdir = _new_workdir(plan, req)
    try:
        return _supervise(req, plan, workdir, ctl, client_fd)
    finally:
        _discard_workdir(plan, workdir)


def _start_child(req: dict, workdir: str, ctl: socket.socket, client_fd: int) -> list[int]:
    """Hand the zygote the limits and the pipe ends, then write the body; returns the read ends of
    stdout, stderr and (when the request asks for one) the report pipe."""
    header = {k: req[k] for k in _HEADER_KEYS if k in req} | {"workdir": workdir}
    body = json.dumps({k: v for k, v in req.items() if k not in _HEADER_KEYS}).encode("utf-8")
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    body_r, body_w = os.pipe()
    ends, theirs = [out_r, err_r], [body_r, out_w, err_w]
    if req.get("report"):
        rep_r, rep_w = os.pipe()
        ends.append(rep_r)
        theirs.append(rep_w)
    try:
        fds = theirs + ([client_fd] if req.get("private_bytes") else [])
        socket.send_fds(ctl, [json.dumps(header).encode("utf-8")], fds)
    except OSError as e:
        raise ZygoteLost(f"zygote unreachable ({e})") from None
    finally:
        for fd in theirs:
            os.close(fd)
    try:
        _write_all(body_w, body)
    except BrokenPipeError:  # the child could not start; the zygote's status says why
        pass
    finally:
        os.close(body_w)
    return ends


def _supervise(req: dict, plan: Plan, workdir: str, ctl: socket.socket, client_fd: int) -> dict:
    """Read the child's output (bounded) until the zygote reports its status; kill it at the limits."""
    keep, kill_at = int(req["max_output"]), int(req["kill_output"])
    start = time.monotonic()
    ends = _start_child(req, workdir, ctl, client_fd)
    deadline = start + float(req["timeout"])
    report_cap = int(req.get("report") or 0)
    output = _Output(ends, [keep, keep, report_cap + 1])
    reason, done, killed_at = None, None, None
    try:
        while done is None:
            now = time.monotonic()
            if reason is None and now >= deadline:
                reason = "timeout"
            if reason is not None and killed_at is None:
                ctl.send(b'{"op": "kill"}')
                killed_at = now
            if killed_at is not None and now >= killed_at + KILL_GRACE:
                raise ZygoteLost("the zygote did not report a killed call")
            until = deadline if killed_at is None else killed_at + KILL_GRACE
            if output.wait(ctl, until - now):
                msg = ctl.recv(zygote.MAX_HEADER)
                if not msg:
                    raise ZygoteLost("the zygote died")
                done = json.loads(msg)
            if reason is None and output.total > kill_at:
                reason = "output_limit"
        output.drain(KILL_GRACE)  # what the child wrote before it ended (every writer is dead now)
        elapsed = time.monotonic() - start
    finally:
        output.close()
    status = done["status"]
    if status is None:
        raise RuntimeError(f"the zygote could not fork: {done.get('error')}")
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    if reason is None and sig == signal.SIGXCPU:
        reason = "cpu_timeout"
    stderr = output.text(ends[1])
    if reason is None and done.get("limit") == "disk":
        reason = "disk"
        stderr += (f"\nOSError: [Errno 28] No space left on device (the call's disk budget: "
                   f"{zygote.disk_budget(int(req['fsize'])) >> 20} MiB, {req['max_files']} files)\n")
    reply = {"stdout": output.text(ends[0]), "stderr": stderr,
             "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
             "signal": sig, "limit": reason, "output_bytes": output.total, "elapsed": elapsed,
             "rusage": done.get("rusage"), "level": plan.level}
    if report_cap:  # raw bytes as latin-1 text (lossless); None when the child wrote more than the cap
        report = bytes(output.bufs[ends[2]])
        reply["report"] = report.decode("latin-1") if len(report) <= report_cap else None
    return reply


class _Output:
    """The child's output pipes: the first ``keep`` bytes of each kept, everything counted."""

    def __init__(self, fds: list[int], keeps: list[int]):
        self.bufs = {fd: bytearray() for fd in fds}
        self.keeps = dict(zip(fds, keeps))
        self.total = 0
        self.open = set(self.bufs)

    def wait(self, ctl: socket.socket, seconds: float) -> bool:
        """Read what is ready for up to ``seconds``; True when ``ctl`` (the zygote) has a message."""
        ready = select.select([*self.open, ctl], [], [], max(0.0, seconds))[0]
        for fd in ready:
            if fd is not ctl:
                self._read(fd)
        return ctl in ready

    def drain(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.open and time.monotonic() < end:
            for fd in select.select(list(self.open), [], [], max(0.0, end - time.monotonic()))[0]:
                self._read(fd)

    def _read(self, fd: int) -> None:
        chunk = os.read(fd, 65536)
        if not chunk:
            self.open.discard(fd)
            return
        self.total += len(chunk)
        room = self.keeps[fd] - len(self.bufs[fd])
        if room > 0:
            self.bufs[fd] += chunk[:room]

    def text(self, fd: int) -> str:
        return bytes(self.bufs[fd]).decode("utf-8", "replace")

    def close(self) -> None:
        for fd in self.bufs:
            os.close(fd)


def _drain(fd: int) -> None:
    """Discard private bytes a killed child left unread (the client sends nothing else before the reply)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while poller.poll(0):
        if not os.read(fd, 65536):
            return


def _start_zygote(plan: Plan, protocol_fds: tuple[int, int]) -> tuple[socket.socket, int]:
    """Fork the zygote now, while this process has handled nothing (see ``_zygote.py``)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            for fd in protocol_fds:
                os.close(fd)
            zygote.serve(theirs, plan, confine)
        finally:
            os._exit(0)
    theirs.close()
    return ours, pid


def main(base_tmp: str, max_level: str, preload: bool = True) -> None:
    max_level = max_level if max_level in LEVELS else "namespace"
    # The protocol owns the original stdout; anything printed by imports goes to stderr.
    rfd, wfd = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    logging.disable(logging.WARNING)  # math-verify warns about its disabled timeouts
    preloaded, warmed = [], False
    for name in PRELOAD if preload else ():
        try:
            __import__(name)
            preloaded.append(name)
        except ImportError:
            pass
    try:
        if preload:
            _warm_up()
            warmed = True
    except Exception:  # noqa: BLE001 - a missing optional package only costs speed
        pass
    plan = _plan(base_tmp, max_level, _python_roots())
    del base_tmp  # every child is forked below this frame: only the plan keeps it, and only where it is the workdir
    _scrub_host_names()
    _enter_process_namespaces(plan)
    plan.layers.update(preloaded=preloaded, warmed=warmed)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctl, zygote_pid = _start_zygote(plan, (rfd, wfd))
    janitor = None
    if plan.base_fd is not None:  # after the fork: the zygote never has this thread
        janitor = threading.Thread(target=_janitor, args=(plan,), daemon=True)
        janitor.start()
    _send(wfd, {"ready": True, "layers": plan.layers, "pid": os.getpid(), "zygote": zygote_pid})
    try:
        _serve(plan, ctl, rfd, wfd)
    finally:
        if janitor is not None:  # drain: no per-call directory outlives the server
            plan.janitor.put(None)
            janitor.join()


def _serve(plan: Plan, ctl: socket.socket, rfd: int, wfd: int) -> None:
    while True:
        try:
            req = _recv(rfd)
        except (EOFError, OSError, ValueError):
            return
        lost = False
        try:
            reply = _run(req, plan, ctl, rfd)
        except Exception as e:  # noqa: BLE001 - keep serving; report the internal failure
            lost = isinstance(e, ZygoteLost)
            reply = {"stdout": "", "stderr": f"sandbox internal error: {e!r}", "exit_code": None,
                     "signal": None, "limit": "internal", "output_bytes": 0, "elapsed": 0.0}
        if req.get("private_bytes"):
            _drain(rfd)
        _send(wfd, reply)
        if lost:  # the client starts a fresh server on the next call
            return
