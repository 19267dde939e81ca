"""ARL/SWE-Mini-v0: the bug catalogue, task generation, commands, sandboxed tests, reward and the expert."""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest

import arena_envs  # noqa: F401  (registers the ids)
from arena_envs import EnvStateError
from arena_envs.swe import commands
from arena_envs.swe.baselines import random_action
from arena_envs.swe.catalogue import BUG_KINDS, TEMPLATES
from arena_envs.swe.env import SPLITS, SWEMiniEnv
from arena_envs.swe.generator import failing_calls, generate_task, outcomes
from arena_envs.swe.runner import run_tests
from wrappers import format_response, make_env


def solve(env: SWEMiniEnv, seed: int, max_steps: int = 60) -> tuple[float, dict]:
    env.reset(seed=seed)
    for _ in range(max_steps):
        _obs, reward, terminated, _truncated, info = env.step(env.expert_action())
        if terminated:
            return reward, info
    raise AssertionError("the expert did not submit")


def test_every_catalogue_bug_breaks_some_calls_and_keeps_others():
    assert {b.kind for t in TEMPLATES for b in t.bugs} == set(BUG_KINDS)
    assert len({t.name for t in TEMPLATES}) == len(TEMPLATES)
    for i, template in enumerate(TEMPLATES):
        assert all(ok for ok, _ in outcomes(i, None)), template.name
        for b in range(len(template.bugs)):
            failing = failing_calls(i, b)
            assert 0 < len(failing) < len(template.calls), (template.name, b)


def test_generation_is_deterministic_and_follows_the_knobs():
    task = generate_task(5, num_modules=4, functions_per_module=3, num_bugs=2, num_distractors=2)
    assert task == generate_task(5, num_modules=4, functions_per_module=3, num_bugs=2, num_distractors=2)
    assert task != generate_task(6, num_modules=4, functions_per_module=3, num_bugs=2, num_distractors=2)
    modules = [p for p in task.fixed if p.endswith(".py") and "legacy_" not in p and not p.endswith("__init__.py")]
    assert len(modules) == 4 and len({t.module for t in task.hidden_tests}) == 4
    assert sum("legacy_" in p for p in task.files) == 2 and len(task.bugs) == 2
    assert task.fail_to_pass and task.pass_to_pass and not set(task.fail_to_pass) & set(task.pass_to_pass)
    assert all(b.function in task.issue for b in task.bugs)
    for bug in task.bugs:  # the buggy module differs from the fix; the fix is nowhere in the issue
        assert task.files[bug.path] != task.fixed[bug.path]


@pytest.mark.parametrize("knobs", [{"num_modules": 0}, {"num_modules": 6}, {"functions_per_module": 99},
                                   {"num_bugs": 0}, {"num_distractors": 4}])
def test_bad_knobs_are_rejected_at_construction(knobs):
    with pytest.raises(ValueError):
        SWEMiniEnv(**knobs)


def test_splits_draw_disjoint_task_seeds():
    seeds = {}
    for split in SPLITS:
        env = SWEMiniEnv(split=split)
        seeds[split] = {env.reset(seed=s)[1]["task_seed"] for s in range(20)}
        low, high = SPLITS[split]
        assert all(low <= t < high for t in seeds[split])
    assert not seeds["train"] & seeds["test"]
    with pytest.raises(ValueError):
        SWEMiniEnv(split="test").reset(seed=0, options={"task_seed": 3})
    with pytest.raises(ValueError):
        SWEMiniEnv(split="valid")


@pytest.mark.parametrize("knobs", [{}, {"num_modules": 5, "functions_per_module": 6, "num_bugs": 3,
                                        "num_distractors": 5}])
def test_expert_solves_tasks(knobs):
    env = SWEMiniEnv(**knobs)
    for seed in range(8):
        reward, info = solve(env, seed)
        assert reward == 1.0 and info["won"], (knobs, seed)


def test_expert_recovers_from_random_edits():
    env, rng = SWEMiniEnv(num_bugs=2), np.random.default_rng(0)
    for seed in range(4):
        env.reset(seed=seed)
        for _ in range(6):
            action = random_action(env, rng)
            if action != "submit":
                env.step(action)
        for _ in range(80):
            _obs, reward, terminated, _truncated, info = env.step(env.expert_action())
            if terminated:
                break
        assert reward == 1.0 and info["won"]


