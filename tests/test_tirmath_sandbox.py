"""Hostile programs through the TIR-Math sandbox and env: containment, reason, time bound, no side effects."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import proc_children

from arena_envs.tirmath import Sandbox, TIRMathEnv

TIMEOUT = 1.5  # small limits keep the catalogue fast
MEM_MB = 512


@pytest.fixture(scope="module")
def sandbox():
    box = Sandbox(timeout=TIMEOUT, memory_mb=MEM_MB, margin=5.0)
    assert box.layers["preloaded"]  # start the server once for the module
    yield box
    box.close()


@pytest.fixture()
def outside(tmp_path: Path) -> Path:
    """A directory outside the sandbox holding a sentinel file (mode 0700, owned by the host user)."""
    (tmp_path / "sentinel.txt").write_text("untouched")
    tmp_path.chmod(0o700)
    return tmp_path


def _leftovers(box: Sandbox) -> list[int]:
    """Processes of earlier calls still running: descendants of the server other than its zygote."""
    found, todo = [], [box.server_pid]
    while todo:
        kids = proc_children(todo.pop())
        found += kids
        todo += kids
    return [p for p in found if p != box.zygote_pid]


# (name, code template, expected status, text expected in the error line or stdout)
HOSTILE = [
    ("infinite_loop", "while True:\n    pass", "timeout", ""),
    ("sleep", "import time\ntime.sleep(60)", "timeout", ""),
    ("fork_bomb", "import os\nwhile True:\n    os.fork()", "error", "os.fork"),
    ("subprocess", "import subprocess\nsubprocess.run(['sh', '-c', 'touch {outside}/pwned'])", "error",
     "subprocess.Popen"),
    ("os_system", "import os\nos.system('touch {outside}/pwned')", "error", "os.system"),
    ("memory_bomb", "x = bytearray(10**11)", "memory", "MemoryError"),
    ("memory_growth", "a = []\nwhile True:\n    a.append(bytes(10**7))", "memory", "MemoryError"),
    ("write_outside", "open('{outside}/sentinel.txt', 'w').write('pwned')", "error", "outside the working"),
    ("delete_outside", "import os\nos.remove('{outside}/sentinel.txt')", "error", "os.remove"),
    ("rename_outside", "import os\nos.rename('{outside}/sentinel.txt', 'stolen.txt')", "error", "os.rename"),
    ("symlink_escape", "import os\nos.symlink('{outside}/sentinel.txt', 'link')\nopen('link', 'w').write('x')",
     "error", "outside the working"),
    ("chdir_escape", "import os\nos.chdir('{outside}')", "error", "os.chdir"),
    ("read_secret", "print(open('/etc/shadow').read())", "error", "outside the working"),
    ("socket", "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)", "error", "socket"),
    ("ctypes", "import ctypes\nctypes.CDLL(None).kill(0, 9)", "error", "ctypes"),
    ("kill_parent", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "error", "os.kill"),
    ("killpg_all", "import os\nos.killpg(0, 9)", "error", "os.killpg"),
    ("print_gigabytes", "import sys\nwhile True:\n    sys.stdout.write('x' * 1000000)", "output_limit", ""),
    ("stderr_flood", "import sys\nwhile True:\n    sys.stderr.write('e' * 1000000)", "output_limit", ""),
    ("exit_code", "raise SystemExit(7)", "error", ""),
    ("recursion", "def f(n):\n    return f(n + 1)\nf(0)", "error", "RecursionError"),
    ("syntax", "def (:", "error", "SyntaxError"),
    ("close_stdout", "import os\nos.close(1)\nos.close(2)\nwhile True:\n    pass", "timeout", ""),
    ("env_secrets", "import os\nprint(sorted(os.environ))", "ok", "PATH"),
]


@pytest.mark.parametrize("name,code,status,needle", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_program_is_contained(sandbox, outside, name, code, status, needle):
    server = sandbox.server_pid
    start = time.monotonic()
    result = sandbox.run(code.format(outside=outside))
    elapsed = time.monotonic() - start
    assert elapsed <= TIMEOUT + sandbox.margin
    assert result.status == status, (result.status, result.stderr[-300:])
    assert needle in result.last_error_line + result.stdout
    assert (outside / "sentinel.txt").read_text() == "untouched"
    assert sorted(p.name for p in outside.iterdir()) == ["sentinel.txt"]
    assert sandbox.server_pid == server and os.path.exists(f"/proc/{server}")  # parent survived
    assert _leftovers(sandbox) == []  # nothing left running
    assert len(result.stdout) <= sandbox.max_output and len(result.stderr) <= sandbox.max_output


def test_secrets_are_not_inherited(sandbox, monkeypatch):
    monkeypatch.setenv("ARL_TEST_SECRET", "hunter2")  # set after start: also check a fresh server
    fresh = Sandbox(timeout=TIMEOUT, memory_mb=MEM_MB)
    try:
        out = fresh.run("import os\nprint(dict(os.environ))").stdout
        assert "hunter2" not in out and "ARL_TEST_SECRET" not in out
        assert "'HOME'" in out
    finally:
        fresh.close()


def test_working_directory_is_fresh_and_removed(sandbox):
    first = sandbox.run("import os\nopen('scratch.txt', 'w').write('x')\nprint(os.getcwd())")
    second = sandbox.run("import os\nprint(os.getcwd(), os.listdir('.'))")
    assert first.status == second.status == "ok"
    workdir = first.stdout.strip()
    assert not os.path.exists(workdir)
    assert second.stdout.split()[1] == "[]"


def test_report_channel(sandbox):
    """``run(report=n)``: fd 3 carries up to n raw bytes apart from stdout; more is no report; without it fd 3
    is closed; a verify call after a reporting one is unaffected."""
    code = "import os\nprint('out')\nos.write(3, bytes([0, 255]) + b'{}' * {n})"
    small = sandbox.run(code.replace("{n}", "10"), report=64)
    assert small.status == "ok" and small.stdout == "out\n" and small.report == b"\x00\xff" + b"{}" * 10
    assert sandbox.run(code.replace("{n}", "40"), report=64).report is None
    plain = sandbox.run(code.replace("{n}", "1"))
    assert plain.report is None and "Bad file descriptor" in plain.last_error_line
    assert sandbox.verify("1/2", "0.5")


def test_file_size_limit(sandbox):
    result = sandbox.run("open('big.bin', 'wb').write(b'0' * (64 << 20))")
    assert result.status == "error" and "File too large" in result.last_error_line


def test_server_death_is_reported_and_recovered():
    """A server killed during a call: that call is a ``sandbox_error``, the next one gets a fresh server.

    (The kill comes while the call is in flight: a server already dead *before* a call is
    replaced silently, which is the next test.)
    """
    box = Sandbox(timeout=10, memory_mb=MEM_MB)
    try:
        server = box.server_pid if box.layers else None

        def kill_once_running():  # the call is in flight once the server has forked its child
            deadline = time.monotonic() + 10
            while not _leftovers(box) and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(server, signal.SIGKILL)

        killer = threading.Thread(target=kill_once_running)
        killer.start()
        result = box.run("import time\ntime.sleep(30)")
        killer.join()
        assert result.status == "sandbox_error" and result.elapsed < 10
        assert box.run("print(2)").stdout == "2\n" and box.server_pid != server
    finally:
        box.close()


def test_server_dead_between_calls_is_replaced():
    box = Sandbox(timeout=TIMEOUT, memory_mb=MEM_MB)
    try:
        server = box.server_pid if box.layers else None
        os.kill(server, signal.SIGKILL)
        while Path(f"/proc/{server}/stat").read_text().split(")")[1].split()[0] != "Z":
            time.sleep(0.01)  # dead (a zombie until the client reaps it)
        assert box.run("print(2)").stdout == "2\n" and box.server_pid != server
    finally:
        box.close()


# --- kernel layers alone (audit hook off): what holds if the Python layer is bypassed ---------------
@pytest.fixture(scope="module")
def raw_sandbox():
    box = Sandbox(timeout=TIMEOUT, memory_mb=MEM_MB, audit_hook=False)
    assert box.layers["preloaded"]
    yield box
    box.close()


def test_kernel_network_namespace(raw_sandbox):
    if not raw_sandbox.layers["netns"]:
        pytest.skip(f"network namespace unavailable: {raw_sandbox.layers['netns_error']}")
    result = raw_sandbox.run("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)")
    # seccomp allows no socket family; behind it, Landlock's TCP rules and the empty namespace
    assert result.status == "error"
    assert "Address family not supported" in result.last_error_line, result.last_error_line


def test_kernel_process_limit(raw_sandbox):
    if raw_sandbox.layers["rlimit_nproc"] != "enforced":
        pytest.skip("RLIMIT_NPROC does not apply to root without a uid drop")
    result = raw_sandbox.run("import os\nwhile True:\n    os.fork()")
    # seccomp refuses before RLIMIT_NPROC (which answers BlockingIOError) is even consulted
    assert result.status == "error"
    assert result.last_error_line.startswith(("PermissionError", "BlockingIOError")), result.last_error_line
    assert _leftovers(raw_sandbox) == []


def test_kernel_uid_drop_protects_host(raw_sandbox, outside):
    if not raw_sandbox.layers["uid_drop"]:
        pytest.skip("not running as root: no uid drop")
    code = (f"import os\ntry:\n    os.kill({os.getpid()}, 9)\nexcept PermissionError:\n    print('kill denied')\n"
            f"try:\n    open('{outside}/sentinel.txt', 'w')\nexcept OSError:\n    print('write denied')")
    result = raw_sandbox.run(code)
    assert result.stdout.split("\n")[:2] == ["kill denied", "write denied"]
    assert (outside / "sentinel.txt").read_text() == "untouched"


# --- the same containment through the env -------------------------------------------------------
@pytest.mark.parametrize("code,needle", [
    ("while True:\n    pass", "interpreter timeout"),
    ("x = bytearray(10**11)", "memory limit"),
    ("import os\nos.kill(os.getppid(), 9)", "os.kill is not allowed"),
    ("print('y' * 10**7)", "output limit exceeded"),
])
def test_env_reports_hostile_code(sandbox, code, needle):
    env = TIRMathEnv(sandbox=sandbox, timeout=TIMEOUT, memory_mb=MEM_MB)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(f"Let me try.\n```python\n{code}\n```")
    assert obs.startswith("\nCode execution result: ") and needle in obs
    assert len(obs) <= env.max_output_chars + 120
    assert (reward, terminated, truncated) == (0.0, False, False) and info["action_is_valid"]
    obs, *_ = env.step("```python\nprint(6 * 7)\n```")  # the tool still works afterwards
    assert obs == "\nCode execution result: 42\n"


def test_observation_has_no_control_characters():
    """Terminal escapes, carriage returns and NULs from a program never reach the policy or the logs."""
    from arena_envs.tirmath import ExecResult

    env = TIRMathEnv(timeout=TIMEOUT, memory_mb=MEM_MB)
    ok = ExecResult("ok", "a\x1b[31mb\rc\x00\td\x9b\n", "", 0, None, 0.0, 12)
    err = ExecResult("error", "", "Traceback\nValueError: \x1b]0;pwned\x07x\r\n", 1, None, 0.0, 40)
    assert env.format_result(ok) == "\nCode execution result: a[31mbc\td\n"
    assert env.format_result(err) == "\nCode execution result: ValueError: ]0;pwnedx\n"


def test_every_argument_rule_is_reached():
    """A number in the plain allow-list would be allowed before its argument rule is looked at."""
    from arena_envs.tirmath import _confine

    ruled = set(_confine._ARG_RULES) | set(_confine._SELF_ZERO.values()) | set(_confine._SELF_PID.values())
    assert ruled.isdisjoint(_confine._ALLOW.values())
    assert {41, 53, 16, 72, 28, 327, 328} <= ruled
    refused = {"flock", "mincore", "readahead", "fadvise64", "sysinfo", "statfs", "fstatfs", "sync_file_range",
               "pipe", "pipe2"}
    assert refused.isdisjoint(_confine._ALLOW)
