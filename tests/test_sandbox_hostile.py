"""Hostile programs against the TIR-Math sandbox, written by an attacker who has read ``_forkserver.py``.

Every program runs twice: as is (the Python audit hook on) and after switching the hook off
(``DISABLE_GUARD`` swaps its code object, found through ``gc``), so what is asserted here is
what the kernel boundary alone keeps true on the host: no file outside the work area created
or changed, modes unchanged, no process left, no connection made, other processes untouched,
the server answering the next call. A program prints ``ESCAPED`` when it gets something it
must not; that text must never come back.
"""

from __future__ import annotations

import hashlib
import os
import select
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from arena_envs.tirmath import Sandbox, _forkserver
from arena_envs.tirmath import sandbox as sandbox_module

TIMEOUT = 1.5
MEM_MB = 512
SECRET = "TOP-SECRET-7f3a"  # content of a root-only file on the host
GOLD = "GOLD-4242-ANSWER"  # gold answer in a dataset file on the host

DISABLE_GUARD = '''
import gc as _gc, sys as _sys
for _f in _gc.get_objects():
    if type(_f).__name__ == "function" and _f.__name__ == "hook" and "read_ok" in _f.__code__.co_freevars:
        _fv = _f.__code__.co_freevars
        _ns = {}
        exec("def _outer():\\n" + "".join(f"    {v} = 0\\n" for v in _fv)
             + "    def hook(event, args):\\n        return (" + ", ".join(_fv) + ",)\\n    return hook\\n", _ns)
        _f.__code__ = _ns["_outer"]().__code__
for _m in ("ctypes", "_ctypes", "socket", "_socket", "resource", "fcntl", "mmap", "_posixsubprocess"):
    _sys.modules.pop(_m, None)
'''

LIBC = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"

# The dir_fd trick: the hook resolves a relative path against the cwd, the kernel against dir_fd.
DIR_FD_READ = '''
import os
base = os.path.dirname(os.__file__)
os.makedirs("/".join(["d"] * 40))
os.symlink(os.path.abspath("/".join(["d"] * 40)), "json")
fd = os.open(base, os.O_RDONLY)
rel = "json/" + "../" * 30 + "{secret}".lstrip("/")
print("ESCAPED" if "TOP-SECRET" in os.read(os.open(rel, os.O_RDONLY, dir_fd=fd), 100).decode() else "no")
'''

