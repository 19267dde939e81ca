"""Stress (``-m stress``, minutes): hostile programs in one process, ordinary calls in two others, for
``ARL_STRESS_SECONDS`` (default 180) seconds, at the level ``ARL_STRESS_LEVEL`` (default ``namespace``; ``landlock``
forces the fallback); every ordinary call must succeed.

Each worker is a separate Python process with its own sandbox server, as in training with several env workers.
The ordinary workers record every call that did not succeed with its end records (``Sandbox.ends``: signal,
rusage, limit, level, host load, free pids, available memory), and the summary is printed, so a failure names
its cause. Run: ``python -m pytest -q -m stress -s tests/test_tirmath_stress.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

HOSTILE = [
    "while True:\n    pass",
    "x = bytearray(10**11)",
    "a = []\nwhile True:\n    a.append(bytes(10**7))",
    "import os\nwhile True:\n    os.fork()",
    "import threading, time\nfor _ in range(5000):\n    threading.Thread(target=time.sleep, args=(60,)).start()",
    "import os\nbuf = b'x' * (4 << 20)\nfor i in range(10**6):\n    open(f'f{i}', 'wb').write(buf)",
    "import os\nfor i in range(10**6):\n    os.mkdir(f'd{i}')",
    "import sys\nwhile True:\n    sys.stdout.write('x' * 10**6)",
    "import sys\nsys.setrecursionlimit(10**6)\ndef f(n):\n    return f(n + 1)\nf(0)",
    "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)",
]
ORDINARY = [
    ("print(sum(range(100)))", "4950"),
    ("import sympy as sp\nx = sp.symbols('x')\nprint(sp.solve(x**2 - 5*x + 6, x))", "[2, 3]"),
    ("import numpy as np\nprint(int(np.arange(10).sum()))", "45"),
    ("open('a.txt', 'w').write('7')\nprint(open('a.txt').read())", "7"),
]


def _worker(role: str, seconds: float, out: str) -> None:
    from arena_envs.tirmath.sandbox import Sandbox

    box = Sandbox(timeout=3.0 if role == "hostile" else 10.0,
                  max_boundary=os.environ.get("ARL_STRESS_LEVEL", "namespace"))
    calls, failures, deadline, i = 0, [], time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        if role == "hostile":
            box.run(HOSTILE[i % len(HOSTILE)])
        else:
            code, want = ORDINARY[i % len(ORDINARY)]
            n = len(box.ends)
            result = box.run(code)
            verdict = box.verify("\\boxed{\\frac{1}{2}}", "\\boxed{0.5}") if i % 4 == 0 else True
            if result.status != "ok" or result.stdout.strip() != want or not verdict:
                failures.append({"code": code, "status": result.status, "stderr": result.stderr[-300:],
                                 "verdict": verdict, "ends": list(box.ends)[n:]})
        calls += 1
        i += 1
    retried = [e for e in box.ends if e["unexplained"]]
    with open(out, "w") as f:
        json.dump({"role": role, "calls": calls, "failures": failures, "level": box.boundary,
                   "unexplained_ends": retried[-20:]}, f)
    box.close()


@pytest.mark.stress
def test_ordinary_calls_succeed_beside_hostile_programs(tmp_path):
    seconds = float(os.environ.get("ARL_STRESS_SECONDS", "180"))
    roles = ["hostile", "ordinary", "ordinary"]
    outs = [tmp_path / f"{k}-{r}.json" for k, r in enumerate(roles)]
    procs = [subprocess.Popen([sys.executable, __file__, r, str(seconds), str(o)]) for r, o in zip(roles, outs)]
    for p in procs:
        assert p.wait(timeout=seconds + 600) == 0
    reports = [json.loads(o.read_text()) for o in outs]
    print(json.dumps([{k: r[k] for k in ("role", "calls", "level")} | {"failures": len(r["failures"]),
                      "unexplained_ends": len(r["unexplained_ends"])} for r in reports]))
    for r in reports:
        if r["role"] == "ordinary":
            assert r["calls"] > 0 and r["failures"] == [], json.dumps(r["failures"][:3], indent=1)


if __name__ == "__main__":
    _worker(sys.argv[1], float(sys.argv[2]), sys.argv[3])
