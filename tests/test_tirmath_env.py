"""TIRMathEnv: gymnasium contract, determinism, expert success, protocol, loaders, arbitrary text."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arena_envs  # noqa: F401 - registers ARL/TIRMath-v0
from arena_envs.base import CHARSET, INFO_KEYS, EnvStateError
from arena_envs.tirmath import FAMILIES, Problem, TIRMathEnv, generate_problem, load_problems

GSM8K = Path(__file__).parents[2] / "shared/data/gsm8k/test.jsonl"


@pytest.fixture(scope="module")
def env():
    e = TIRMathEnv(timeout=2.0, memory_mb=1024)
    yield e
    e.close()


def _play_expert(env, seed):
    obs, info = env.reset(seed=seed)
    for _ in range(env.max_turns):
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
        if terminated or truncated:
            return reward, info
    raise AssertionError("expert did not finish")


def test_check_env():
    env = gym.make("ARL/TIRMath-v0")
    check_env(env.unwrapped, skip_render_check=True)
    assert env.spec.max_episode_steps == 5


def test_reset_is_deterministic_and_in_space(env):
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        assert set(obs) <= CHARSET and all(k in info for k in INFO_KEYS)
        assert env.reset(seed=seed) == (obs, info)
        assert info["task"] == obs and info["admissible_actions"] is None
    assert len({env.reset(seed=s)[0] for s in range(20)}) > 15


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_expert_solves_every_family(family):
    env = TIRMathEnv(families=[family], timeout=2.0, memory_mb=1024)
    for seed in range(2):
        reward, info = _play_expert(env, seed)
        assert reward == 1.0 and info["won"] and info["action_is_valid"], env.problem
        assert info["turn"] == 2  # code turn, then the boxed answer


def test_wrong_answer_and_boxed_in_output(env):
    env.reset(seed=3)
    gold = env.problem.answer
    obs, reward, terminated, truncated, info = env.step("\\boxed{" + gold + " + 1}")
    assert (reward, terminated, info["won"]) == (0.0, True, False)
    env.reset(seed=3)
    code = f"print(r'\\boxed{{{gold}}}')"
    obs, reward, terminated, truncated, info = env.step(f"```python\n{code}\n```")
    assert terminated and reward == 1.0 and info["answer"] == gold


def test_turn_cut_after_first_code_block(env):
    env.reset(seed=4)
    obs, reward, terminated, truncated, info = env.step(
        "```python\nprint(1)\n```\n```python\nprint(2)\n```\nso \\boxed{999}")
    assert obs == "\nCode execution result: 1\n" and not terminated and info["answer"] is None


def test_turn_limit_and_output_truncation():
    env = TIRMathEnv(max_turns=2, max_output_chars=10)
    env.reset(seed=0)
    obs, _, terminated, truncated, _ = env.step("```python\nprint('a' * 100)\n```")
    assert obs == "\nCode execution result: " + "a" * 10 + "...\n" and not (terminated or truncated)
    obs, reward, terminated, truncated, info = env.step("```python\nprint(1 / 0)\n```")
    assert obs == "\nCode execution result: ZeroDivisi...\n"  # the error line is cut like stdout
    assert truncated and not terminated and reward == 0.0
    with pytest.raises(EnvStateError, match="after the episode ended"):  # the arena_envs contract
        env.step("\\boxed{1}")


@pytest.mark.parametrize("code", ["raise ValueError('\\u202e' + 'e' * 100_000)", "print('\\u2066o' * 100_000)",
                                  "x = ['\\u200b' * 10**5 for _ in range(10**6)]",
                                  "import sys\nsys.stdout.write('\\ufeffz' * 2_000_000)",
                                  "import signal\nprint('\\u202ee' * 60_000, flush=True)\nsignal.raise_signal(11)",
                                  "import os\nprint('\\u200bx' * 30_000, flush=True)\nos._exit(255)"])
def test_every_result_path_is_bounded_and_clean(env, code):
    """Error line, stdout, memory, output-limit, crash and exit-code results: within ``max_observation_chars``,
    format characters gone."""
    env.reset(seed=0)
    obs, *_ = env.step(f"```python\n{code}\n```")
    assert len(obs) <= env.max_observation_chars <= 512 + 128
    assert not set(obs) & {"\u202e", "\u2066", "\u200b", "\ufeff"} and len(obs) > 40, obs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.text(max_size=300),
                 st.builds(lambda a, b: f"{a}```python\n{b}\n```", st.text(max_size=40), st.text(max_size=60))))
def test_arbitrary_text_never_raises(env, text):
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(text)
    assert isinstance(obs, str) and reward in (0.0, 1.0) and all(k in info for k in INFO_KEYS)
    if "```" not in text and "\\boxed" not in text:
        assert not info["action_is_valid"]
    if not info["action_is_valid"]:
        assert terminated and reward == 0.0


@pytest.mark.parametrize("action", ["", "   ", "I think the answer is 5.", "```python\nprint(1)"])
def test_invalid_actions_end_the_episode(env, action):
    obs, _ = env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step(action)
    assert not info["action_is_valid"] and terminated and reward == 0.0 and info["task"] != ""


def test_through_the_standard_wrapper_stack():
    wrappers = pytest.importorskip("wrappers")
    env = wrappers.make_env("ARL/TIRMath-v0")
    env.reset(seed=0)
    inner = env.unwrapped
    code_turn = "<think>use sympy</think><action>" + inner.expert_action() + "</action>"
    _, reward, terminated, _, info = env.step(code_turn)
    assert info["format_ok"] and info["action_is_valid"] and not terminated and reward == 0.0
    _, reward, terminated, _, info = env.step("<think>done</think><action>" + inner.expert_action() + "</action>")
    assert terminated and info["won"] and reward == 1.0
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("no tags at all \\boxed{1}")
    assert terminated and not info["action_is_valid"] and reward == pytest.approx(-0.1)


def test_prompt_instructions_mention_protocol(env):
    text = env.prompt_instructions()
    assert "```python" in text and "\\boxed{" in text


# --- data ------------------------------------------------------------------------------------------
def test_generator_is_seeded():
    a = [generate_problem(np.random.default_rng(7)) for _ in range(3)]
    b = [generate_problem(np.random.default_rng(7)) for _ in range(3)]
    assert a == b and a[0].source.startswith("synthetic/")


@pytest.mark.skipif(not GSM8K.exists(), reason=f"GSM8K test file not found at {GSM8K}")
def test_gsm8k_loader_on_real_file():
    problems = load_problems(GSM8K)
    assert len(problems) == 1319 and all(p.source == "gsm8k" for p in problems)
    assert problems[0].answer == "18" and "ducks" in problems[0].question
    assert all(p.answer.lstrip("-").replace(".", "", 1).isdigit() for p in problems)
    env = TIRMathEnv(GSM8K, split="all")
    obs, _ = env.reset(seed=0, options={"index": 0})
    _, reward, terminated, _, info = env.step("The answer is \\boxed{18}.")
    assert obs == problems[0].question and reward == 1.0 and info["won"]


def test_math_jsonl_and_parquet_loaders(tmp_path):
    math_file = tmp_path / "math500.jsonl"
    math_file.write_text("\n".join(json.dumps(r) for r in [
        {"problem": "What is 1/2 + 1/4?", "solution": "It is $\\boxed{\\frac{3}{4}}$.", "answer": "\\frac{3}{4}"},
        {"problem": "Compute 2+2.", "solution": "So \\boxed{4}.", "level": "Level 1", "type": "Algebra"},
        {"problem": "No answer here.", "solution": "none"},
    ]))
    problems = load_problems(math_file)
    assert [(p.answer, p.source) for p in problems] == [("\\frac{3}{4}", "math"), ("4", "math")]

    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    table = pa.table({"question": ["Find x.", "Find y."], "gt_answer": ["2", None],
                      "reward_model": [{"ground_truth": "2"}, {"ground_truth": "\\sqrt{2}"}]})
    pq.write_table(table, tmp_path / "train.parquet")
    problems = load_problems(tmp_path / "train.parquet")
    assert [(p.question, p.answer) for p in problems] == [("Find x.", "2"), ("Find y.", "\\sqrt{2}")]
    env = TIRMathEnv(problems, split="all")
    env.reset(seed=0, options={"index": 1})
    assert env.step("\\boxed{2^{1/2}}")[1] == 1.0


def test_bad_sources_fail_clearly(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no problems"):
        load_problems(empty)
    with pytest.raises(ValueError, match="unknown synthetic families"):
        TIRMathEnv(families=["nope"])
    with pytest.raises(ValueError):
        TIRMathEnv([Problem("q", "1", "x")], split="all", max_turns=0)
