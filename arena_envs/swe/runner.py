"""Run a working copy's code in the TIR-Math sandbox: its visible tests, and the hidden grading calls.

Each run is one sandbox call: the child writes the working copy into its own fresh private
directory and runs there under the sandbox's containment (no network, no processes, rlimits on
time, memory, files and output, no writes outside that directory); the directory is deleted
afterwards, so nothing an edit does outlives the call.

Two kinds of run, with different trust:

* :func:`run_tests` (the ``run_tests`` command) imports the working copy's ``tests/test_*.py`` and
  calls their ``test_*`` functions. The verdicts are feedback for the agent only: package code runs
  in the same interpreter and can make them say anything, which costs nothing since they decide no
  reward.
* :func:`grade_calls` (``submit``) decides the reward. Only the package files and the hidden
  *inputs* (module, function, arguments) enter the sandbox; the child calls each function and
  writes what it returned, as plain data, to the report pipe (fd 3). This process parses that
  report strictly (size cap, JSON of None/bool/int/float/str/list and tagged dicts only) and
  compares each value with the expected one, which never leaves this process. Package code can
  rewrite the report, but it cannot make a value equal to an expected value it never sees, except
  by computing it, i.e. by fixing the bug. Nothing the child prints is read.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from arena_envs.swe.generator import HiddenTest
from arena_envs.tirmath.sandbox import Sandbox

#: Per-test wall-clock limit (seconds) inside one run.
TEST_TIMEOUT = 1.0
#: Characters of a failure message kept.
MESSAGE_CHARS = 300
#: Largest report (bytes) a run may write to fd 3; a longer one is no report.
MAX_REPORT = 1 << 20
#: Largest encoded return value of one grading call (bytes); a larger one fails that test.
MAX_VALUE = 4096

_PROGRAM = r'''
import importlib.util, io, json, os, signal, sys, traceback

FILES = json.loads(%(files)s)
SELECT = %(select)s
PER_TEST = %(per_test)s
LIMIT = %(limit)s
ROOT = os.getcwd()


class TestTimeout(BaseException):
    pass


def on_alarm(signum, frame):
    raise TestTimeout()


def describe(exc):
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(ROOT + os.sep)]
    where = f"{os.path.relpath(frames[-1].filename, ROOT)}:{frames[-1].lineno}: " if frames else ""
    return (where + text)[:LIMIT]


for rel, text in FILES.items():
    path = os.path.join(ROOT, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
sys.path.insert(0, ROOT)
signal.signal(signal.SIGALRM, on_alarm)
sys.stdout = sys.stderr = io.StringIO()
results, errors = {}, {}
for rel in sorted(FILES):
    parts = rel.split("/")
    if len(parts) != 2 or parts[0] != "tests" or not parts[1].startswith("test_") or not rel.endswith(".py"):
        continue
    name = "tests." + parts[1][:-3]
    try:
        signal.setitimer(signal.ITIMER_REAL, PER_TEST)
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as exc:
        signal.setitimer(signal.ITIMER_REAL, 0)
        errors[rel] = describe(exc) if not isinstance(exc, TestTimeout) else "import timed out"
        continue
    for attr, fn in list(vars(module).items()):
        test_id = f"{rel}::{attr}"
        if not attr.startswith("test_") or not callable(fn) or SELECT not in test_id:
            continue
        try:
            signal.setitimer(signal.ITIMER_REAL, PER_TEST)
            fn()
            signal.setitimer(signal.ITIMER_REAL, 0)
            results[test_id] = ["passed", ""]
        except TestTimeout:
            results[test_id] = ["failed", f"timed out after {PER_TEST:g} s"]
        except BaseException as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            results[test_id] = ["failed", describe(exc)]
os.write(3, json.dumps({"results": results, "errors": errors}).encode())
'''

# The grading child: calls only, no expected values. ``plain`` admits exact built-in types (a subclass
# of int or str, an object with its own __eq__, a tuple or set is refused), dicts as tagged pair lists.
_GRADER = r'''
import ast, importlib, io, json, math, os, signal, sys

FILES = json.loads(%(files)s)
CALLS = json.loads(%(calls)s)
PER_TEST = %(per_test)s
MAX_VALUE = %(max_value)s
ROOT = os.getcwd()


class TestTimeout(BaseException):
    pass


def on_alarm(signum, frame):
    raise TestTimeout()


def plain(value):
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
    if kind is float and math.isfinite(value):
        return value
    if kind is list:
        return [plain(v) for v in value]
    if kind is dict:
        return {"dict": [[key(k), plain(v)] for k, v in value.items()]}
    raise TypeError(f"{kind.__name__} is not plain data")


def key(k):
    if isinstance(plain(k), (list, dict)):
        raise TypeError("a dict key is not a scalar")
    return k


for rel, text in FILES.items():
    path = os.path.join(ROOT, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
sys.path.insert(0, ROOT)
signal.signal(signal.SIGALRM, on_alarm)
sys.stdout = sys.stderr = io.StringIO()
outcomes = []
for module_name, function, arguments in CALLS:
    try:
        signal.setitimer(signal.ITIMER_REAL, PER_TEST)
        args, kwargs = ast.literal_eval(arguments)
        value = getattr(importlib.import_module(module_name), function)(*args, **kwargs)
        signal.setitimer(signal.ITIMER_REAL, 0)
        text = json.dumps(plain(value), allow_nan=False)
        outcomes.append('{"value": ' + text + '}' if len(text) <= MAX_VALUE else '{"failed": "too large"}')
    except BaseException:
        signal.setitimer(signal.ITIMER_REAL, 0)
        outcomes.append('{"failed": "raised or not plain data"}')
os.write(3, ('{"values": [' + ", ".join(outcomes) + ']}').encode())
'''


@dataclass(frozen=True)
class TestRun:
    """``results``: test id -> (passed, message); ``errors``: test file -> import error;
    ``problem``: why the run as a whole gave no results ("" when it did)."""

    results: dict[str, tuple[bool, str]]
    errors: dict[str, str]
    problem: str

    def passed(self, test_id: str) -> bool:
        return self.results.get(test_id, (False, ""))[0]


_BOXES: dict[int, Sandbox] = {}
_LOCK = threading.Lock()


def sandbox() -> Sandbox:
    """One sandbox server per process for all SWE envs (per-call limits travel with each request)."""
    with _LOCK:
        box = _BOXES.get(os.getpid())
        if box is None:
            box = _BOXES[os.getpid()] = Sandbox(timeout=10.0, max_output=1 << 20, kill_output=4 << 20,
                                                file_size=1 << 20)
        return box


def _run(program: str, timeout: float, box: Sandbox | None = None, quote_error: bool = True):
    """(result, problem): the sandbox run, or why there is none. ``quote_error``: the problem quotes the run's last
    error line (never for grading: the package under test could print the hidden inputs there)."""
    try:
        result = (box or sandbox()).run(program, timeout=timeout, report=MAX_REPORT)
    except (RuntimeError, OSError) as e:  # the server could not start (e.g. a machine out of processes)
        return None, f"the sandbox is unavailable ({e})"
    reasons = {"timeout": f"the test run exceeded its {timeout:g} s time limit", "memory": "the test run ran out "
               "of memory", "output_limit": "the test run printed too much output"}
    problem = reasons.get(result.status) or f"the test run ended without results ({result.status}"
    if result.status not in reasons:
        quoted = quote_error and result.last_error_line
        problem += f": {result.last_error_line[:MESSAGE_CHARS]})" if quoted else ")"
    return result, problem


def grading_sandbox() -> Sandbox:
    """A fresh server for one submission, closed after it: no later call -- another episode's ``run_tests``, the
    next submission -- runs in the server, tmpfs, PID or IPC namespace where the hidden inputs were. No sympy
    preload: the generated packages are plain Python, and the server starts in a fraction of a second."""
    return Sandbox(timeout=10.0, max_output=1 << 20, kill_output=4 << 20, file_size=1 << 20, preload=False)


def run_tests(files: dict[str, str], select: str = "", timeout: float = 10.0) -> TestRun:
    """Run the ``tests/test_*.py`` of ``files`` whose id contains ``select``; never raises.

    Feedback only: the package under test can rewrite these verdicts (see the module docstring)."""
    program = _PROGRAM % {"files": repr(json.dumps(files)), "select": repr(select),
                          "per_test": repr(TEST_TIMEOUT), "limit": repr(MESSAGE_CHARS)}
    result, problem = _run(program, timeout)
    payload = parse_report(result.report if result is not None else None)
    try:
        results = {str(k): (v[0] == "passed", str(v[1])) for k, v in payload["results"].items()}
        return TestRun(results, {str(k): str(v) for k, v in payload["errors"].items()}, "")
    except (KeyError, TypeError, IndexError, AttributeError):
        return TestRun({}, {}, problem)


def grade_calls(files: dict[str, str], tests: Sequence[HiddenTest], timeout: float = 10.0
                ) -> tuple[dict[str, bool], str]:
    """(test id -> passed, problem of the run) for the hidden ``tests`` on the package ``files``; never raises.

    A test passes only when the value its call returned, as parsed here, equals ``expected``."""
    calls = [[t.module, t.function, repr((tuple(t.args), dict(t.kwargs)))] for t in tests]
    program = _GRADER % {"files": repr(json.dumps(files)), "calls": repr(json.dumps(calls)),
                         "per_test": repr(TEST_TIMEOUT), "max_value": repr(MAX_VALUE)}
    box = grading_sandbox()
    try:
        result, problem = _run(program, timeout, box, quote_error=False)
    finally:
        box.close()
    payload = parse_report(result.report if result is not None else None)
    entries = payload.get("values") if isinstance(payload, dict) else None
    if type(entries) is not list or len(entries) != len(tests):
        return {t.test_id: False for t in tests}, problem
    return {t.test_id: _matches(entry, t.expected) for t, entry in zip(tests, entries)}, ""


def parse_report(data: bytes | None):
    """The report's JSON, or ``None``: strict UTF-8 JSON of at most ``MAX_REPORT`` bytes, objects with
    distinct string keys, no NaN or infinities; anything else (deep nesting, huge numbers) is no report."""
    if data is None or len(data) > MAX_REPORT:
        return None
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_refuse, object_pairs_hook=_distinct)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None


def _refuse(name: str):
    raise ValueError(f"{name} is not plain data")


def _distinct(pairs: list[tuple[str, object]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("repeated key")
    return out


def _matches(entry, expected) -> bool:
    """Whether one report entry (``{"value": v}``) decodes to a value equal to ``expected``."""
    if type(entry) is not dict or set(entry) != {"value"}:
        return False
    try:
        return _decode(entry["value"]) == expected
    except (TypeError, ValueError, RecursionError):
        return False


def _decode(node):
    """Plain data from the report's encoding: JSON scalars and lists as they are, ``{"dict": [[k, v], ...]}``
    for a dict (keys may be any scalar). Only built-in types come out, so ``==`` runs no package code."""
    if node is None or type(node) in (bool, int, float, str):
        return node
    if type(node) is list:
        return [_decode(v) for v in node]
    if type(node) is dict and set(node) == {"dict"} and type(node["dict"]) is list:
        out = {}
        for pair in node["dict"]:
            if type(pair) is not list or len(pair) != 2 or type(pair[0]) in (list, dict):
                raise ValueError("malformed dict entry")
            out[pair[0]] = _decode(pair[1])
        return out
    raise ValueError("not plain data")
