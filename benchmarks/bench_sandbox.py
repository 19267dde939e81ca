"""Sandbox throughput and latency: warm fork server vs a cold ``python -c`` per call.

Baseline (measured in the same run): ``subprocess.run([sys.executable, "-I", "-c", code])``
with the same RLIMIT_AS/CPU limits in ``preexec_fn`` -- the approach measured in
docs/sandbox.md (Cost). Prints the boundary in force, calls/s, p50/p95 latency and the speed-up.

    python benchmarks/bench_sandbox.py --calls 40 [--max-boundary landlock]
    python benchmarks/bench_sandbox.py --seccomp-children 300   # needs `pip install pyseccomp` (not a dependency)

``--seccomp-children N`` instead compares the per-call cost of the seccomp layer: N forked children each build and
load the filter (as the zygote's child does per call), with the hand-written BPF of ``_confine`` and with the same
policy through libseccomp (``pyseccomp``), against a fork that loads nothing; interleaved in five rounds.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import resource
import statistics
import subprocess
import sys
import time

from arena_envs.tirmath import Sandbox, _confine
from arena_envs.tirmath.sandbox import BOUNDARIES

PROGRAMS = {
    "trivial": "print(sum(range(100)))",
    "sympy": "import sympy as sp\nx = sp.symbols('x')\nprint(sp.integrate(x**2 - 5*x + 3, (x, 0, 4)), "
             "sp.solve(sp.Eq(3*x + 5, 7*x - 2), x))",
}


def _cold_limits(timeout: float, mem_mb: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
        cpu = max(1, math.ceil(timeout))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    return apply


def cold_run(code: str, timeout: float, mem_mb: int) -> str:
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=timeout,
                         preexec_fn=_cold_limits(timeout, mem_mb))
    return out.stdout


def measure(fn, calls: int) -> tuple[list[float], str]:
    lat, out = [], ""
    for _ in range(calls):
        t = time.perf_counter()
        out = fn()
        lat.append(time.perf_counter() - t)
    return lat, out


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1]


def _hand_filter() -> None:
    _confine.install_seccomp(_confine.seccomp_filter(os.getpid()))


def _libseccomp_filter() -> None:
    """The same policy through libseccomp: the allow-list, the argument rules (one rule per allowed value; refused
    values get EPERM rather than each rule's errno), clone with CLONE_THREAD, clone3 ENOSYS, prctl but the denied
    options (libseccomp has no "not in" for one argument: the allowed options are listed)."""
    import pyseccomp as sc

    f = sc.SyscallFilter(defaction=sc.ERRNO(errno.EPERM))
    for nr in _confine._ALLOW.values():
        f.add_rule(sc.ALLOW, nr)
    rules = {**_confine._ARG_RULES, **{nr: (0, (0,), 0) for nr in _confine._SELF_ZERO.values()},
             **{nr: (0, (os.getpid(),), 0) for nr in _confine._SELF_PID.values()}}
    for nr, (index, values, _err) in rules.items():
        for v in values:
            f.add_rule(sc.ALLOW, nr, sc.Arg(index, sc.EQ, v))
    f.add_rule(sc.ALLOW, _confine._CLONE, sc.Arg(0, sc.MASKED_EQ, _confine._CLONE_THREAD, _confine._CLONE_THREAD))
    f.add_rule(sc.ERRNO(errno.ENOSYS), _confine._CLONE3)
    for option in range(80):
        if option not in _confine._PRCTL_DENY:
            f.add_rule(sc.ALLOW, _confine._PRCTL, sc.Arg(0, sc.EQ, option))
    f.load()


def _per_child(fn, n: int) -> list[float]:
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            try:
                fn()
                os._exit(0)
            except BaseException:  # noqa: BLE001 - reported as a failed child
                os._exit(3)
        assert os.waitpid(pid, 0)[1] == 0, "a child could not load its filter"
        lat.append(time.perf_counter() - t)
    return lat


def seccomp_children(n: int) -> None:
    try:
        import pyseccomp  # noqa: F401 - imported once, as a server would
    except ImportError:
        raise SystemExit("--seccomp-children needs pyseccomp: pip install pyseccomp (and libseccomp)") from None
    rows = {"fork only": lambda: None, "hand-written BPF": _hand_filter, "libseccomp (pyseccomp)": _libseccomp_filter}
    lat: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(5):  # interleaved: the machine's load changes
        for name, fn in rows.items():
            lat[name] += _per_child(fn, max(1, n // 5))
    for name, xs in lat.items():
        print(f"{name:24s} p50 {1e3 * pct(xs, 50):7.2f} ms  p95 {1e3 * pct(xs, 95):7.2f} ms  (n={len(xs)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--memory-mb", type=int, default=2048)
    ap.add_argument("--max-boundary", default="namespace", choices=BOUNDARIES, help="cap the containment level")
    ap.add_argument("--seccomp-children", type=int, default=0,
                    help="instead: per-child cost of the seccomp filter, hand-written BPF vs libseccomp (N children)")
    args = ap.parse_args()
    if args.seccomp_children:
        seccomp_children(args.seccomp_children)
        return
    t = time.perf_counter()
    box = Sandbox(timeout=args.timeout, memory_mb=args.memory_mb, max_boundary=args.max_boundary)
    layers = box.layers  # starts the server
    print(f"server start (imports + warm-up): {time.perf_counter() - t:.2f} s; layers: {layers}")
    print(f"{'program':8s} {'mode':5s} {'calls/s':>8s} {'p50 ms':>8s} {'p95 ms':>8s}")
    for name, code in PROGRAMS.items():
        warm, wout = measure(lambda code=code: box.run(code).stdout, args.calls)
        cold, cout = measure(lambda code=code: cold_run(code, args.timeout, args.memory_mb), max(5, args.calls // 4))
        assert wout == cout, (wout, cout)
        for mode, lat in (("warm", warm), ("cold", cold)):
            print(f"{name:8s} {mode:5s} {1 / statistics.mean(lat):8.1f} {1e3 * pct(lat, 50):8.1f} "
                  f"{1e3 * pct(lat, 95):8.1f}")
        print(f"{name:8s} speed-up warm vs cold (mean latency ratio): "
              f"{statistics.mean(cold) / statistics.mean(warm):.1f}x")
    box.close()


if __name__ == "__main__":
    main()
