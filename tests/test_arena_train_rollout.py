"""arena_train.rollout: prompt encoding, task seeds and row collection over a real group rollout."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import wrappers
from arena_train.backends import HFBackend
from arena_train.models import load_model_and_tokenizer
from arena_train.rollout import (
    EVAL_SEED_OFFSET,
    RolloutConfig,
    collect_rows,
    encode_prompt,
    fit_prompt,
    fit_prompts,
    held_out_seeds,
    require_prompt_fits,
    task_seeds,
)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), iteration=st.integers(1, 500), num_groups=st.integers(1, 16),
       world=st.integers(1, 4), attempt=st.integers(0, 3))
def test_task_seeds_split_over_ranks_below_the_held_out_range(seed, iteration, num_groups, world, attempt):
    shares = [task_seeds(seed, iteration, num_groups, rank, world, attempt) for rank in range(world)]
    everything = task_seeds(seed, iteration, num_groups, 0, 1, attempt)
    assert len(everything) == num_groups and sorted(sum(shares, [])) == sorted(everything)
    assert all(0 <= s < EVAL_SEED_OFFSET for s in everything)
    assert everything == task_seeds(seed, iteration, num_groups, 0, 1, attempt)  # deterministic


def test_task_seeds_differ_between_iterations_and_attempts():
    base = task_seeds(1, 1, 8, 0, 1)
    assert base != task_seeds(1, 2, 8, 0, 1) and base != task_seeds(1, 1, 8, 0, 1, attempt=1)


@given(n=st.integers(1, 50), world=st.integers(1, 4))
def test_held_out_seeds_partition_the_evaluation_range(n, world):
    shares = [held_out_seeds(n, rank, world) for rank in range(world)]
    assert sorted(sum(shares, [])) == [EVAL_SEED_OFFSET + k for k in range(n)]


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model):
    model, tokenizer = load_model_and_tokenizer(tiny_model, torch.float32)
    return model.eval(), tokenizer


def test_encode_prompt_cuts_the_middle_keeping_instructions_and_generation_prompt(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    messages = [{"role": "user", "content": "Push every box (X) onto a target (O). " * 20}]
    full, cut = encode_prompt(tokenizer, messages, 10_000)
    assert not cut and full == list(tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
    short, cut = encode_prompt(tokenizer, messages, 16)
    assert cut and short == full[:8] + full[-8:]  # the start (role, task) and the end (generation prompt) stay
    odd, _ = encode_prompt(tokenizer, messages, 7)
    assert odd == full[:3] + full[-4:]


def history_env(history_length: int = 3):
    return wrappers.make_env("ARL/Sokoban-Mini-v0", history_length=history_length, prompt_style="full")


def played(env, steps: int):
    """(messages, shorter variants) after ``steps`` moves."""
    _, info = env.reset(seed=3)
    for _ in range(steps):
        _, _, _, _, info = env.step("<think></think><action>up</action>")
    return info["messages"], info["shorter_messages"]


def test_prompt_history_offers_variants_without_the_oldest_pairs():
    messages, shorter = played(history_env(3), 4)
    assert len(shorter) == 3
    user = messages[-1]["content"]
    assert "[Observation 2:" in user and "[Observation 4:" in user
    assert "[Observation 2:" not in shorter[0][-1]["content"] and "[Observation 3:" in shorter[0][-1]["content"]
    assert "[Observation" not in shorter[-1][-1]["content"]
    for variant in shorter:  # the instructions (system) and the task stay in every variant
        assert variant[0] == messages[0] and "Your task:" in variant[-1]["content"]
    assert played(history_env(0), 2)[1] == []


def test_fit_prompt_drops_the_oldest_history_first(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    messages, shorter = played(history_env(3), 4)
    variants = [messages, *shorter]
    lengths = [len(encode_prompt(tokenizer, v, 10**6)[0]) for v in variants]
    assert lengths == sorted(lengths, reverse=True) and len(set(lengths)) == 4
    assert fit_prompt(tokenizer, variants, lengths[0]) == (encode_prompt(tokenizer, messages, 10**6)[0], 0, False)
    ids, dropped, cut = fit_prompt(tokenizer, variants, lengths[0] - 1)
    assert (len(ids), dropped, cut) == (lengths[1], 1, False)
    ids, dropped, cut = fit_prompt(tokenizer, variants, lengths[3])
    assert (len(ids), dropped, cut) == (lengths[3], 3, False)
    ids, dropped, cut = fit_prompt(tokenizer, variants, lengths[3] - 5)  # even without history: middle cut
    assert (len(ids), dropped, cut) == (lengths[3] - 5, 3, True)
    with pytest.raises(ValueError):
        fit_prompt(tokenizer, [], 10)


@pytest.mark.parametrize("budget", [10**6, 700, 640, 560, 300])
def test_batched_fitting_gives_each_prompt_its_own_fit(model_and_tokenizer, budget):
    """``fit_prompts`` over prompts with 0-4 history pairs (all of them, some or none dropped, middle cuts) equals
    ``fit_prompt`` per prompt, which equals a template call per variant."""
    _, tokenizer = model_and_tokenizer
    variants = [[m, *shorter] for m, shorter in (played(history_env(3), k) for k in range(5))]

    def alone(vs):
        for dropped, messages in enumerate(vs):
            ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                     return_dict=True)["input_ids"])
            if len(ids) <= budget:
                return ids, dropped, False
        head = budget // 2
        return ids[:head] + ids[len(ids) - (budget - head):], len(vs) - 1, True

    expected = [alone(vs) for vs in variants]
    assert fit_prompts(tokenizer, variants, budget) == expected
    assert [fit_prompt(tokenizer, vs, budget) for vs in variants] == expected
    assert len({(d, c) for _, d, c in expected}) > 1 or budget == 10**6
    assert fit_prompts(tokenizer, [], budget) == []


def test_collect_rows_counts_dropped_history_pairs(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    messages, shorter = played(history_env(2), 0)
    first = len(encode_prompt(tokenizer, messages, 10**6)[0])
    rollout = wrappers.GroupRollout(lambda: history_env(2), 1, 1)
    config = RolloutConfig(max_turns=4, max_prompt_tokens=first + 40, max_response_tokens=4)
    stats: dict[str, float] = defaultdict(float)
    torch.manual_seed(0)
    rows, _ = collect_rows(HFBackend(model, tokenizer), tokenizer, rollout, [3], config, stats)
    assert len(rows) == 4 and stats["dropped_history"] > 0
    assert all(len(r.prompt_ids) <= first + 40 for r in rows)
    assert stats["truncated_prompts"] == 0
    for row in rows:  # a whole prompt, minus history: the instructions and the task are there
        text = tokenizer.decode(row.prompt_ids)
        assert "expert agent" in text and "Your task:" in text and text.endswith("assistant\n")


def test_a_first_prompt_over_the_budget_stops_before_training(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    env = history_env(2)
    messages, _ = played(env, 0)
    n = len(encode_prompt(tokenizer, messages, 10**6)[0])
    require_prompt_fits(tokenizer, env, n, seed=3)
    with pytest.raises(SystemExit, match=f"has {n} tokens, more than --max-prompt-tokens {n - 1}"):
        require_prompt_fits(tokenizer, env, n - 1, seed=3)


def make_env():
    return wrappers.make_env("ARL/Sokoban-Mini-v0", history_length=0, prompt_style="compact")


def test_collect_rows_one_row_per_turn_with_episode_outcomes(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    rollout, id_offset = wrappers.GroupRollout(make_env, 2, 2), 100
    config = RolloutConfig(max_turns=3, max_prompt_tokens=512, max_response_tokens=8, temperature=1.0)
    stats: dict[str, float] = defaultdict(float)
    torch.manual_seed(0)
    rows, episodes = collect_rows(HFBackend(model, tokenizer), tokenizer, rollout, [5, 6], config, stats,
                                  id_offset=id_offset)
    assert len(episodes) == 4 and len(rows) == sum(ep.length for ep in episodes)
    assert stats["gen_tokens"] == sum(len(r.response_ids) for r in rows) > 0
    for row in rows:
        ep = episodes[row.episode - id_offset]
        assert row.group - id_offset == ep.group and row.env_return == ep.env_return and row.won == ep.won
        assert 0 <= row.turn < 3 and 0 < len(row.response_ids) <= 8
    for e, ep in enumerate(episodes):  # turns of an episode are numbered 0..length-1
        assert sorted(r.turn for r in rows if r.episode == e + id_offset) == list(range(ep.length))
    by_group = defaultdict(set)
    for ep in episodes:
        by_group[ep.group].add(ep.task_seed)
    assert dict(by_group) == {0: {5}, 1: {6}}  # a group's episodes share the task


def test_greedy_collection_is_reproducible(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    config = RolloutConfig(max_turns=1, max_prompt_tokens=512, max_response_tokens=6)
    runs = []
    for _ in range(2):
        rows, _ = collect_rows(HFBackend(model, tokenizer), tokenizer, wrappers.GroupRollout(make_env, 2, 1), [1, 2],
                               config, defaultdict(float), greedy=True)
        runs.append([r.response_ids for r in rows])
    assert runs[0] == runs[1] and runs[0]
