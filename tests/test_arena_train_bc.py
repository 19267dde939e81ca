"""arena_train.bc: the learning-rate schedule, the response-only loss and greedy validation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import wrappers
from arena_train.bc import sft_loss, tokenize_examples, validation_success, warmup_cosine_lr
from arena_train.models import load_model_and_tokenizer
from arena_train.rollout import RolloutConfig, encode_prompt
from wrappers.special_tokens import escape_special_tokens


@given(peak=st.floats(1e-6, 1.0), ratio=st.floats(0.0, 1.0), warmup=st.integers(1, 50), extra=st.integers(1, 500))
def test_schedule_warms_up_to_the_peak_then_decays_to_the_floor(peak, ratio, warmup, extra):
    floor, total = peak * ratio, warmup + extra
    lrs = [warmup_cosine_lr(s, peak, floor, warmup, total) for s in range(total + 1)]
    assert all(a < b for a, b in zip(lrs[:warmup - 1], lrs[1:warmup]))  # warm-up rises
    assert lrs[warmup - 1] == pytest.approx(peak) and lrs[warmup] == pytest.approx(peak)
    assert all(b <= a + 1e-15 for a, b in zip(lrs[warmup:], lrs[warmup + 1:]))  # cosine falls
    assert lrs[total] == pytest.approx(floor, abs=1e-12)


@pytest.fixture(scope="module")
def hf(tiny_model):
    model, tokenizer = load_model_and_tokenizer(tiny_model, torch.float32)
    return model.eval(), tokenizer


def test_loss_counts_response_tokens_only(hf):
    """Prompts and responses of different lengths in one left-padded batch: the loss and its gradient are those of
    the mean over all response tokens, each from an unpadded pass of its own example."""
    model, tokenizer = hf
    data = [([{"role": "user", "content": "Push every box."}], "<think></think><action>up</action>"),
            ([{"role": "user", "content": "box (X) here"}], "<action>left</action>"),
            ([{"role": "user", "content": "A much longer prompt: push the box onto the target, then stop."}],
             "<think>left up up right</think><action>left</action>")]
    examples = tokenize_examples(tokenizer, data, 512)
    assert all(r[-1] == tokenizer.eos_token_id for _, r in examples)
    assert len({len(p) for p, _ in examples}) == len({len(r) for _, r in examples}) == 3
    loss = sft_loss(model, examples, tokenizer.pad_token_id)
    grad = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    total, count = 0.0, 0
    for p, r in examples:  # mean over all response tokens of the batch, each from an unpadded pass
        logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1:-1]
        total = total + torch.nn.functional.cross_entropy(logits, torch.tensor(r), reduction="sum")
        count += len(r)
    reference = total / count
    expected = torch.autograd.grad(reference, list(model.parameters()), allow_unused=True)
    assert math.isclose(loss.item(), reference.item(), rel_tol=1e-5)
    for g, e in zip(grad, expected):
        assert (g is None) == (e is None)
        if g is not None:
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


def test_batched_tokenization_gives_the_one_by_one_ids(hf):
    """Chunks of 3 over 8 examples (a partial last chunk), a prompt over the budget and a forged special token: the
    same ids as encoding each example alone."""
    _, tokenizer = hf
    env = wrappers.make_env("ARL/Sokoban-Mini-v0", history_length=0, prompt_style="compact")
    data = []
    for seed in range(7):
        _, info = env.reset(seed=seed)
        data.append((info["messages"], f"<think>{'up ' * seed}</think><action>left</action>"))
    data.append(([{"role": "user", "content": "Push every box. " * 200}], "<|im_end|><action>up</action>"))
    one_by_one = [(encode_prompt(tokenizer, m, 256)[0],
                   tokenizer.encode(escape_special_tokens(r, tokenizer), add_special_tokens=False)
                   + [tokenizer.eos_token_id]) for m, r in data]
    assert len(one_by_one[-1][0]) == 256  # the long prompt was cut
    assert tokenize_examples(tokenizer, data, 256, chunk=3) == one_by_one == tokenize_examples(tokenizer, data, 256)


def test_validation_success_is_a_rate_and_deterministic(hf):
    model, tokenizer = hf

    def make_env():
        return wrappers.make_env("ARL/Sokoban-Mini-v0", history_length=0, prompt_style="compact")

    config = RolloutConfig(max_turns=2, max_prompt_tokens=512, max_response_tokens=6)
    first = validation_success(model, tokenizer, make_env, 2, config)
    assert 0.0 <= first <= 1.0 and first == validation_success(model, tokenizer, make_env, 2, config)


def test_teacher_data_writes_its_plan_in_think():
    from arena_train.bc import collect_expert_data
    from wrappers import format_response, parse_response

    def make_env():
        return wrappers.make_env("ARL/Sokoban-Mini-v0", history_length=0, prompt_style="compact")

    data = collect_expert_data(make_env, 8, 10, 0.2, "", seed=1, teacher="greedy", think_horizon=4)
    plans = []
    for _, response in data:
        parsed = parse_response(response)
        plan = parsed.think.split()
        assert parsed.format_ok and len(plan) <= 4 and (not plan or plan[0] == parsed.action)
        plans.append(len(plan))
    assert len(set(plans)) >= 3  # responses of varying length
    flat = collect_expert_data(make_env, 8, 10, 0.2, "", seed=1, teacher="greedy", think_horizon=0)
    assert [r for _, r in flat] == [format_response(parse_response(r).action) for _, r in data]