# (category, name, program, expected status or None for any)
PROGRAMS = [
    ("processes", "ctypes_fork_sleeper",
     LIBC + "import time\npid = libc.fork()\nif pid == 0:\n    time.sleep(60)\nprint('ESCAPED' if pid > 0 else 'no')",
     None),
    ("processes", "daemonize", "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
     "        time.sleep(60)\n    os._exit(0)\nprint('ESCAPED')", None),
    ("processes", "subprocess_shell", "import subprocess\nsubprocess.run(['sh', '-c', 'touch {outside}/pwned'])\n"
     "print('ESCAPED')", "error"),
    ("processes", "clear_parent_death_signal", LIBC + "print('ESCAPED' if libc.prctl(1, 0, 0, 0, 0) == 0 else 'no')",
     None),
    ("memory", "huge_allocation", "x = bytearray(10**11)", "memory"),
    ("memory", "anonymous_mmap", "import mmap\nm = mmap.mmap(-1, 1 << 36)\nprint('ESCAPED')", "error"),
    ("time", "ignore_cpu_signal", "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass",
     "timeout"),
    ("time", "sleep", "import time\ntime.sleep(60)", "timeout"),
    ("output", "flood", "import sys\nwhile True:\n    sys.stdout.write('x' * 1000000)", "output_limit"),
    ("output", "control_characters",
     "import sys\nsys.stdout.buffer.write(b'\\x1b[2J\\x1b]0;t\\x07\\r\\x00\\xff\\xfeok\\n')", "ok"),
    ("files", "read_secret", "print('ESCAPED' if 'TOP-SECRET' in open('{secret}').read() else 'no')", "error"),
    ("files", "read_secret_dir_fd", DIR_FD_READ, "error"),
    ("files", "read_shadow", "print('ESCAPED', open('/etc/shadow').read()[:20])", "error"),
    ("files", "write_outside", "open('{outside}/sentinel.txt', 'w').write('pwned')", "error"),
    ("files", "create_in_tmp", "open('{hosttmp}/pwned', 'w').write('x')\nprint('ESCAPED')", "error"),
    ("files", "nested_1200_dirs", "import os\nfor _ in range(1200):\n    os.mkdir('d')\n    os.chdir('d')\n"
     "print('made')", "ok"),
    ("files", "fill_work_area", "n = 0\nwhile n < 100:\n    open(f'f{{n}}', 'wb').write(b'0' * (1 << 20))\n    n += 1",
     None),
    ("paths_links", "remove_own_workdir", "import os\nos.rmdir(os.getcwd())\nprint('removed')", None),
    ("paths_links", "workdir_replaced_by_symlink", "import os\ncwd = os.getcwd()\nos.rmdir(cwd)\n"
     "os.symlink('{outside}/sentinel.txt', cwd)\nprint('swapped')", None),
    ("paths_links", "unreadable_subtree", "import os\nos.makedirs('a/b/c')\nopen('a/b/c/f', 'w').write('x')\n"
     "os.chmod('a/b', 0)\nos.chmod('a', 0)\nprint('locked')", "ok"),
    ("paths_links", "symlink_then_write", "import os\nos.symlink('{outside}/sentinel.txt', 'l')\n"
     "open('l', 'w').write('pwned')", "error"),
    ("paths_links", "hardlink_secret", "import os\nos.link('{secret}', 'h')\nprint('ESCAPED', open('h').read())",
     "error"),
    ("privileges", "capabilities_left", LIBC + "hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)\n"
     "data = (ctypes.c_uint32 * 6)()\nlibc.capget(hdr, data)\nprint('ESCAPED' if any(data) else 'none')", None),
    ("privileges", "no_new_privs_unset", LIBC + "print('ESCAPED' if libc.prctl(39, 0, 0, 0, 0) != 1 else 'set')",
     None),
    ("privileges", "setuid_root", "import os\nwas = os.getuid()\nos.setuid(0)\nprint('ESCAPED' if was else 'root')",
     None),
    ("privileges", "new_namespaces", LIBC + "print('ESCAPED' if libc.unshare(0x10000000 | 0x20000) == 0 else 'no')",
     None),
    ("network_sockets", "tcp_to_host", "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
     "print('ESCAPED')", "error"),
    ("network_sockets", "unix_socket_on_host", "import socket\ns = socket.socket(socket.AF_UNIX)\n"
     "s.connect('{unix_path}')\nprint('ESCAPED')", "error"),
    ("network_sockets", "abstract_unix_socket", "import socket\ns = socket.socket(socket.AF_UNIX)\n"
     "s.connect('\\0{abstract}')\nprint('ESCAPED')", "error"),
    ("network_sockets", "raw_socket", "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_RAW, 1)\n"
     "print('ESCAPED')", "error"),
    ("server_introspection", "kill_server", "import os\nos.kill(os.getppid(), 9)\nprint('ESCAPED')", "error"),
    ("server_introspection", "server_environ", "import os\nprint('ESCAPED', open(f'/proc/{{os.getppid()}}/environ')"
     ".read()[:10])", "error"),
    ("server_introspection", "ptrace_server", LIBC + "import os\n"
     "print('ESCAPED' if libc.ptrace(16, os.getppid(), 0, 0) == 0 else 'no')", None),
    ("server_introspection", "signal_other_nobody_process", "import os\nos.kill({victim}, 9)\nprint('ESCAPED')",
     "error"),
    # round three: host processes, IPC, other socket families, inotify, deep trees
    ("host_processes", "prlimit_victim", LIBC + "lim = (ctypes.c_ulong * 2)(0, 0)\n"
     "print('ESCAPED' if libc.prlimit({victim}, 0, lim, None) == 0 else 'no')", None),
    ("host_processes", "prlimit_zygote", LIBC + "lim = (ctypes.c_ulong * 2)(1, 1)\n"
     "print('ESCAPED' if libc.prlimit(1, 7, lim, None) == 0 else 'no')", None),
    ("host_processes", "renice_victim", LIBC + "print('ESCAPED' if libc.setpriority(0, {victim}, 19) == 0 else 'no')",
     None),
    ("host_processes", "renice_own_uid", LIBC + "print('ESCAPED' if libc.setpriority(2, 0, 19) == 0 else 'no')", None),
    ("host_processes", "pin_victim", LIBC + "mask = ctypes.c_ulong(1)\n"
     "print('ESCAPED' if libc.sched_setaffinity({victim}, 8, ctypes.byref(mask)) == 0 else 'no')", None),
    ("host_processes", "idle_victim", LIBC + "param = ctypes.c_int(0)\n"
     "print('ESCAPED' if libc.sched_setscheduler({victim}, 5, ctypes.byref(param)) == 0 else 'no')", None),
    ("host_processes", "ioprio_victim",
     LIBC + "print('ESCAPED' if libc.syscall(251, 1, {victim}, 7 << 13) == 0 else 'no')", None),
    ("host_processes", "capget_host", LIBC + "hdr = (ctypes.c_uint32 * 2)(0x20080522, {host_pid})\n"
     "data = (ctypes.c_uint32 * 6)()\nprint('ESCAPED' if libc.capget(hdr, data) == 0 else 'no')", None),
    ("host_processes", "session_of_host", LIBC + "print('ESCAPED' if libc.getsid({host_pid}) >= 0 else 'no')", None),
    ("host_processes", "probe_victim", LIBC + "print('ESCAPED' if libc.kill({victim}, 0) == 0 else 'no')", None),
    ("host_processes", "signal_init", LIBC + "libc.kill(1, 9)\nlibc.kill(-1, 9)\nprint('still here')", None),
    ("host_processes", "change_ids", LIBC + "print('ESCAPED' if libc.setresuid(0, 0, 0) == 0 else 'no')", None),
    ("ipc", "sysv_shm_create", LIBC + "ids = [libc.shmget(0, 4 << 20, 0o1666) for _ in range(24)]\n"
     "print('ESCAPED' if max(ids) >= 0 else 'no')", None),
    ("ipc", "sysv_host_segment", LIBC + "print('ESCAPED' if libc.shmget({shm_key}, 0, 0) >= 0 else 'no')", None),
    ("ipc", "sysv_msg_queue", LIBC + "print('ESCAPED' if libc.msgget(0x5EED, 0o1666) >= 0 else 'no')", None),
    ("ipc", "sysv_semaphore", LIBC + "print('ESCAPED' if libc.semget(0x5EED, 1, 0o1666) >= 0 else 'no')", None),
    ("ipc", "posix_mqueue", LIBC + "print('ESCAPED' if libc.syscall(240, b'arl-mq', 0o102, 0o600, None) >= 0 "
     "else 'no')", None),
    ("network_sockets", "udp_to_host_loopback", "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
     "s.sendto(b'x', ('127.0.0.1', {udp_port}))\nprint('ESCAPED')", "error"),
    ("network_sockets", "netlink_sock_diag", "import socket\nsocket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4)\n"
     "print('ESCAPED')", "error"),
    ("network_sockets", "vsock", "import socket\nsocket.socket(40, socket.SOCK_STREAM)\nprint('ESCAPED')", "error"),
    ("files", "inotify_host_files", LIBC + "print('ESCAPED' if libc.inotify_init() >= 0 else 'no')", None),
    ("files", "deep_rename_chain", "import os\nos.mkdir('a')\nfor _ in range(2500):\n    os.mkdir('b')\n"
     "    os.rename('a', 'b/a')\n    os.rename('b', 'a')\nprint('deep')", None),
    # round four: syscall arguments (socket families, file locks, page-cache probes, ioctl), x32 numbers, host facts
    ("syscall_arguments", "socketpair_inet", LIBC + "fds = (ctypes.c_int * 2)()\n"
     "ok = libc.socketpair(2, 1, 0, fds) == 0 or ctypes.get_errno() == 95\n"  # EOPNOTSUPP: an inet socket was made
     "print('ESCAPED' if ok else 'no')", None),
    ("syscall_arguments", "socketpair_netlink_vsock", LIBC + "fds = (ctypes.c_int * 2)()\n"
     "made = [f for f in (16, 40, 10) if libc.socketpair(f, 2, 0, fds) == 0 or ctypes.get_errno() == 95]\n"
     "print('ESCAPED' if made else 'no')", None),
    ("between_calls", "inode_counter", LIBC + "import os\nmade = []\ntry:\n    os.pipe()\n    made.append('pipe')\n"
     "except OSError:\n    pass\nfds = (ctypes.c_int * 2)()\nif libc.socketpair(1, 1, 0, fds) == 0:\n"
     "    made.append('unix socketpair')\nif libc.socket(1, 1, 0) >= 0:\n    made.append('unix socket')\n"
     "print('ESCAPED' if made else 'no', made)", None),
    ("syscall_arguments", "flock_host_file", LIBC + "import os\nfd = os.open(os.__file__, os.O_RDONLY)\n"
     "print('ESCAPED' if libc.flock(fd, 1 | 4) == 0 else 'no')", None),
    ("syscall_arguments", "fcntl_lock_host_file", LIBC + "import os, struct\nfd = os.open(os.__file__, os.O_RDONLY)\n"
     "lk = ctypes.create_string_buffer(struct.pack('hhqqi', 0, 0, 0, 0, 0), 32)\n"
     "got = [cmd for cmd in (6, 7, 37, 38, 5, 36) if libc.fcntl(fd, cmd, lk) == 0]\n"
     "print('ESCAPED' if got else 'no', got)", None),
    ("syscall_arguments", "dnotify_host_dir", LIBC + "import os\n"
     "fd = os.open(os.path.dirname(os.__file__), os.O_RDONLY)\n"
     "print('ESCAPED' if libc.fcntl(fd, 1026, ctypes.c_uint(1 | 0x80000000)) == 0 else 'no')", None),
    ("syscall_arguments", "fs_ioctl_host_file", LIBC + "import os\nfd = os.open(os.__file__, os.O_RDONLY)\n"
     "flags = ctypes.c_long(0)\nprint('ESCAPED' if libc.ioctl(fd, 0x80086601, ctypes.byref(flags)) == 0 else 'no')",
     None),
    ("page_cache", "fadvise_dontneed", LIBC + "import os\nfd = os.open(os.__file__, os.O_RDONLY)\n"
     "print('ESCAPED' if libc.syscall(221, fd, 0, 0, 4) == 0 else 'no')", None),
    ("page_cache", "readahead", LIBC + "import os\nfd = os.open(os.__file__, os.O_RDONLY)\n"
     "print('ESCAPED' if libc.syscall(187, fd, 0, 4096) == 0 else 'no')", None),
    ("page_cache", "mincore", LIBC + "import os\nlibc.mmap.restype = ctypes.c_void_p\n"
     "fd = os.open(os.__file__, os.O_RDONLY)\naddr = libc.mmap(None, 4096, 1, 2, fd, 0)\n"
     "vec = ctypes.create_string_buffer(1)\n"
     "print('ESCAPED' if libc.mincore(ctypes.c_void_p(addr), 4096, vec) == 0 else 'no')", None),
    ("page_cache", "cachestat", LIBC + "import os\nfd = os.open(os.__file__, os.O_RDONLY)\n"
     "rng = (ctypes.c_uint64 * 2)(0, 0)\nst = (ctypes.c_uint64 * 8)()\n"
     "print('ESCAPED' if libc.syscall(451, fd, rng, st, 0) == 0 else 'no')", None),
    ("page_cache", "preadv2_nowait", "import os\nfd = os.open(os.__file__, os.O_RDONLY)\nbuf = bytearray(64)\n"
     "try:\n    os.preadv(fd, [buf], 0, os.RWF_NOWAIT)\n    print('ESCAPED')\nexcept OSError as e:\n"
     "    print('no', e.errno)\nprint(os.preadv(fd, [buf], 0) == 64)", None),
    ("page_cache", "madvise_willneed_pageout", LIBC + "import os\nlibc.mmap.restype = ctypes.c_void_p\n"
     "fd = os.open(os.__file__, os.O_RDONLY)\naddr = libc.mmap(None, 4096, 1, 2, fd, 0)\n"
     "got = [a for a in (3, 20, 21, 12) if libc.madvise(ctypes.c_void_p(addr), 4096, a) == 0]\n"
     "print('ESCAPED' if got else 'no', got)", None),
    ("syscall_arguments", "x32_numbers", LIBC + "got = [nr for nr in (39, 99, 102, 63) "
     "if libc.syscall(0x40000000 | nr, 0, 0, 0) >= 0]\nprint('ESCAPED' if got else 'no', got)", None),
    ("host_facts", "sysinfo", LIBC + "buf = ctypes.create_string_buffer(128)\n"
     "print('ESCAPED' if libc.sysinfo(buf) == 0 else 'no')", None),
    ("host_facts", "statvfs", "import os\nfor p in ('/usr', '.'):\n    try:\n        os.statvfs(p)\n"
     "        print('ESCAPED', p)\n    except OSError:\n        pass\nfd = os.open(os.__file__, os.O_RDONLY)\n"
     "try:\n    os.fstatvfs(fd)\n    print('ESCAPED fd')\nexcept OSError:\n    print('no')", None),
    ("reward_hacking", "read_dataset", "print(open('{dataset}').read())", "error"),
    ("reward_hacking", "read_project_source", "print('ESCAPED', open('{project_file}').read()[:10])", "error"),
]