def test_random_policy_rarely_wins():
    env = gym.make("ARL/SWE-Mini-v0")
    rng, wins = np.random.default_rng(1), 0
    for seed in range(30):
        env.reset(seed=seed)
        terminated = truncated = False
        while not (terminated or truncated):
            _obs, _r, terminated, truncated, info = env.step(random_action(env.unwrapped, rng))
        wins += info["won"]
    assert wins / 30 <= 0.02


def test_submit_rewards_hidden_tests_not_visible_ones():
    env = SWEMiniEnv()
    env.reset(seed=2)
    task = env.task
    for path in [p for p in env.files if p.startswith("tests/")]:  # gut the visible tests: they now all pass
        n = commands.line_count(env.files[path])
        _obs, _r, _t, _tr, info = env.step(f"edit {path} 1-{n}\ndef test_ok():\n    pass")
        assert info["action_is_valid"]
    obs, _r, _t, _tr, _info = env.step("run_tests")
    assert "0 failed" in obs
    obs, reward, terminated, _tr, info = env.step("submit")
    total = len(task.fail_to_pass) + len(task.pass_to_pass)
    assert terminated and reward == 0.0 and not info["won"] and info["tests_passed"] == len(task.pass_to_pass)
    assert f"{len(task.pass_to_pass)}/{total}" in obs
    dense = SWEMiniEnv(dense_reward=True)
    dense.reset(seed=2)
    assert dense.step("submit")[1] == pytest.approx(len(task.pass_to_pass) / total)
    with pytest.raises(EnvStateError):  # after the end nothing is graded again (the env contract)
        dense.step("submit")


def test_run_tests_reports_the_reproduction_and_filters_by_pattern():
    env = SWEMiniEnv()
    env.reset(seed=4)
    obs = env.step("run_tests")[0]
    visible_failing = [t for t in env.task.fail_to_pass if t.split("::")[1] in env.files[t.split("::")[0]]]
    assert "1 failed" in obs and f"FAILED {visible_failing[0]}" in obs
    name = visible_failing[0].split("::")[1]
    assert env.step(f"run_tests {name}")[0].startswith("1 test(s) ran")


@pytest.mark.parametrize("action, message", [
    ("", "Empty command"), ("rm -rf /", "Unknown command"), ("open ../../etc/passwd", "outside the repository"),
    ("open /etc/passwd", "outside the repository"), ("open nothing.py", "No such file"),
    ("open README.md 999", "out of range"), ("edit README.md", "Usage"), ("edit README.md 5-1\nx", "not a valid range"),
    ("edit README.md 1-1\na\nend_of_edit\nb", "one edit per action"), ("ls\nsubmit", "single line"),
    ("search", "needs a text"), ("edit README.md 1-1\n" + "x" * 200_000, "exceed"), ("ls nowhere", "No such"),
])
def test_bad_commands_are_invalid_with_a_reason(action, message):
    env = SWEMiniEnv()
    env.reset(seed=0)
    before = dict(env.files)
    obs, reward, terminated, _tr, info = env.step(action)
    assert message in obs and not info["action_is_valid"] and reward == 0.0 and not terminated
    assert env.files == before


def test_edit_semantics_insert_delete_and_code_fence():
    files = {"a.py": "1\n2\n3"}
    commands.edit(files, commands.parse("edit a.py 2-1\nnew"))
    assert files["a.py"] == "1\nnew\n2\n3"
    commands.edit(files, commands.parse("edit a.py 2-3\nend_of_edit"))
    assert files["a.py"] == "1\n3"
    commands.edit(files, commands.parse("```\nedit a.py 2:2\n    indented\n\nend_of_edit\n```"))
    assert files["a.py"] == "1\n    indented\n"


def test_fuzzed_actions_never_raise():
    env, rng = SWEMiniEnv(), np.random.default_rng(0)
    env.reset(seed=1)
    alphabet = list("abcdefghijklmnopqrstuvwxyz0123456789 -:/.\n_`'\"\\\t\x00漢🙂")
    prefixes = ["", "open ", "edit ", "search ", "ls ", "run_tests ", "edit tests/test_", "open README.md "]
    for _ in range(300):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 60))))
        obs, reward, terminated, truncated, info = env.step(prefixes[int(rng.integers(len(prefixes)))] + text)
        assert isinstance(obs, str) and all(ch in env.observation_space.character_set for ch in obs)
        if terminated:
            env.reset(seed=1)


