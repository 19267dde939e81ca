"""Client side of the TIR-Math sandbox: runs model-written Python in a hardened fork server.

``Sandbox.run(code)`` sends the code to a long-lived server process (``_forkserver.py``)
that has sympy/numpy/math-verify imported and has a pristine copy of itself (``_zygote.py``)
fork one hardened child per call, so a call costs a fork instead of a Python start + sympy
import (see
``benchmarks/bench_sandbox.py``). The client never trusts the server to stay alive: a
missing reply within ``timeout + margin`` or a dead server yields ``status="sandbox_error"``
and a fresh server on the next call. The boundary that actually holds on this machine is
``Sandbox.boundary`` (details in ``Sandbox.layers``); anything below the full ``namespace``
level is logged once per process as a warning (threat model and levels: docs/sandbox.md).
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from arena_envs.base import clean_observation

#: what the server process runs (``python -I -c BOOT LEVEL``): it reads its modules' sources, the temp base and
#: whether to preload sympy from the first frame on stdin, so no host path is on its command line, in ``sys.argv``
#: or in a module's file name (children inherit all of these)
BOOT = """import json, os, struct, sys
def _read(n):
    b = b""
    while len(b) < n:
        c = os.read(0, n - len(b))
        if not c:
            raise SystemExit(1)
        b += c
    return b
_boot = json.loads(_read(struct.unpack(">I", _read(4))[0]))
_ns = {"__name__": "_tirsb_server", "_SOURCES": _boot.pop("sources")}
exec(compile(_ns["_SOURCES"]["_forkserver"], "<sandbox:_forkserver>", "exec"), _ns)
_ns["main"](_boot.pop("base_tmp"), sys.argv[1], _boot.pop("preload"))
"""
_MODULES = ("_forkserver", "_confine", "_zygote")
#: environment of the server (and hence of every child): nothing from the parent leaks in
_SERVER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1",
               "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
STATUSES = ("ok", "error", "timeout", "memory", "output_limit", "crashed", "sandbox_error")
#: containment levels, strongest first (see ``_forkserver.py`` and docs/sandbox.md)
BOUNDARIES = ("namespace", "landlock", "none")
_LOG = logging.getLogger(__name__)
#: largest gold + predicted answer (JSON) that ``verify`` sends
MAX_VERIFY_BYTES = 32 << 10
_REPORTED: set[tuple[str, str | None]] = set()
#: how many call ends ``Sandbox.ends`` keeps
ENDS_KEPT = 1000
#: an answer check's wall-clock limit, in multiples of its CPU budget
VERIFY_WALL_FACTOR = 5
#: what the log says of an attempt that was not simply the call's outcome (``attempt_verdict``)
_VERDICT_LOG = {"retry": "a death none of its limits explains; retrying",
                "reproduced": "the same death again: the program's own crash, its outcome",
                "env_error": "no outcome (no reply, or a retry that did not reproduce the first death): an env error"}


class SandboxError(RuntimeError):
    """The sandbox could not give a call an outcome: its server died or did not answer, or its child died of a
    signal that none of its limits explains and the retry did not end the same way. An env error (the rollout's
    failure policy replays or drops the episode), never the program's or the answer's outcome."""


def unexplained_signal(reply: dict, cpu_limit: int) -> bool:
    """Whether the child died of a signal its own limits do not explain: not the server's kill at the wall-clock
    or output limit, not ``SIGXCPU``/``SIGXFSZ`` (CPU and file-size limits), not the kernel's ``SIGKILL`` at the
    hard CPU limit (``cpu_limit`` + 1 s of CPU time)."""
    sig = reply.get("signal")
    if sig is None or reply.get("limit") is not None or sig in (signal.SIGXCPU, signal.SIGXFSZ):
        return False
    return not (sig == signal.SIGKILL and (reply.get("rusage") or {}).get("cpu_s", 0.0) >= cpu_limit)


def signal_text(sig: int) -> str:
    """``SIGSEGV (Segmentation fault)``: the name a Python programmer knows, and what it means (a real-time
    signal has no name of its own: ``signal 40 (Real-time signal 6)``)."""
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    return f"{name} ({signal.strsignal(sig) or 'unknown signal'})"


def _end_text(reply: dict) -> str:
    """How a call ended, in a few words (for the message of an env error)."""
    if reply.get("limit") is not None:
        return f"at the {reply['limit']} limit"
    if reply.get("signal") is not None:
        return f"killed by {signal_text(reply['signal'])}"
    return f"exit code {reply.get('exit_code')}"


def attempt_verdict(reply: dict | None, first: dict | None, cpu_limit: int) -> str:
    """What one attempt's end means for the call (``first``: the first attempt's reply when this is the retry).

    * ``"outcome"``: the program's (or the answer's) outcome, reported as it is;
    * ``"retry"``: a first death that none of its limits explains (an outside killer, or the program itself): run
      once more to tell which;
    * ``"reproduced"``: the retry died of the same signal: the program's own crash (a self-kill, ``os.abort()``, a
      segfault), reported to the agent like any failing program -- never an env error it could cause at will;
    * ``"env_error"``: no reply (server dead or hung), or a retry that ended otherwise than the first death: the
      death was not the program's, so the call has no outcome (``SandboxError``: the failure policy).
    """
    if reply is None:
        return "env_error"
    if first is None:
        return "retry" if unexplained_signal(reply, cpu_limit) else "outcome"
    same = unexplained_signal(reply, cpu_limit) and reply["signal"] == first["signal"]
    return "reproduced" if same else "env_error"


def env_error_text(what: str, first: dict | None, reply: dict | None) -> str:
    """Why ``what`` (the run, the answer check) has no outcome: the ``SandboxError`` message."""
    if reply is None:
        return f"{what} got no reply from its sandbox server (it died or hung)"
    return (f"{what} was killed by {signal_text(first['signal'])}, which none of its limits explains, and its retry "
            f"ended otherwise ({_end_text(reply)}): the death was not the program's own")


_PID_MAX: list[int] = []


def host_facts() -> dict:
    """The host's load, free pids and available memory now (``/proc``; ``None`` where unreadable)."""
    facts = {"load1": None, "free_pids": None, "mem_available_mb": None}
    try:
        fields = Path("/proc/loadavg").read_text().split()
        if not _PID_MAX:
            _PID_MAX.append(int(Path("/proc/sys/kernel/pid_max").read_text()))
        facts["load1"] = float(fields[0])
        facts["free_pids"] = _PID_MAX[0] - int(fields[3].split("/")[1])  # every task (thread) holds a pid
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                facts["mem_available_mb"] = int(line.split()[1]) >> 10
    except (OSError, ValueError, IndexError):
        pass
    return facts