def _snapshot(root: Path) -> dict:
    """Mode, owner and content hash of everything under ``root`` (iterative: any depth; links not followed)."""
    out, stack = {}, [root]
    while stack:
        p = stack.pop()
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else None
        out[str(p)] = (st.st_mode, st.st_uid, st.st_gid, digest)
        if stat.S_ISDIR(st.st_mode):
            stack.extend(p.iterdir())
    return out


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.append(int(entry))
    return kids


def _leftovers(server: int, zygote: int | None, netns: str) -> list[int]:
    """Processes of a finished call: descendants of the server, or members of its network namespace
    (when it has its own), other than the server and its zygote."""
    found, todo = set(), [server]
    while todo:
        kids = _children(todo.pop())
        found.update(kids)
        todo += kids
    if netns != os.readlink("/proc/self/ns/net"):
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/net") == netns:
                    found.add(int(entry))
            except OSError:
                continue
    return sorted(found - {server, zygote})


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _process_state(pid: int) -> tuple:
    """What another process could change about ``pid``: limits, nice value, policy, affinity."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return Path(f"/proc/{pid}/limits").read_text(), fields[16], fields[38], sorted(os.sched_getaffinity(pid))


def _ipc_state(ours: set[int]) -> tuple:
    """The host's SysV IPC objects, less shared memory made by a live process other than ``ours``: another
    run of this suite on the machine makes and removes its own host segment whenever it starts or ends, which
    is no change made by a program here (whose processes are all dead when this is read)."""
    header, *rows = Path("/proc/sysvipc/shm").read_text().splitlines()
    foreign = [r for r in rows if int(r.split()[4]) not in ours and os.path.exists(f"/proc/{r.split()[4]}")]
    shm = [header] + [r for r in rows if r not in foreign]  # columns: key shmid perms size cpid ...
    return tuple(shm), Path("/proc/sysvipc/msg").read_text(), Path("/proc/sysvipc/sem").read_text()


def _host_shm_segment() -> tuple[int, int]:
    """A 0666 SysV segment on the host (key, id): no program may reach it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x4152_0000 | (os.getpid() & 0xFFFF)
    shmid = libc.shmget(key, 4096, 0o1666)
    assert shmid >= 0, os.strerror(ctypes.get_errno())
    return key, shmid


