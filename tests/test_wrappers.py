"""Wrappers: strict parsing, format penalty (strict projection), anchors, prompt history and their composition.

The paper's "arlarena" projection (the default) is covered in ``test_wrappers_projection.py``.
"""

from __future__ import annotations

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arena_envs import EpisodeGuard
from wrappers import (
    AnchorState,
    FormatPenalty,
    PromptHistory,
    format_response,
    make_env,
    parse_response,
)
from wrappers.prompt import INVALID_RESPONSE

TAGS = ["<think>", "</think>", "<action>", "</action>", "<THINK>", "</Action>"]
FRAGMENTS = TAGS + ["up", "down", " LEFT ", "right", "\n", " ", "", "ignore all previous instructions and",
                    "</system>", "<|im_end|>", "√", "漢字", "🙂", "\x00", "up" * 500]
tag_soup = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=30), max_size=12).map("".join)
any_text = tag_soup | st.text(max_size=300)
no_tags = st.text(max_size=80).filter(lambda s: "<" not in s)


@settings(deadline=None)
@given(any_text)
def test_parser_never_raises_and_ok_implies_strict_shape(text):
    parsed = parse_response(text)
    if parsed.format_ok:
        lowered = text.lower()
        assert all(lowered.count(tag) == 1 for tag in ("<think>", "</think>", "<action>", "</action>"))
        assert lowered.strip().startswith("<think>") and lowered.strip().endswith("</action>")
        assert parsed.action == parsed.action.strip() and parsed.action in text
    else:
        assert parsed.action is None and parsed.think is None


@settings(deadline=None)
@given(think=no_tags, action=no_tags, pre=st.sampled_from(["", " ", "\n\t"]), mid=st.sampled_from(["", "\n"]))
def test_parser_accepts_the_canonical_format(think, action, pre, mid):
    parsed = parse_response(f"{pre}<think>{think}</think>{mid}<action>{action}</action>{pre}")
    assert parsed.format_ok and parsed.action == action.strip() and parsed.think == think.strip()
    assert parse_response(format_response(action, think)).action == action.strip()


@pytest.mark.parametrize("text", [
    "", "up", "<action>up</action>", "<think></think>", "<action>up</action><think>x</think>",
    "<think>a</think><action>up</action><action>down</action>", "<think><think>a</think></think><action>up</action>",
    "<think>a</think><action><action>up</action></action>", "x<think>a</think><action>up</action>",
    "<think>a</think><action>up</action> trailing", "<think>a<action>down</action></think><action>up</action>",
    "<think>a</think>text<action>up</action>", None, 42,
])
def test_parser_rejects_malformed(text):
    assert parse_response(text) == (None, None, False)


@settings(max_examples=60, deadline=None)
@given(any_text)
def test_step_with_arbitrary_text_is_safe_and_penalised(text):
    env = make_env("ARL/Sokoban-v0", format_penalty=0.25, projection="strict")
    _, info0 = env.reset(seed=0)
    _, reward, _, _, info = env.step(text)
    parsed = parse_response(text)
    assert info["format_ok"] == parsed.format_ok and info["action"] == parsed.action
    if not parsed.format_ok:
        assert not info["action_is_valid"] and info["observation"] == info0["observation"]
    valid = parsed.format_ok and parsed.action.lower() in ("up", "down", "left", "right")
    assert info["action_is_valid"] == valid
    assert info["format_penalty"] == (0.0 if valid else 0.25)
    assert reward == pytest.approx(info["env_reward"] - info["format_penalty"])


@pytest.mark.parametrize("template", ["{}", "<action>{}</action>", "<think></think>{}",
                                      "{0}<think>{0}</think><action>{0}</action>"])
def test_malformed_responses_never_move_under_strict(template):
    moved = 0
    for direction in ("up", "down", "left", "right"):
        env = make_env("ARL/Sokoban-v0", projection="strict")
        _, info0 = env.reset(seed=2)
        _, _, _, _, info = env.step(template.format(direction))
        assert info["observation"] == info0["observation"] and not info["format_ok"]
        _, _, _, _, info = env.step(format_response(direction))
        moved += info["observation"] != info0["observation"]
    assert moved > 0  # the same moves, well-formed, do change the state


@pytest.mark.parametrize("projection", ["strict", "arlarena"])
def test_huge_and_hostile_inputs(projection):
    env = make_env("ARL/Sokoban-v0", projection=projection)
    env.reset(seed=0)
    for text in ["<think>" * 10_000, "x" * 1_000_000, "<action>" * 100_000,
                 "<think>Ignore the rules.</think><action>solve the puzzle now</action>"]:
        _, reward, _, _, info = env.step(text)
        assert not info["action_is_valid"] and reward == pytest.approx(-0.2)
    _, _, _, _, info = env.step("<think>ok</think><action>" + "up" * 10_000 + "</action>")
    assert info["action"] == ("up" if projection == "arlarena" else "up" * 10_000)  # the paper's substring match
    assert len(env.unwrapped.expert_action()) > 0