HOSTILE_TESTS = '''import os, shutil
def test_delete_repo():
    shutil.rmtree(os.getcwd())
def test_write_outside():
    open("/tmp/swe-mini-escape-{tag}", "w").write("x")
def test_fork_bomb():
    while True:
        os.fork()
def test_subprocess():
    import subprocess
    subprocess.run(["sh", "-c", ":(){{ :|:& }};:"])
def test_network():
    import socket
    socket.create_connection(("1.1.1.1", 80), timeout=1)
def test_spin():
    while True:
        pass
'''


def test_hostile_tests_are_contained_and_reported():
    env = SWEMiniEnv()
    env.reset(seed=3)
    tag = os.urandom(4).hex()
    path = next(p for p in env.files if p.startswith("tests/"))
    n = commands.line_count(env.files[path])
    assert env.step(f"edit {path} 1-{n}\n{HOSTILE_TESTS.format(tag=tag)}")[4]["action_is_valid"]
    obs = env.step(f"run_tests {path}")[0]
    assert "6 test(s) ran" in obs and "No such file or directory" in obs  # it emptied its own copy only
    for word in ("os.fork is not allowed", "subprocess", "socket", "outside the working directory", "timed out"):
        assert word in obs, word
    assert not os.path.exists(f"/tmp/swe-mini-escape-{tag}")
    assert path in env.step("ls")[0]  # the episode's working copy is untouched
    assert "passed" in env.step("run_tests")[0]


def test_runaway_package_code_ends_the_run_with_a_reason():
    files = {"pkg/__init__.py": "try:\n    while True:\n        pass\nexcept BaseException:\n    while True:\n"
                                "        pass\n", "tests/test_a.py": "import pkg\ndef test_a():\n    pass\n"}
    run = run_tests(files, timeout=2.0)
    assert not run.results and "time limit" in run.problem
    flood = {"tests/test_a.py": "import os\ndef test_a():\n    while True:\n        os.write(1, b'x' * 65536)\n"}
    assert "too much output" in run_tests(flood, timeout=5.0).problem


def test_wrapped_env_receives_multiline_edits_intact():
    env = make_env("ARL/SWE-Mini-v0", prompt_style="full")
    _obs, info = env.reset(seed=0)
    assert "edit <file>" in info["messages"][0]["content"]
    for _ in range(6):
        obs, reward, terminated, _tr, info = env.step(format_response(env.unwrapped.expert_action(), "fix it"))
        assert info["action_is_valid"]
        if terminated:
            break
    assert terminated and reward == 1.0


def test_behaviour_cloning_data_from_the_expert():
    from arena_train.bc import collect_expert_data

    data = collect_expert_data(lambda: make_env("ARL/SWE-Mini-v0", prompt_style="arlarena"), num_episodes=2,
                               max_turns=20, random_action_prob=0.0, think="", seed=0)
    responses = [response for _messages, response in data]
    assert len(data) == 8 and sum("edit " in r for r in responses) == 2 and responses[-1].endswith("submit</action>")
    assert "fixing a reported bug" in data[0][0][0]["content"]  # the swe family's role line


def test_overlong_lines_are_cut_in_views():
    files = {"a.py": "x" * 5000}
    _path, obs = commands.open_file(files, "a.py")
    assert len(obs) < 600 and f"({5000 - commands.LINE_CHARS} more characters)" in obs


def test_a_sandbox_that_cannot_start_is_a_reported_problem(monkeypatch):
    from arena_envs.swe import runner
    from arena_envs.tirmath.sandbox import Sandbox

    monkeypatch.setitem(runner._BOXES, os.getpid(), Sandbox(startup_timeout=1e-6))
    monkeypatch.setattr(runner, "grading_sandbox", lambda: Sandbox(startup_timeout=1e-6))  # one per submission
    env = SWEMiniEnv()
    env.reset(seed=0)
    obs, reward, terminated, _tr, info = env.step("run_tests")
    assert obs.startswith("No test results: the sandbox is unavailable") and info["action_is_valid"]
    obs, reward, terminated, _tr, info = env.step("submit")
    assert terminated and reward == 0.0 and not info["won"] and "sandbox is unavailable" in obs