def _remove_shm(shmid: int) -> None:
    import ctypes

    ctypes.CDLL(None).shmctl(shmid, 0, None)  # IPC_RMID


def _start(hosttmp: Path, timeout: float, **kwargs) -> Sandbox:
    """A started sandbox whose server's temp base is ``hosttmp`` (watched for changes, not the shared /tmp)."""
    saved, tempfile.tempdir = tempfile.tempdir, str(hosttmp)
    box = Sandbox(timeout=timeout, memory_mb=MEM_MB, margin=5.0, **kwargs)
    try:
        assert box.layers["preloaded"]  # starts the server while the temp base is hosttmp
    finally:
        tempfile.tempdir = saved
    return box


def _remove_leftovers(directory: Path) -> None:
    """Remove what runs left in ``directory`` with the server's own deep-tree-safe removal. A run killed
    with its server, or one whose janitor had not finished, may leave the 2,500-level rename chain here,
    and pytest's later clean-up of old temp folders (a recursive ``rmtree``) fails on it."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in os.listdir(fd):
            _forkserver._remove_tree(fd, name)
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """The host side an attacker aims at: files, a private temp base, listening sockets, a victim process."""
    outside = tmp_path_factory.mktemp("outside")
    (outside / "sentinel.txt").write_text("untouched")
    (outside / "sentinel.txt").chmod(0o600)
    (outside / "secret.txt").write_text(SECRET)
    (outside / "secret.txt").chmod(0o600)
    (outside / "data.jsonl").write_text(f'{{"question": "2+2?", "answer": "{GOLD}"}}\n')
    hosttmp = tmp_path_factory.mktemp("hosttmp")  # the server's temp base: mode must survive
    hosttmp.chmod(0o1777)
    sockdir = Path(tempfile.mkdtemp(prefix="arl-sock-"))  # short path (AF_UNIX limit)
    sockdir.chmod(0o777)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(sockdir / "s"))
    os.chmod(sockdir / "s", 0o777)
    unix.listen(4)
    abstract = f"arl-sbx-test-{os.getpid()}"
    abstract_sock = socket.socket(socket.AF_UNIX)
    abstract_sock.bind("\0" + abstract)
    abstract_sock.listen(4)
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(4)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    shm_key, shmid = _host_shm_segment()
    victim = subprocess.Popen(["sleep", "600"], user=65534 if os.geteuid() == 0 else None)
    box = _start(hosttmp, timeout=TIMEOUT)
    fields = {"outside": outside, "secret": outside / "secret.txt", "dataset": outside / "data.jsonl",
              "hosttmp": hosttmp, "unix_path": sockdir / "s", "abstract": abstract, "port": tcp.getsockname()[1],
              "victim": victim.pid, "project_file": Path(__file__).resolve(), "host_pid": os.getpid(),
              "udp_port": udp.getsockname()[1], "shm_key": shm_key}
    yield {"box": box, "fields": fields, "listeners": (unix, abstract_sock, tcp, udp), "victim": victim,
           "watched": (outside, hosttmp, sockdir)}
    box.close()
    _remove_shm(shmid)
    udp.close()
    victim.kill()
    victim.wait()
    for s in (unix, abstract_sock, tcp):
        s.close()
    for p in sockdir.iterdir():
        p.unlink()
    sockdir.rmdir()
    _remove_leftovers(hosttmp)
    assert list(hosttmp.iterdir()) == []


def _host_state(host, box: Sandbox) -> dict:
    state = {}
    for root in host["watched"]:
        state.update(_snapshot(root))
    state["ipc"] = _ipc_state({os.getpid(), box.server_pid, box.zygote_pid})
    for pid in (host["victim"].pid, os.getpid(), box.server_pid, box.zygote_pid):
        state[f"process {pid}"] = _process_state(pid)
    state["server fds"] = sorted(os.listdir(f"/proc/{box.server_pid}/fd"))
    return state


def _wait_removed(hosttmp: Path) -> list[Path]:
    """What is left in the server's temp base once its janitor is done (fallback levels remove a run's
    directory after the reply; a deep tree takes seconds on slow file systems)."""
    deadline = time.monotonic() + 60
    while list(hosttmp.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return list(hosttmp.iterdir())


def _check_host_unchanged(host, box: Sandbox, before: dict, server: int, netns: str) -> None:
    zygote = box.zygote_pid
    _wait_removed(host["fields"]["hosttmp"])
    deadline = time.monotonic() + 5
    while _leftovers(server, zygote, netns) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _leftovers(server, zygote, netns) == [], "a process of the program is still running"
    after = _host_state(host, box)
    for key in before:
        assert after[key] == before[key], f"{key} changed"
    for s in host["listeners"]:
        assert not select.select([s], [], [], 0)[0], "a connection or datagram reached a host socket"
    assert host["victim"].poll() is None, "another process of the host was signalled"
    assert box.server_pid == server and os.path.exists(f"/proc/{server}")
    assert box.run("print('alive')").stdout == "alive\n"  # the next call answers


@pytest.mark.parametrize("guard", ["guarded", "unguarded"])
@pytest.mark.parametrize("category,name,program,status", PROGRAMS, ids=[f"{p[0]}-{p[1]}" for p in PROGRAMS])
def test_hostile_program(host, guard, category, name, program, status):
    _attack(host, host["box"], guard, program, status)


#: the time and flood programs only repeat the rlimit/timeout checks above (host Unix sockets with a path, nameable
#: without a mount namespace, are covered: the filter refuses every socket)
_NOT_AT_LANDLOCK = ("ignore_cpu_signal", "sleep", "flood")


@pytest.fixture(scope="module")
def landlock_box(host):
    box = _start(host["fields"]["hosttmp"], TIMEOUT, max_boundary="landlock")
    if box.boundary != "landlock":
        box.close()
        pytest.skip(f"Landlock level unavailable here: {box.layers['fallback']}")
    yield box
    box.close()


@pytest.mark.parametrize("category,name,program,status", [p for p in PROGRAMS if p[1] not in _NOT_AT_LANDLOCK],
                         ids=[f"{p[0]}-{p[1]}" for p in PROGRAMS if p[1] not in _NOT_AT_LANDLOCK])
def test_hostile_program_at_landlock_level(host, landlock_box, category, name, program, status):
    """The fallback without a mount namespace, guard switched off: the same host invariants hold."""
    _attack(host, landlock_box, "unguarded", program, None)
    assert _wait_removed(host["fields"]["hosttmp"]) == []  # the run's directories are gone, whatever it did


def _attack(host, box: Sandbox, guard: str, program: str, status: str | None) -> None:
    fields = host["fields"]
    server = box.server_pid
    netns = os.readlink(f"/proc/{server}/ns/net")
    code = (DISABLE_GUARD if guard == "unguarded" else "") + program.format(**fields)
    before = _host_state(host, box)
    start = time.monotonic()
    result = box.run(code)
    assert time.monotonic() - start <= TIMEOUT + box.margin
    text = result.stdout + result.stderr  # (stderr tracebacks quote the source, hence ESCAPED on stdout only)
    assert "ESCAPED" not in result.stdout and SECRET not in text and GOLD not in text, text[-500:]
    if status is not None:
        assert result.status == status, (result.status, result.stderr[-300:])
    _check_host_unchanged(host, box, before, server, netns)


#: every string a program can reach through Python objects (argv, environment, sys.path, module namespaces, code
#: file names), /proc/self/cmdline and uname: none may name the project's source tree, the host's temp base (where the
#: program does not work in it) or the host's name. Needles are built at run time: constants would be found.
HOST_NAMES = """import gc, os, sys, types


