"""TIR-Math sandbox: a program that crashes itself gets its crash as its outcome; only a death the retry does not
reproduce is an env error (``SandboxError``, the rollout's failure policy).

Before, a program that killed itself with a signal twice (``os.abort()``, a segfault, ``signal.raise_signal``)
raised ``SandboxError`` from ``TIRMathEnv.step``: the agent's own bad program dropped its whole group as an env
failure instead of being scored like any failing program. A bare exit code (``os._exit(7)``) gave an empty
observation.
"""

from __future__ import annotations

import signal

import pytest

from arena_envs.tirmath import Problem, TIRMathEnv
from arena_envs.tirmath.sandbox import Sandbox, SandboxError


@pytest.fixture(scope="module")
def box():
    """The env's default containment (audit hook on), plain Python (no preload: a fast start)."""
    sandbox = Sandbox(timeout=3.0, memory_mb=512, preload=False)
    yield sandbox
    sandbox.close()


@pytest.fixture(scope="module")
def raw_box():
    """Audit hook off, as a program that switched it off sees the sandbox (``ctypes`` importable)."""
    sandbox = Sandbox(timeout=3.0, memory_mb=512, preload=False, audit_hook=False)
    yield sandbox
    sandbox.close()


def _step(box: Sandbox, code: str):
    env = TIRMathEnv(data=[Problem("What is 1 + 1?", "2", "t")], sandbox=box)
    env.reset(seed=0)
    return env.step(f"```python\n{code}\n```")


def _assert_scored_like_a_failing_program(box: Sandbox, code: str, note: str) -> dict:
    """The step returns (never raises) the crash in words, with what a program that raises gets: reward 0, the
    episode going on, the action valid."""
    obs, reward, terminated, truncated, info = _step(box, code)
    _, ref_reward, ref_terminated, ref_truncated, ref_info = _step(box, "raise ValueError('bad')")
    assert note in obs, obs
    assert (reward, terminated, truncated) == (ref_reward, ref_terminated, ref_truncated) == (0.0, False, False)
    assert info["action_is_valid"] == ref_info["action_is_valid"] and info["exec_status"] != "sandbox_error"
    return info


def _last_ends(box: Sandbox, n: int) -> list[tuple]:
    return [(e["attempt"], e["signal"], e["verdict"]) for e in list(box.ends)[-n:]]


CRASHES = [
    ("signal_self_kill", "import signal\nprint('before', flush=True)\nsignal.raise_signal(signal.SIGSEGV)",
     signal.SIGSEGV),
    ("abort", "import os\nos.abort()", signal.SIGABRT),
]


@pytest.mark.parametrize(("name", "code", "sig"), CRASHES, ids=[c[0] for c in CRASHES])
def test_a_self_inflicted_signal_is_the_programs_crash(box, name, code, sig):
    """Run twice (the retry tells an outside killer from the program), then reported to the agent."""
    result = box.run(code)
    assert result.status == "crashed" and result.signal == sig
    assert _last_ends(box, 2) == [(1, sig, "retry"), (2, sig, "reproduced")]
    info = _assert_scored_like_a_failing_program(box, code, f"Killed by signal {signal.Signals(sig).name} (")
    assert info["exec_status"] == "crashed"


def test_the_crash_observation_keeps_what_was_printed(box):
    obs, *_ = _step(box, CRASHES[0][1])
    assert obs == "\nCode execution result: before\nKilled by signal SIGSEGV (Segmentation fault)\n"


def test_a_segfault_through_ctypes_is_the_programs_crash(raw_box):
    code = "import ctypes\nctypes.string_at(0)"
    assert raw_box.run(code).status == "crashed"
    assert _last_ends(raw_box, 2) == [(1, signal.SIGSEGV, "retry"), (2, signal.SIGSEGV, "reproduced")]
    _assert_scored_like_a_failing_program(raw_box, code, "Killed by signal SIGSEGV (Segmentation fault)")


def test_a_self_kill_with_sigkill_is_the_programs_crash(raw_box):
    """SIGKILL is what an outside killer sends too: only the retry's same end makes it the program's."""
    code = "import os\nos.kill(os.getpid(), 9)"
    assert raw_box.run(code).status == "crashed"
    assert _last_ends(raw_box, 2) == [(1, signal.SIGKILL, "retry"), (2, signal.SIGKILL, "reproduced")]
    _assert_scored_like_a_failing_program(raw_box, code, "Killed by signal SIGKILL (Killed)")


def test_an_odd_exit_code_is_reported_and_not_retried(box):
    """Only the process sets its exit code (no outside killer does), so it is the program's outcome at once."""
    _assert_scored_like_a_failing_program(box, "import os\nprint(3, flush=True)\nos._exit(7)", "3\nExited with code 7")
    n = len(box.ends)
    result = box.run("import os\nos._exit(7)")
    assert (result.status, result.exit_code) == ("error", 7) and len(box.ends) == n + 1
    assert box.ends[-1]["verdict"] == "outcome"


class DiesOnce:
    """A stand-in for the server: the first call's child died of ``first`` (as if from an outside killer), the
    retry ends as ``then`` says (``None``: the real call runs)."""

    def __init__(self, request, first: int, then: int | None = None):
        self.request, self.first, self.then, self.calls = request, first, then, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        sig = self.first if self.calls == 1 else self.then
        if sig is None:
            return self.request(*args, **kwargs)
        return {"stdout": "", "stderr": "", "exit_code": None, "signal": int(sig), "limit": None, "output_bytes": 0,
                "elapsed": 0.01, "rusage": {"cpu_s": 0.01}, "level": "namespace"}


@pytest.mark.parametrize("then", [None, signal.SIGABRT], ids=["then_runs", "then_dies_otherwise"])
def test_a_death_the_retry_does_not_reproduce_is_an_env_error(box, monkeypatch, then):
    """Killed once from outside, then a normal run (or another death): not the program's outcome."""
    fake = DiesOnce(box._request, signal.SIGSEGV, then)
    monkeypatch.setattr(box, "_request", fake)
    result = box.run("print('fine')")
    assert fake.calls == 2 and result.status == "sandbox_error"
    fake.calls = 0
    with pytest.raises(SandboxError):
        _step(box, "print('fine')")
    assert "retry ended otherwise" in result.stderr
    assert _last_ends(box, 2) == [(1, signal.SIGSEGV, "retry"), (2, then and int(then), "env_error")]


def test_an_answer_that_crashes_the_check_is_not_paid(box, monkeypatch):
    """The same death twice in the answer check: the answer's outcome (wrong), never an env error."""
    fake = DiesOnce(box._verify_request, signal.SIGSEGV, signal.SIGSEGV)
    monkeypatch.setattr(box, "_verify_request", fake)
    assert box.verify("\\boxed{1}", "\\boxed{1}") is False
    assert _last_ends(box, 2) == [(1, signal.SIGSEGV, "retry"), (2, signal.SIGSEGV, "reproduced")]