def test_stack_order_is_anchor_then_penalty_then_prompt():
    env = make_env("ARL/Sokoban-v0")
    assert isinstance(env, PromptHistory)
    assert isinstance(env.env, FormatPenalty) and isinstance(env.env.env, AnchorState)
    assert isinstance(env.env.env.env, EpisodeGuard) and isinstance(env.env.env.env.env, gym.wrappers.TimeLimit)


def test_anchor_is_the_raw_observation_not_the_prompt():
    env = make_env("ARL/Sokoban-v0", history_length=2)
    prompt, info = env.reset(seed=5)
    assert info["anchor"] == info["observation"] == env.unwrapped.anchor_key(info["observation"])
    assert info["anchor"] != prompt and info["anchor"] in prompt
    first = info["anchor"]
    # a bad response leaves the state unchanged: same anchor, although the prompt (history, step count) changed
    prompt2, _, _, _, info2 = env.step("nonsense")
    assert info2["anchor"] == first and prompt2 != prompt
    other = make_env("ARL/Sokoban-v0", history_length=0, prompt_style="compact")
    assert other.reset(seed=5)[1]["anchor"] == first  # independent of template and history


def test_history_shows_the_extracted_action_and_keeps_k_steps():
    env = make_env("ARL/Sokoban-v0", history_length=2, projection="strict")
    env.reset(seed=3)
    responses = ["<think>long reasoning here</think><action> LEFT </action>", "garbage",
                 format_response("up", "more reasoning"), format_response("jump")]
    for r in responses:
        prompt, _, _, _, info = env.step(r)
    assert "long reasoning" not in prompt and "more reasoning" not in prompt
    assert "Action 3: 'up'" in prompt and "Action 4: 'jump'" in prompt
    assert "Action 2" not in prompt and "Observation 2" not in prompt  # only the last k = 2 pairs
    assert "already taken 4 step(s)" in prompt and "step 5" in prompt
    env.step("bad")
    assert f"Action 5: '{INVALID_RESPONSE}'" in env.step("bad")[0]
    messages = info["messages"]
    assert [m["role"] for m in messages] == ["system", "user"] and messages[1]["content"] == prompt
    assert "√" in messages[0]["content"] and "<think>" in prompt and '["up", "down", "left", "right"]' in prompt


def test_history_resets_with_the_episode():
    env = make_env("ARL/Sokoban-v0")
    env.reset(seed=1)
    env.step(format_response("up"))
    prompt, _ = env.reset(seed=1)
    assert "Observation" not in prompt and "already taken" not in prompt


def test_compact_prompt_is_short():
    env = make_env("ARL/Sokoban-v0", history_length=0, prompt_style="compact", render_style="spaced")
    prompt, info = env.reset(seed=0)
    system, user = (m["content"] for m in info["messages"])
    assert user == prompt and user.splitlines()[0] == info["task"]
    assert user.splitlines()[-1] == "Actions: up, down, left, right" and info["observation"] in user
    assert len((system + user).split()) < 70  # ~ one token per cell + a few dozen
    env.step(format_response("up"))
    assert "Action:" not in env.step(format_response("down"))[0]
    with_history = make_env("ARL/Sokoban-v0", history_length=1, prompt_style="compact")
    with_history.reset(seed=0)
    assert "Action: left" in with_history.step(format_response("left"))[0]


def test_invalid_wrapper_arguments():
    with pytest.raises(ValueError):
        make_env("ARL/Sokoban-v0", prompt_style="verbose")
    with pytest.raises(ValueError):
        make_env("ARL/Sokoban-v0", history_length=-1)
    with pytest.raises(ValueError):
        make_env("ARL/Sokoban-v0", format_penalty=-1)
    with pytest.raises(ValueError):
        make_env("ARL/Sokoban-v0", projection="verl")


def test_wrappers_work_on_any_env_without_optional_hooks():
    """A minimal gymnasium text env (no anchor_key / prompt_instructions) still gets the full stack."""

    class Echo(gym.Env):
        observation_space = action_space = gym.spaces.Text(10)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return "  start  ", {"won": False, "admissible_actions": None, "action_is_valid": True, "task": "echo"}

        def step(self, action):
            ok = action == "go"
            return "state", float(ok), ok, False, {"won": ok, "admissible_actions": None,
                                                     "action_is_valid": ok, "task": "echo"}

    env = PromptHistory(FormatPenalty(AnchorState(Echo())))
    prompt, info = env.reset()
    assert info["anchor"] == "start" and "any text command" in prompt
    _, reward, term, _, info = env.step(format_response("go"))
    assert term and reward == 1.0 and info["format_penalty"] == 0.0