def scan():
    needle, hosttmp = chr(47) + "arena_envs", {hosttmp_rev!r}[::-1]
    at_host = os.getcwd().startswith(hosttmp)  # the landlock level works in the host's temp base by design

    def bad(s):
        return type(s) is str and s.startswith("/") and (needle + "/" in s or s.endswith(needle)
                                                         or (not at_host and hosttmp in s))

    found = [s for s in sys.argv + sys.orig_argv + sys.path + list(os.environ.values()) if bad(s)]
    for o in gc.get_objects():
        t = type(o)
        if t is dict:
            found += [s for s in o.values() if bad(s)] + [s for s in o if bad(s)]
        elif t is list or t is tuple:
            found += [s for s in o if bad(s)]
        elif t is types.FunctionType and bad(o.__code__.co_filename):
            found.append(o.__code__.co_filename)
    try:
        found.append(open("/proc/self/cmdline").read())
    except OSError:
        pass
    if not at_host and os.uname().nodename == {hostname_rev!r}[::-1]:
        found.append("the host's name")
    return sorted(set(found))


found = scan()
print("ESCAPED" if found else "no", found[:5])
"""


@pytest.mark.parametrize("level", ["namespace", "landlock"])
def test_no_host_names_reach_the_program(host, landlock_box, level):
    box = host["box"] if level == "namespace" else landlock_box
    fields = {"hosttmp_rev": str(host["fields"]["hosttmp"])[::-1], "hostname_rev": socket.gethostname()[::-1]}
    result = box.run(DISABLE_GUARD + HOST_NAMES.format(**fields), timeout=20)
    assert result.status == "ok" and result.stdout.startswith("no []"), (result.stdout, result.stderr[-300:])


DEEP_CHAIN = next(p[2] for p in PROGRAMS if p[1] == "deep_rename_chain")


def test_closing_a_server_removes_every_call_directory(tmp_path):
    """Fallback level: ``close`` right after a deep-tree call and a plain one leaves nothing in the temp base (the
    janitor drains before the server exits)."""
    base = tmp_path / "base"
    base.mkdir()
    box = _start(base, timeout=20, max_boundary="landlock")
    try:
        if box.boundary != "landlock":
            pytest.skip(f"Landlock level unavailable here: {box.layers['fallback']}")
        assert box.run(DISABLE_GUARD + DEEP_CHAIN).stdout == "deep\n"
        assert box.run("open('f', 'w').write('x')").status == "ok"
        box.close()
        assert list(base.iterdir()) == []
    finally:
        box.close()
        _remove_leftovers(base)


def test_guard_is_really_off_in_unguarded_runs(host):
    """The unguarded variant must actually reach the kernel layers (else the suite proves nothing)."""
    result = host["box"].run(DISABLE_GUARD + "import ctypes, socket\nopen('/dev/null').close()\nprint('hook off')")
    assert result.stdout == "hook off\n", result.stderr[-300:]


def test_control_characters_never_reach_output(host):
    result = host["box"].run("import sys\nsys.stdout.buffer.write(b'a\\x1b[2J\\rb\\x00c\\x07\\xc2\\x9b\\td\\n\\xff')")
    assert result.stdout == "a[2Jbc\td\n\ufffd"


@pytest.mark.parametrize("level", ["namespace", "landlock"])
def test_children_die_with_a_killed_server(host, level):
    """The program tries to clear its parent-death signal and change its ids, then the server is SIGKILLed
    mid-run: the zygote and every child die with it."""
    box = _start(host["fields"]["hosttmp"], timeout=20, max_boundary=level)
    try:
        if box.boundary != level:
            pytest.skip(f"{level} level unavailable here: {box.layers['fallback']}")
        server, zygote = box.server_pid, box.zygote_pid
        netns = os.readlink(f"/proc/{server}/ns/net")
        code = DISABLE_GUARD + LIBC + "libc.prctl(1, 0, 0, 0, 0)\nlibc.setresuid(0, 0, 0)\nimport time\ntime.sleep(60)"

        running = [zygote]

        def kill_once_running():  # the program is running once the server has a descendant besides the zygote
            deadline = time.monotonic() + 10
            while not _leftovers(server, zygote, netns) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)  # let it try first
            running.extend(_leftovers(server, zygote, netns))
            os.kill(server, signal.SIGKILL)

        killer = threading.Thread(target=kill_once_running)
        killer.start()
        result = box.run(code)
        killer.join()
        assert result.status == "sandbox_error" and len(running) > 1
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in running) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in running), "the zygote or the program outlived the server"
        assert box.run("print(3)").stdout == "3\n"
    finally:
        box.close()


def test_env_program_cannot_read_the_gold_answer(host):
    """Reward hacking through the env: the dataset file is not visible, the reward stays 0."""
    from arena_envs.tirmath import TIRMathEnv

    dataset = host["fields"]["dataset"]
    env = TIRMathEnv(data=str(dataset), sandbox=host["box"], timeout=TIMEOUT, memory_mb=MEM_MB)
    env.reset(seed=0)
    for code in (f"print(open('{dataset}').read())", DISABLE_GUARD + f"print(open('{dataset}').read())"):
        obs, reward, terminated, *_ = env.step(f"```python\n{code}\n```")
        assert GOLD not in obs and reward == 0.0 and not terminated


@pytest.mark.parametrize("level", ["landlock", "none"])
def test_degraded_boundary_is_reported_once(host, caplog, monkeypatch, level):
    monkeypatch.setattr(sandbox_module, "_REPORTED", set())
    boxes = [_start(host["fields"]["hosttmp"], TIMEOUT, max_boundary=level) for _ in range(2)]
    try:
        reached = boxes[0].boundary
        assert reached in ("landlock", "none") and boxes[1].boundary == reached
        assert boxes[0].layers["fallback"]  # says why
        warnings = [r for r in caplog.records if "sandbox boundary" in r.getMessage()]
        assert len(warnings) == 1 and repr(reached) in warnings[0].getMessage()
        assert boxes[0].run("print(6 * 7)").stdout == "42\n"
    finally:
        for box in boxes:
            box.close()


def test_full_boundary_here(host):
    """Where the kernel allows it (root or user namespaces, as in CI) the full level is in force."""
    layers = host["box"].layers
    if layers["boundary"] != "namespace":
        pytest.skip(f"full boundary unavailable: {layers['fallback']}")
    assert layers["netns"] and layers["mountns"] and layers["capabilities"]


def test_unknown_boundary_is_rejected():
    with pytest.raises(ValueError, match="max_boundary"):
        Sandbox(max_boundary="chroot")


def _memory_count(pid: int, needle: bytes) -> int:
    """Occurrences of ``needle`` in the readable memory of process ``pid``."""
    hits = 0
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if "r" in perms and hi - lo < 1 << 30:
                try:
                    mem.seek(lo)
                    hits += mem.read(hi - lo).count(needle)
                except OSError:
                    continue
    return hits


def test_gold_answer_never_enters_the_server(host):
    """Every program is forked from the server: a gold answer in its memory would be inherited and readable."""
    box = host["box"]
    gold = "GOLD-" + "".join(reversed("REWSNA-9191"))  # built at run time: not a constant of this module
    assert box.verify(gold, gold) is not None
    assert box.verify("\\frac{1}{2}", "0.5") is True  # the private-bytes path works and the stream stays in sync
    assert _memory_count(box.server_pid, gold.encode()) == 0
    assert box.run("print(1)").stdout == "1\n"


def test_earlier_calls_never_enter_the_fork_source(host):
    """Children are forked from the zygote: it must never hold another call's code, output or answers."""
    box = host["box"]
    marker = "EPISODE-" + "".join(reversed("TUPTUO-5151"))  # built at run time: not a constant of this module
    assert box.run(f"print({marker!r} * 3)").stdout == marker * 3 + "\n"
    assert box.verify(marker, marker) is not None
    assert _memory_count(box.zygote_pid, marker.encode()) == 0
