"""Kernel confinement primitives for the TIR-Math fork server (stdlib + ctypes only, Linux).

Everything here is a raw syscall wrapper, so the server needs no extra package:

* ``build_jail``: a private mount namespace whose new root is a tmpfs holding read-only bind
  mounts of only the directories given (the Python installation, site-packages, system
  libraries) plus ``/dev/null``-like nodes, entered with ``pivot_root``; the host's old root
  is detached, so nothing else (dataset, project, ``/root``, sockets) has a name inside.
* ``mount_workdir`` / ``discard_workdir``: a fresh tmpfs per run, discarded with a lazy
  unmount -- clean-up never walks a path the program could have changed.
* ``drop_privileges``: empty bounding/ambient/effective sets, uid drop (file access as another uid where
  needed), ``no_new_privs``.
* ``Landlock``: file, TCP and signal/abstract-socket scoping for what namespaces leave.
* ``seccomp_filter``: deny by default -- an allow-list of the calls a Python program needs, with
  the process-targeting ones limited to the caller, file/ioctl/madvise commands and read/write flags
  checked, no sockets or pipes.
* ``enter_process_namespaces``: fresh PID and IPC namespaces for the processes forked next.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long
_LIBC.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
_LIBC.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x00020000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 4, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 22, 2
_CAP_VERSION_3 = 0x20080522
NR = {  # x86_64 syscall numbers (the seccomp filter and the Landlock calls are arch-specific)
    "pivot_root": 155, "landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446}


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _syscall(name: str, *args) -> int:
    return _check(_LIBC.syscall(NR[name], *args), name)


def is_x86_64() -> bool:
    return platform.machine() == "x86_64"


# --- namespaces and the jail ---------------------------------------------------------
def unshare(flags: int) -> None:
    _check(_LIBC.unshare(flags), "unshare")


def enter_process_namespaces() -> None:
    """Fresh PID and IPC namespaces: the next child forked is their init (pid 1), every later one
    lives inside; no host process has a pid there, and SysV/POSIX IPC objects stay inside."""
    unshare(CLONE_NEWPID | CLONE_NEWIPC)


def map_user_namespace(uid: int, gid: int) -> None:
    """Inside a fresh user namespace: become root of it (uid/gid map of the caller's ids)."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {gid} 1")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else os.fsencode(s) for s in (src, target, fstype, data)]
    _check(_LIBC.mount(enc[0], enc[1], enc[2], flags, enc[3]), f"mount {target}")


def _bind_readonly(src: str, dst: str, dev: bool = False) -> None:
    _mount(src, dst, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (0 if dev else MS_NODEV)
    _mount(None, dst, None, flags)


def _make_parents(root: str, path: str) -> str:
    """Create ``root + dirname(path)`` (mode 0755); return the full target path."""
    target = root + path
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    return target


def build_jail(stage: str, dirs: list[str], files: list[str], devices: list[str], workdir: str) -> None:
    """Enter a private mount namespace whose root shows only ``dirs``/``files``/``devices`` (read-only).

    ``stage`` is any existing directory; it only serves as the mount point of the new root's
    tmpfs inside the private namespace (the host never sees that mount). ``workdir`` is
    created empty in the new root (the per-run tmpfs is mounted on it later). On failure the
    caller sees the host's file system again: back in its original mount namespace, or (in a
    user namespace, where ``setns`` back is refused) with the staging tmpfs unmounted;
    ``RuntimeError`` if neither works, as a half-built view must not be used.
    """
    original = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        unshare(CLONE_NEWNS)
        try:
            _populate_and_pivot(stage, dirs, files, devices, workdir)
        except OSError:
            if _LIBC.setns(original, CLONE_NEWNS) != 0 and _LIBC.umount2(os.fsencode(stage), MNT_DETACH) != 0 \
                    and ctypes.get_errno() != errno.EINVAL:  # EINVAL: the staging tmpfs was never mounted
                raise RuntimeError("mount namespace half built and no way back") from None
            raise
    finally:
        os.close(original)


def _populate_and_pivot(stage: str, dirs: list[str], files: list[str], devices: list[str], workdir: str) -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # sources opened before the staging tmpfs hides ``stage`` (it may be an ancestor of one of them)
    sources = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in dirs + files + devices}
    try:
        _mount("tirsb-root", stage, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m,nr_inodes=4096")
        for d in dirs:
            target = _make_parents(stage, d)
            os.makedirs(target, mode=0o755, exist_ok=True)
            _bind_readonly(f"/proc/self/fd/{sources[d]}", target)
        for f in files + devices:
            target = _make_parents(stage, f)
            open(target, "w").close()
            _bind_readonly(f"/proc/self/fd/{sources[f]}", target, dev=f in devices)
    finally:
        for fd in sources.values():
            os.close(fd)
    for name in ("bin", "lib", "lib64", "sbin"):  # merged-/usr links, so /bin/sh-style paths resolve
        if os.path.islink("/" + name) and not os.path.lexists(f"{stage}/{name}"):
            os.symlink(os.readlink("/" + name), f"{stage}/{name}")
    os.makedirs(stage + workdir, mode=0o755)
    _mount(None, stage, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0755")
    os.chdir(stage)
    _syscall("pivot_root", b".", b".")  # new root over old: the old one is now stacked on "/"
    _check(_LIBC.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")


def mount_workdir(path: str, size: int, inodes: int, uid: int) -> None:
    """A fresh tmpfs owned by ``uid`` (mode 0700): the run's private working directory."""
    _mount("tirsb-work", path, "tmpfs", MS_NOSUID | MS_NODEV,
           f"mode=0700,uid={uid},gid={uid},size={size},nr_inodes={inodes}")


def discard_workdir(path: str) -> None:
    """Lazy unmount: whatever the run left (links, deep trees, odd modes) vanishes with the mount."""
    _check(_LIBC.umount2(os.fsencode(path), MNT_DETACH), f"umount {path}")


# --- privileges ----------------------------------------------------------------------
def set_parent_death_signal(sig: int) -> None:
    _LIBC.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def drop_privileges(uid: int | None, last_cap: int, fs_uid: int | None = None) -> None:
    """Empty every capability set (bounding and ambient included), change uid, set no_new_privs.

    ``fs_uid``: the uid file access is checked against when it must differ from ``uid`` (root's Python
    installation that ``uid`` cannot read): real and effective uid become ``uid`` -- so ``RLIMIT_NPROC``, which
    never binds the real uid 0, binds -- and only the file-system uid stays ``fs_uid``. That needs the saved uid
    to stay ``fs_uid`` too (``setfsuid`` without ``CAP_SETUID`` may only pick the real, effective or saved uid);
    the seccomp filter refuses every uid change, so it cannot be used afterwards.
    """
    for cap in range(last_cap + 1):
        _LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL for caps the kernel lacks: fine
    _LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid if fs_uid is None else fs_uid)
        if fs_uid is not None:
            _LIBC.setfsuid(fs_uid)
            if _LIBC.setfsuid(-1) != fs_uid:  # -1 changes nothing and returns the current one
                raise OSError(errno.EPERM, "setfsuid")
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    _check(_LIBC.capset(header, (ctypes.c_uint32 * 6)()), "capset")
    _check(_LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace/core of this process by its own uid


# --- Landlock ------------------------------------------------------------------------
_FS_READ = 1 | 4 | 8  # EXECUTE | READ_FILE | READ_DIR
_FS_FILE = 1 | 2 | 4 | (1 << 14) | (1 << 15)  # rights that apply to a file (EXECUTE..READ_FILE, TRUNCATE, IOCTL_DEV)
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}


def landlock_abi() -> int:
    """Landlock ABI version of this kernel (0: unavailable or not x86_64)."""
    if not is_x86_64():
        return 0
    ret = _LIBC.syscall(NR["landlock_create_ruleset"], None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    return max(0, int(ret))


def landlock_restrict(abi: int, read: list[str], write: list[str], write_files: list[str]) -> None:
    """Allow reading under ``read``, everything under ``write``; deny all other file access, TCP
    bind/connect (ABI >= 4), and signals/abstract sockets outside this domain (ABI >= 6)."""
    fs = _FS_BY_ABI[min(abi, 5)]
    net = 3 if abi >= 4 else 0
    scoped = 3 if abi >= 6 else 0
    attr = struct.pack("QQQ", fs, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = _syscall("landlock_create_ruleset", attr, len(attr), 0)
    try:
        for paths, access in ((read, _FS_READ), (write, fs), (write_files, _FS_FILE & fs)):
            for p in paths:
                fd = os.open(p, os.O_PATH | os.O_CLOEXEC)
                try:
                    rule = struct.pack("=Qi", access & fs if os.path.isdir(p) else access & _FS_FILE & fs, fd)
                    _syscall("landlock_add_rule", ruleset, 1, rule, 0)  # LANDLOCK_RULE_PATH_BENEATH
                finally:
                    os.close(fd)
        _syscall("landlock_restrict_self", ruleset, 0)
    finally:
        os.close(ruleset)


# --- seccomp ---------------------------------------------------------------------
#: Deny by default: a program may make only these calls (x86_64 numbers), plus those of ``_ARG_RULES`` and the
#: process-targeting ones below with the arguments they allow. Everything else -- new processes, exec, namespaces,
#: mounts, ptrace, SysV and POSIX message-queue IPC, inotify/fanotify, memfd, uid changes, capget, calls that act on
#: another process (priority, affinity, scheduler, io priority), bpf, io_uring, keyrings, file locks (``flock``),
#: page-cache probes (``mincore``, ``readahead``, ``fadvise64``, ``cachestat``, ``sync_file_range``) and host
#: facts (``sysinfo``, ``statfs``, ``fstatfs``, ``ustat``), and pipes and sockets of any family (EAFNOSUPPORT; each
#: new pipe or socket takes a number from the kernel's global inode counter, which a later call reads back: a channel
#: between calls; the child's pipes are made before the filter) -- answers EPERM (``clone3``: ENOSYS, so libc falls
#: back to ``clone``). x32 numbers (``nr | 0x40000000``) and other architectures are refused whatever the number.
_ALLOW = {
    "read": 0, "write": 1, "open": 2, "close": 3, "stat": 4, "fstat": 5, "lstat": 6, "poll": 7, "lseek": 8,
    "mmap": 9, "mprotect": 10, "munmap": 11, "brk": 12, "rt_sigaction": 13, "rt_sigprocmask": 14,
    "rt_sigreturn": 15, "pread64": 17, "pwrite64": 18, "readv": 19, "writev": 20, "access": 21,
    "select": 23, "sched_yield": 24, "mremap": 25, "msync": 26, "dup": 32, "dup2": 33, "pause": 34, "nanosleep": 35,
    "getitimer": 36, "alarm": 37, "setitimer": 38, "getpid": 39, "sendfile": 40, "connect": 42, "accept": 43,
    "sendto": 44, "recvfrom": 45, "sendmsg": 46, "recvmsg": 47, "shutdown": 48, "bind": 49, "listen": 50,
    "getsockname": 51, "getpeername": 52, "setsockopt": 54, "getsockopt": 55, "exit": 60, "wait4": 61, "uname": 63,
    "fsync": 74, "fdatasync": 75, "truncate": 76, "ftruncate": 77, "getdents": 78, "getcwd": 79, "chdir": 80,
    "fchdir": 81, "rename": 82, "mkdir": 83, "rmdir": 84, "creat": 85, "link": 86, "unlink": 87, "symlink": 88,
    "readlink": 89, "chmod": 90, "fchmod": 91, "chown": 92, "fchown": 93, "lchown": 94, "umask": 95,
    "gettimeofday": 96, "getrlimit": 97, "getrusage": 98, "times": 100, "getuid": 102, "getgid": 104,
    "geteuid": 107, "getegid": 108, "getppid": 110, "getpgrp": 111, "getgroups": 115, "getresuid": 118,
    "getresgid": 120, "rt_sigpending": 127, "rt_sigtimedwait": 128, "rt_sigsuspend": 130, "sigaltstack": 131,
    "utime": 132, "sched_get_priority_max": 146, "sched_get_priority_min": 147, "arch_prctl": 158, "setrlimit": 160,
    "gettid": 186, "getxattr": 191, "lgetxattr": 192, "fgetxattr": 193, "listxattr": 194, "llistxattr": 195,
    "flistxattr": 196, "time": 201, "futex": 202, "epoll_create": 213, "getdents64": 217, "set_tid_address": 218,
    "restart_syscall": 219, "timer_create": 222, "timer_settime": 223, "timer_gettime": 224,
    "timer_getoverrun": 225, "timer_delete": 226, "clock_gettime": 228, "clock_getres": 229, "clock_nanosleep": 230,
    "exit_group": 231, "epoll_wait": 232, "epoll_ctl": 233, "utimes": 235, "mbind": 237, "set_mempolicy": 238,
    "get_mempolicy": 239, "waitid": 247, "openat": 257, "mkdirat": 258, "fchownat": 260, "futimesat": 261,
    "newfstatat": 262, "unlinkat": 263, "renameat": 264, "linkat": 265, "symlinkat": 266, "readlinkat": 267,
    "fchmodat": 268, "faccessat": 269, "pselect6": 270, "ppoll": 271, "set_robust_list": 273, "splice": 275,
    "tee": 276, "vmsplice": 278, "utimensat": 280, "epoll_pwait": 281, "signalfd": 282, "timerfd_create": 283,
    "eventfd": 284, "fallocate": 285, "timerfd_settime": 286, "timerfd_gettime": 287, "accept4": 288,
    "signalfd4": 289, "eventfd2": 290, "epoll_create1": 291, "dup3": 292, "preadv": 295,
    "pwritev": 296, "recvmmsg": 299, "sendmmsg": 307, "getcpu": 309, "renameat2": 316, "seccomp": 317,
    "getrandom": 318, "membarrier": 324, "copy_file_range": 326, "pkey_mprotect": 329, "pkey_alloc": 330,
    "pkey_free": 331, "statx": 332, "rseq": 334, "close_range": 436, "openat2": 437, "faccessat2": 439,
    "epoll_pwait2": 441, "landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446,
    "futex_waitv": 449, "fchmodat2": 452, "futex_wake": 454, "futex_wait": 455, "futex_requeue": 456}
#: calls allowed only on the caller itself (first argument 0): limits, affinity, process group, session
_SELF_ZERO = {"getpgid": 121, "getsid": 124, "sched_getaffinity": 204, "prlimit64": 302}
#: signal calls allowed only towards the caller's own pid (first argument)
_SELF_PID = {"kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297}
_SOCKET, _SOCKETPAIR, _CLONE, _CLONE3, _PRCTL, _CLONE_THREAD = 41, 53, 56, 435, 157, 0x00010000
#: fcntl commands a program keeps: F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_DUPFD_CLOEXEC, F_SETPIPE_SZ,
#: F_GETPIPE_SZ, F_GET_SEALS. Refused: record locks (F_GETLK/F_SETLK/F_SETLKW, F_OFD_*: a read lock on a host file
#: blocks the host's writers), F_NOTIFY (dnotify would report which host files are read), F_SETOWN/F_SETSIG
#: (SIGIO to another process), leases
_FCNTL_OK = (0, 1, 2, 3, 4, 1030, 1031, 1032, 1034)
#: ioctl requests a program keeps (isatty, terminal size, FIONREAD, FIONBIO, FIOCLEX, FIONCLEX); others are ENOTTY
#: (file-system ioctls such as FIEMAP would describe host disks)
_IOCTL_OK = (0x5401, 0x5413, 0x541B, 0x5421, 0x5450, 0x5451)
#: madvise advice a program keeps: NORMAL, RANDOM, SEQUENTIAL, DONTNEED, FREE, DONTFORK, DOFORK, HUGEPAGE,
#: NOHUGEPAGE, DONTDUMP, DODUMP. Refused: WILLNEED/POPULATE_* (readahead into the page cache), COLD/PAGEOUT
#: (eviction), MERGEABLE (KSM: merging reveals other processes' pages), REMOVE, COLLAPSE
_MADV_OK = (0, 1, 2, 4, 8, 10, 11, 14, 15, 16, 17)
#: number -> (argument index, allowed values, errno for any other value); the kernel reads these arguments as
#: 32-bit ``int``s, so the low half of the 64-bit argument is what counts. preadv2/pwritev2: flags (argument 5)
#: must be 0 -- RWF_NOWAIT probes the page cache, RWF_DONTCACHE evicts from it
_ARG_RULES = {
    _SOCKET: (0, (), errno.EAFNOSUPPORT), _SOCKETPAIR: (0, (), errno.EAFNOSUPPORT),  # no family at all
    72: (1, _FCNTL_OK, errno.EPERM), 16: (1, _IOCTL_OK, errno.ENOTTY), 28: (2, _MADV_OK, errno.EPERM),
    327: (5, (0,), errno.EOPNOTSUPP), 328: (5, (0,), errno.EOPNOTSUPP)}
#: prctl options that would undo a layer: parent-death signal (outlive the server), dumpable,
#: PR_SET_MM, PR_SET_PTRACER
_PRCTL_DENY = (PR_SET_PDEATHSIG, PR_SET_DUMPABLE, 35, 0x59616D61)
_AUDIT_ARCH_X86_64 = 0xC000003E
_RET_ALLOW, _RET_KILL, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_LD, _JA, _JEQ, _JGE, _JSET, _RET = 0x20, 0x05, 0x15, 0x35, 0x45, 0x06
_BLOCK = 200  # allowed numbers per block: classic BPF conditional jumps reach 255 instructions at most


def _arg(index: int) -> int:
    """Offset of the low 32 bits of argument ``index`` in ``struct seccomp_data`` (little endian)."""
    return 16 + 8 * index


def _assemble(prog: list[tuple]) -> bytes:
    """Resolve ``("label", name)`` markers and symbolic jump targets into classic BPF."""
    where, out = {}, []
    for ins in prog:
        if ins[0] == "label":
            where[ins[1]] = len(out)
        else:
            out.append(ins)
    code = []
    for i, (op, jt, jf, k) in enumerate(out):
        jt, jf = ((where[j] - i - 1) if isinstance(j, str) else j for j in (jt, jf))
        if not (0 <= jt < 256 and 0 <= jf < 256):
            raise ValueError(f"BPF jump out of range at instruction {i}")
        code.append(struct.pack("=HBBI", op, jt, jf, k))
    return b"".join(code)


def seccomp_filter(self_pid: int) -> bytes | None:
    """The BPF program (x86_64 only; ``None`` elsewhere) for a process whose pid is ``self_pid``.

    ``clone`` is allowed only with ``CLONE_THREAD``; ``clone3`` answers ENOSYS so that libc falls
    back to ``clone`` (whose flags a classic BPF filter can inspect). No ``socket`` or ``socketpair`` at all: no IP
    (TCP or UDP, loopback included), netlink (``sock_diag``), packet, vsock or Unix sockets. The calls of
    ``_ARG_RULES`` only with the argument values listed there.
    """
    if not is_x86_64():
        return None
    prog = [(_LD, 0, 0, 4), (_JEQ, 1, 0, _AUDIT_ARCH_X86_64), (_RET, 0, 0, _RET_KILL), (_LD, 0, 0, 0),
            (_JGE, "deny", 0, 0x40000000)]  # x32 ABI numbers: denied
    allowed = sorted(_ALLOW.values())
    for b in range(0, len(allowed), _BLOCK):
        block = allowed[b:b + _BLOCK]
        prog += [(_JEQ, f"allow{b}", 0, nr) for nr in block]
        prog += [(_JA, 0, 0, 1), ("label", f"allow{b}"), (_RET, 0, 0, _RET_ALLOW)]
    rules = {**_ARG_RULES, **{nr: (0, (0,), errno.EPERM) for nr in _SELF_ZERO.values()},
             **{nr: (0, (self_pid & 0xFFFFFFFF,), errno.EPERM) for nr in _SELF_PID.values()}}
    prog += [(_JEQ, f"rule{nr}", 0, nr) for nr in sorted(rules)]
    prog += [(_JEQ, "clone", 0, _CLONE), (_JEQ, "prctl", 0, _PRCTL), (_JEQ, "enosys", 0, _CLONE3)]
    prog += [("label", "deny"), (_RET, 0, 0, _RET_ERRNO | errno.EPERM),
             ("label", "enosys"), (_RET, 0, 0, _RET_ERRNO | errno.ENOSYS)]
    for nr, (index, values, err) in sorted(rules.items()):  # each block: its own exits (jumps only go forward)
        prog += [("label", f"rule{nr}"), (_LD, 0, 0, _arg(index))]
        prog += [(_JEQ, f"ok{nr}", 0, v) for v in values]
        prog += [(_RET, 0, 0, _RET_ERRNO | err), ("label", f"ok{nr}"), (_RET, 0, 0, _RET_ALLOW)]
    prog += [("label", "clone"), (_LD, 0, 0, _arg(0)), (_JSET, "allow", "eperm", _CLONE_THREAD),
             ("label", "prctl"), (_LD, 0, 0, _arg(0))]
    prog += [(_JEQ, "eperm", 0, opt) for opt in _PRCTL_DENY]
    prog += [("label", "allow"), (_RET, 0, 0, _RET_ALLOW),
             ("label", "eperm"), (_RET, 0, 0, _RET_ERRNO | errno.EPERM)]
    return _assemble(prog)


def install_seccomp(program: bytes) -> None:
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(buf))
    _check(_LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, fprog, 0, 0), "seccomp")
