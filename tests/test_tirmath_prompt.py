"""TIR-Math's prompt says where the code goes, and what it says is what the wrapped env does: the ```python block
inside the <action> tags is run, a block in <think> never is, and text after the first block of a turn is not read."""

from __future__ import annotations

import pytest

import wrappers
from arena_envs.tirmath import INSTRUCTIONS, Problem


@pytest.fixture
def env():
    env = wrappers.make_env("ARL/TIRMath-v0")
    yield env
    env.close()


def start(env) -> None:
    env.reset(seed=0, options={"problem": Problem("What is 6 * 7?", "42", "test")})


def test_the_prompt_says_the_code_goes_inside_the_action_tags(env):
    assert "the code block goes inside the <action> tags" in INSTRUCTIONS
    assert "code in <think> is never run" in INSTRUCTIONS and "text after it is not read" in INSTRUCTIONS
    prompt, info = env.reset(seed=0)
    assert INSTRUCTIONS in info["messages"][0]["content"]


def test_code_inside_the_action_is_run(env):
    start(env)
    obs, _, terminated, _, info = env.step("<think>multiply</think><action>```python\nprint(6 * 7)\n```</action>")
    assert info["exec_status"] == "ok" and "Code execution result: 42" in info["observation"] and not terminated


def test_code_in_think_is_never_run(env):
    start(env)
    _, _, terminated, _, info = env.step("<think>```python\nprint(6 * 7)\n```</think><action>42</action>")
    assert info["exec_status"] is None and terminated and not info["action_is_valid"]


def test_text_after_the_first_block_is_not_read(env):
    start(env)
    action = "```python\nprint(6 * 7)\n```\nSo the answer is \\boxed{42}."
    _, reward, terminated, _, info = env.step(f"<think>run it</think><action>{action}</action>")
    assert info["exec_status"] == "ok" and info["answer"] is None and not terminated and reward == 0.0
    _, reward, terminated, _, info = env.step("<think>done</think><action>\\boxed{42}</action>")
    assert terminated and info["won"] and reward == 1.0
