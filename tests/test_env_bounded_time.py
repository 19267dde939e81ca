"""Every env answers every action in bounded time, linear in its length: 1 MiB actions (newlines, spaces, one
repeated token of any env's syntax) to every registered id, raw and through ``wrappers.make_env`` (whose projection
parses the response first). SWE-Mini once took 52 s on 1 MiB of newlines (one ``list.pop(0)`` per blank line)."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wrappers
from arena_envs import ENGINE_EXTRAS, ENV_IDS
from arena_envs.swe import commands
from arena_envs.swe import runner as swe_runner

MIB = 1 << 20
#: seconds one 1 MiB step may take on a loaded 2-core machine (the slowest env, ALFWorld, takes ~0.2 s)
STEP_LIMIT = 2.0
#: pieces of every env's syntax: command words, brackets, tags, fences, escapes, separators
TOKENS = ("\n", " ", "\t", "\r\n", "x", "0", "-", "\\", "{", "}", "[", "]", "<", "< ", "漢", "up ", "look ", "go to ",
          "search[", "click[", "[SEP] ", "<action>", "</action>", "<think>", "< action", "```", "```python\n", "```\n",
          "\\boxed{", "\\fbox{", "edit a.py 1-1\n", "end_of_edit\n", "open ", "ls\n", "submit ")


def repeated(token: str, size: int = MIB) -> str:
    """``token`` repeated to ``size`` characters."""
    return (token * (size // len(token) + 1))[:size]


@pytest.fixture(scope="module")
def envs():
    """One env per (id, stack) for the whole module (ALFWorld and TextWorld take seconds to make and reset)."""
    made: dict[tuple[str, str], gym.Env] = {}
    yield made
    for env in made.values():
        env.close()


@pytest.fixture(params=ENV_IDS)
def env_id(request):
    for package in ENGINE_EXTRAS.get(gym.spec(request.param).entry_point.split(":")[0], ()):
        pytest.importorskip(package, reason=f"{request.param} needs the [{package}] extra")
    return request.param


def running(envs, env_id: str, stack: str) -> gym.Env:
    """The (id, stack) env in a running episode; the sandbox servers of TIR-Math and SWE-Mini (1-2 s to start, once
    per process) are started before any step is timed."""
    key = (env_id, stack)
    if key not in envs:
        kwargs = {"games_per_task": 1} if "ALFWorld" in env_id else {}
        envs[key] = gym.make(env_id, **kwargs) if stack == "raw" else wrappers.make_env(env_id, **kwargs)
        if "TIRMath" in env_id:
            envs[key].unwrapped.sandbox.run("print(1)", timeout=3.0)
        if "SWE" in env_id:
            swe_runner.sandbox().run("print(1)", timeout=3.0)
    env = envs[key]
    if env.unwrapped._phase != "running":
        env.reset(seed=0)
    return env


def timed_step(env: gym.Env, action: str) -> float:
    start = time.perf_counter()
    obs, reward, *_ = env.step(action)
    elapsed = time.perf_counter() - start
    assert isinstance(obs, str) and isinstance(reward, float)
    return elapsed


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])  # the envs are shared on purpose
@given(token=st.one_of(st.sampled_from(TOKENS), st.text(min_size=1, max_size=12)),
       stack=st.sampled_from(("raw", "make_env")))
def test_a_mebibyte_of_one_token_is_answered_in_bounded_time(envs, env_id, token, stack):
    env = running(envs, env_id, stack)
    assert timed_step(env, repeated(token)) < STEP_LIMIT, (env_id, stack, token)


@pytest.mark.parametrize("stack", ["raw", "make_env"])
def test_a_mebibyte_of_newlines_or_spaces_is_answered_in_bounded_time(envs, env_id, stack):
    for token in ("\n", " "):
        env = running(envs, env_id, stack)
        assert timed_step(env, repeated(token)) < STEP_LIMIT, (env_id, stack, repr(token))


def test_swe_parsing_is_linear_in_blank_lines():
    """16 times the blank lines take about 16 times the time, far from a quadratic parser's 256 (one took 4.9x for
    twice the lines: 10.6 s, then 52 s). The ratio is that wide so that a loaded machine's noise (a 14x reading
    for 4 times the lines was seen at load 8 on 2 cores) cannot pass for a quadratic cost."""

    def parse_time(n: int) -> float:
        start = time.perf_counter()
        with pytest.raises(commands.CommandError, match="Empty command"):
            commands.parse("\n" * n)
        return time.perf_counter() - start

    small, large = min(parse_time(MIB // 16) for _ in range(5)), min(parse_time(MIB) for _ in range(5))
    assert large < 0.5 and large < 64 * small + 0.05
    assert commands.parse("\n" * 100_000 + "ls\n\n").name == "ls"  # blank lines before a command are ignored