def clean_text(text: str) -> str:
    """Remove control characters except newline and tab (terminal escapes, carriage returns, NULs) and Unicode
    format characters (bidi controls, zero-width characters, tags): ``arena_envs.base.clean_observation``."""
    return clean_observation(text)


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one sandboxed run. ``status`` is one of ``STATUSES``. ``report``: the bytes written to
    fd 3 when ``run`` asked for a report channel (``None``: not asked, over its cap, or no reply)."""

    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    signal: int | None
    elapsed: float
    output_bytes: int
    report: bytes | None = None

    @property
    def last_error_line(self) -> str:
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        return lines[-1].strip() if lines else ""


def _classify(reply: dict) -> str:
    limit = reply.get("limit")
    if limit in ("timeout", "cpu_timeout"):
        return "timeout"
    if limit == "output_limit":
        return "output_limit"
    if limit == "internal":
        return "sandbox_error"
    if limit == "disk":  # the fallback levels' disk budget: what a full tmpfs is at the namespace level
        return "error"
    last = [ln for ln in reply["stderr"].splitlines() if ln.strip()][-1:] or [""]
    if last[0].lstrip().startswith("MemoryError"):
        return "memory"
    if reply.get("signal") is not None:
        return "crashed"
    return "ok" if reply.get("exit_code") == 0 else "error"


class Sandbox:
    """Thread-safe handle on one fork server; limits are per call with these defaults.

    Args:
        timeout: wall-clock seconds per call (CPU limit = ceil(timeout)).
        memory_mb: address-space limit of the child (RLIMIT_AS).
        max_output: bytes of stdout/stderr kept (each); the rest is discarded.
        kill_output: total output bytes after which the child is killed (``output_limit``).
        file_size: largest file the child may write in its working directory (RLIMIT_FSIZE).
        max_files: inodes (files, directories, symlinks; a hard link is not one) the working directory may hold;
            with its size (64 MiB or 4 x ``file_size``) the call's disk budget at every level (docs/sandbox.md).
        margin: extra seconds the client waits for a reply beyond ``timeout``.
        audit_hook: install the Python-level audit hook in children (it only names violations in
            the output). ``False`` leaves only the kernel-enforced layers; it exists to test them.
        max_boundary: strongest containment level to try (one of ``BOUNDARIES``); lower it only to
            test the fallbacks. The level reached is ``boundary``.
        preload: import and warm up sympy/numpy/math-verify in the server (children start with them warm);
            ``False`` starts the server in a fraction of the time, for short-lived servers that run plain Python.
        close_timeout: seconds ``close`` waits for the server to remove its per-call directories (fallback
            levels) before it kills it.
        max_verify_servers: servers (this one included) that answer ``verify`` calls made at the same time; the
            extra ones start on first contention (one server start each) and live as long as this handle.
    """

    def __init__(self, timeout: float = 3.0, memory_mb: int = 2048, max_output: int = 65536,
                 kill_output: int = 1 << 20, file_size: int = 4 << 20, max_files: int = 4096, margin: float = 5.0,
                 startup_timeout: float = 120.0, audit_hook: bool = True, max_boundary: str = "namespace",
                 preload: bool = True, close_timeout: float = 60.0, max_verify_servers: int = 4):
        if max_boundary not in BOUNDARIES:
            raise ValueError(f"max_boundary must be one of {BOUNDARIES}, got {max_boundary!r}")
        self.max_boundary = max_boundary
        self.timeout, self.memory_mb, self.margin = float(timeout), int(memory_mb), float(margin)
        self.max_output, self.kill_output, self.file_size = int(max_output), int(kill_output), int(file_size)
        self.max_files = int(max_files)
        self.startup_timeout, self.audit_hook = float(startup_timeout), bool(audit_hook)
        self.preload, self.close_timeout = bool(preload), float(close_timeout)
        self.max_verify_servers = max(1, int(max_verify_servers))
        self._lock = threading.Lock()
        self._helpers: list[Sandbox] = []
        self._helpers_lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner_pid = -1
        self._layers: dict = {}
        self._zygote_pid: int | None = None
        #: how the latest calls ended (``ENDS_KEPT``): op, attempt, status inputs, rusage, level, host facts
        self.ends: collections.deque[dict] = collections.deque(maxlen=ENDS_KEPT)

    # --- lifecycle ------------------------------------------------------------------
    @property
    def layers(self) -> dict:
        """Containment layers active on this machine (from the server handshake)."""
        with self._lock:
            self._ensure_server()
            return dict(self._layers)

    @property
    def boundary(self) -> str:
        """Containment level in force: ``namespace`` (full), ``landlock`` or ``none`` (see docs/sandbox.md)."""
        return self.layers["boundary"]

    @property
    def server_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._owner_pid == os.getpid() else None

    @property
    def zygote_pid(self) -> int | None:
        """The process every child is forked from (it never holds a request body or an output)."""
        return self._zygote_pid if self.server_pid is not None else None

    def _ensure_server(self) -> None:
        if self._proc is not None and self._owner_pid == os.getpid() and self._proc.poll() is None:
            return
        if self._owner_pid != os.getpid():
            self._proc = None  # inherited across fork(): the pipes belong to the parent process
        self._stop_server()
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-c", BOOT, self.max_boundary],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=_SERVER_ENV, start_new_session=True, close_fds=True, cwd="/")
        self._owner_pid = os.getpid()
        here = Path(__file__).parent
        boot = json.dumps({"sources": {m: (here / f"{m}.py").read_text() for m in _MODULES},
                           "base_tmp": tempfile.gettempdir(), "preload": self.preload}).encode("utf-8")
        try:
            self._proc.stdin.write(struct.pack(">I", len(boot)) + boot)
            self._proc.stdin.flush()
        except OSError:
            pass  # a server that died at once gives no handshake below
        hello = self._read_reply(time.monotonic() + self.startup_timeout)
        if hello is None or not hello.get("ready"):
            self._stop_server()
            raise RuntimeError("sandbox server failed to start")
        self._layers, self._zygote_pid = hello["layers"], hello["zygote"]
        self._report_degradation()

    def _report_degradation(self) -> None:
        """Say once per process (and level) when the kernel could not give the full boundary."""
        level, why = self._layers.get("boundary"), self._layers.get("fallback")
        if level == self.max_boundary == "namespace" or (level, why) in _REPORTED:
            return
        _REPORTED.add((level, why))
        _LOG.warning("TIR-Math sandbox boundary: %r (%s); see docs/sandbox.md for what this level guarantees",
                     level, why or "requested")

    def _stop_server(self, grace: float = 0.0) -> None:
        """Stop the server: with ``grace``, end its input and give it that long to finish (its janitor removes
        every per-call directory before it exits); then kill its process group."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if grace > 0 and proc.poll() is None:
            try:
                proc.stdin.close()
                proc.wait(grace)
            except (OSError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass

    def close(self) -> None:
        """Stop the server once it has removed what its calls left (``close_timeout`` at most)."""
        with self._helpers_lock:
            helpers, self._helpers = self._helpers, []
        for helper in helpers:
            helper.close()
        with self._lock:
            if self._owner_pid == os.getpid():
                self._stop_server(self.close_timeout)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # --- requests -------------------------------------------------------------------
    def _read_reply(self, deadline: float) -> dict | None:
        fd = self._proc.stdout.fileno()
        buf = b""
        need = 4
        length = None
        while len(buf) < need:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, max(need - len(buf), 65536) if length is None else need - len(buf))
            if not chunk:
                return None
            buf += chunk
            if length is None and len(buf) >= 4:
                (length,) = struct.unpack(">I", buf[:4])
                need = 4 + length
        return json.loads(buf[4:need].decode("utf-8"))

    def _request(self, req: dict, wait: float, private: bytes = b"") -> dict | None:
        with self._lock:
            return self._request_locked(req, wait, private)

    def _request_locked(self, req: dict, wait: float, private: bytes = b"") -> dict | None:
        """One request (``self._lock`` held); ``private`` bytes follow the frame and are read by the child, never
        by the server."""
        self._ensure_server()
        if private:
            req = {**req, "private_bytes": len(private)}
        data = json.dumps(req).encode("utf-8")
        try:
            self._proc.stdin.write(struct.pack(">I", len(data)) + data + private)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._stop_server()
            return None
        reply = self._read_reply(time.monotonic() + wait)
        if reply is None:  # server dead or hung: never leave a half-read stream behind
            self._stop_server()
        return reply

    def _verify_request(self, req: dict, wait: float, private: bytes) -> dict | None:
        """A check never queues behind another call: the first idle server of this handle and its helpers takes
        it, or a new helper (``max_verify_servers`` in all); only when all are busy does it wait for this one."""
        with self._helpers_lock:
            boxes = [self, *self._helpers]
        for box in boxes:
            if box._lock.acquire(blocking=False):
                try:
                    return box._request_locked(req, wait, private)
                finally:
                    box._lock.release()
        with self._helpers_lock:
            helper = None
            if 1 + len(self._helpers) < self.max_verify_servers:
                helper = Sandbox(timeout=self.timeout, memory_mb=self.memory_mb, margin=self.margin,
                                 startup_timeout=self.startup_timeout, max_boundary=self.max_boundary,
                                 close_timeout=self.close_timeout, max_verify_servers=1)
                helper._lock.acquire()  # ours until this request is answered
                self._helpers.append(helper)
        if helper is None:
            return self._request(req, wait, private)
        try:
            return helper._request_locked(req, wait, private)
        finally:
            helper._lock.release()

    def _attempt(self, op: str, attempt: int, reply: dict | None, first: dict | None, timeout: float) -> str:
        """Judge one attempt (``attempt_verdict``), keep its end in ``ends`` and log it (DEBUG; WARNING when the
        verdict is not simply ``"outcome"``). Returns the verdict. A dead server is never retried: the
        call's outcome is lost with it, and the next call starts a fresh server."""
        cpu_limit = max(1, math.ceil(timeout))
        verdict = attempt_verdict(reply, first, cpu_limit)
        unexplained = reply is None or unexplained_signal(reply, cpu_limit)
        end = {"op": op, "attempt": attempt, "level": self._layers.get("boundary"), "unexplained": unexplained,
               "verdict": verdict, "time": time.time(), **host_facts()}
        if reply is None:
            end["error"] = "no reply (server died or hung)"
        else:
            end.update({k: reply.get(k) for k in ("signal", "exit_code", "limit", "elapsed", "rusage")})
        self.ends.append(end)
        if verdict != "outcome":
            _LOG.warning("TIR-Math sandbox: %s call, attempt %d of 2: %s: %s", op, attempt, _VERDICT_LOG[verdict], end)
        elif _LOG.isEnabledFor(logging.DEBUG):
            _LOG.debug("TIR-Math sandbox call ended: %s", end)
        return verdict

    def run(self, code: str, timeout: float | None = None, memory_mb: int | None = None,
            report: int = 0) -> ExecResult:
        """Execute ``code`` (any string) in a fresh hardened child; never raises for bad code. A call whose child
        dies of a signal its limits do not explain is run once more: the same death again is the program's own
        crash (``crashed``, its outcome); a retry that ends otherwise, or a dead server, makes the result
        ``sandbox_error``, which callers must treat as an env error, not as the program's outcome.

        ``report > 0`` gives the child a pipe at fd 3 whose bytes (up to ``report``) come back as
        ``ExecResult.report``, apart from stdout. It is a channel, not a proof: the program can write
        to it like anything else, so whoever reads it must not trust its content (see docs/swe.md).
        """
        timeout = self.timeout if timeout is None else float(timeout)
        req = {"op": "run", "code": code, "timeout": timeout, "audit": self.audit_hook,
               "mem_mb": self.memory_mb if memory_mb is None else int(memory_mb),
               "max_output": self.max_output, "kill_output": self.kill_output, "fsize": self.file_size,
               "max_files": self.max_files}
        if report > 0:
            req["report"] = int(report)
        start = time.monotonic()
        first, reply, verdict = self._call("run", lambda: self._request(req, timeout + self.margin), timeout)
        if verdict == "env_error":
            return ExecResult("sandbox_error", "", env_error_text("the run", first, reply), None, None,
                              time.monotonic() - start, 0)
        raw = reply.get("report")
        return ExecResult(_classify(reply), clean_text(reply["stdout"]), clean_text(reply["stderr"]),
                          reply["exit_code"], reply["signal"], reply["elapsed"], reply["output_bytes"],
                          raw.encode("latin-1") if isinstance(raw, str) else None)

    def _call(self, op: str, request, timeout: float) -> tuple[dict | None, dict | None, str]:
        """``request()`` once, and once more after a death its limits do not explain (docs/sandbox.md, "How every
        call ends"). Returns the first reply when it was retried (else ``None``), the last reply and its
        verdict."""
        first = None
        for attempt in (1, 2):
            reply = request()
            verdict = self._attempt(op, attempt, reply, first, timeout)
            if verdict != "retry":
                break
            first = reply
        return first, reply, verdict

    def verify(self, gold: str, pred: str, timeout: float = 1.0, memory_mb: int = 2048) -> bool:
        """``_zygote.grade`` (math-verify ``parse``/``verify`` under the grading rules) in a hardened child (it
        evaluates untrusted text). Concurrent checks run in parallel servers (``max_verify_servers``): one slow
        answer delays no other check. ``timeout`` is the check's CPU budget (seconds, rounded up): over it the
        answer is not paid. The wall clock allows ``VERIFY_WALL_FACTOR`` times as much, so that a loaded host
        (a check of ``(x+1)^2`` took 0.4-1.0 s of wall time for 0.1-0.2 s of CPU at load average 13 on 2 cores)
        does not turn a correct answer into a wrong one. A check whose child dies of a signal its limits do not
        explain is retried once: the same death again is the answer's outcome (not paid: an answer that crashes
        the checker is no correct answer); a retry that ends otherwise raises ``SandboxError``, as does a dead
        server.

        The answers travel as private bytes: only the short-lived verify child reads them, so the
        gold answer never sits in the server's memory, which every later program inherits by fork.
        """
        private = json.dumps({"gold": gold, "pred": pred}).encode("utf-8")
        if len(private) > MAX_VERIFY_BYTES:
            return False  # far beyond any answer; keeps the message within one pipe buffer
        nonce = os.urandom(8).hex()
        req = {"op": "verify", "nonce": nonce, "timeout": VERIFY_WALL_FACTOR * float(timeout), "cpu": float(timeout),
               "mem_mb": int(memory_mb), "max_output": 256, "kill_output": 1 << 16, "fsize": 0, "max_files": 16}
        first, reply, verdict = self._call(
            "verify", lambda: self._verify_request(req, req["timeout"] + self.margin, private), timeout)
        if verdict == "env_error":
            raise SandboxError(env_error_text("the answer check", first, reply))
        return verdict == "outcome" and reply.get("limit") is None and reply["stdout"].endswith(nonce + "1")


_SHARED: dict[int, Sandbox] = {}
_SHARED_LOCK = threading.Lock()


def shared_sandbox() -> Sandbox:
    """One server per process, shared by all envs (limits travel with each request)."""
    with _SHARED_LOCK:
        box = _SHARED.get(os.getpid())
        if box is None:
            box = _SHARED[os.getpid()] = Sandbox()
        return box
