"""arena_train.trajectory: one row per episode on a real tiny model and env; masks, GAE over the concatenated
trajectory against a direct formula, and the step/trajectory equivalence of a single-turn episode."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import wrappers
from arena_train import losses
from arena_train.backends import HFBackend
from arena_train.batching import make_batch, score_rows, sequence_logprobs
from arena_train.models import load_model_and_tokenizer
from arena_train.rewards import segment_scores, token_rewards
from arena_train.rollout import RolloutConfig, Row, TurnSpan, collect_rows, encode_prompt
from arena_train.trajectory import env_turn_ids, loss_masks
from tests.conftest import load_script

ppo = load_script("ppo")


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model):
    model, tokenizer = load_model_and_tokenizer(tiny_model, torch.float32)
    return model.eval(), tokenizer


class RecordingBackend(HFBackend):
    """The real HF backend, remembering every context it generated from."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.contexts: list[list[int]] = []

    def _generate(self, prompts, *args, **kwargs):  # generate and generate_scored alike
        self.contexts += [list(p) for p in prompts]
        return super()._generate(prompts, *args, **kwargs)


def make_env():
    return wrappers.make_env("ARL/Sokoban-Mini-v0", history_length=0, prompt_style="compact")


def test_env_turn_ids_continue_the_chat_template(model_and_tokenizer):
    _, tok = model_and_tokenizer
    first = [{"role": "system", "content": "Answer."}, {"role": "user", "content": "Push every box"}]
    prompt = list(tok.apply_chat_template(first, add_generation_prompt=True, tokenize=True, return_dict=True)
                  ["input_ids"])
    response = list(tok("right", add_special_tokens=False)["input_ids"])
    full = list(tok.apply_chat_template(first + [{"role": "assistant", "content": "right"},
                                                 {"role": "user", "content": "a target (O)"}],
                                        add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
    assert prompt + response + [tok.eos_token_id] + env_turn_ids(tok, "a target (O)", True) == full
    # a response cut before its end token gets the end marker from the env's tokens
    assert prompt + response + env_turn_ids(tok, "a target (O)", False) == full


def test_trajectory_rows_are_the_sequences_the_policy_saw(model_and_tokenizer):
    model, tok = model_and_tokenizer
    backend = RecordingBackend(model, tok)
    rollout = wrappers.GroupRollout(make_env, 2, 2)
    config = RolloutConfig(max_turns=3, max_prompt_tokens=4096, max_response_tokens=8, temperature=1.0,
                           row_layout="trajectory")
    torch.manual_seed(0)
    stats = defaultdict(float)
    rows, episodes = collect_rows(backend, tok, rollout, [3, 4], config, stats)
    assert [r.episode for r in rows] == [0, 1, 2, 3] and [r.group for r in rows] == [0, 0, 1, 1]
    assert stats["truncated_prompts"] == 0
    contexts = iter(backend.contexts)
    by_turn = defaultdict(list)  # generate is called once per turn over the active episodes, in episode order
    for k, row in enumerate(rows):
        for t, span in enumerate(row.turns):
            by_turn[t].append((k, span))
    for t in sorted(by_turn):
        for k, span in by_turn[t]:
            assert next(contexts) == rows[k].prompt_ids + rows[k].response_ids[:span.start]
    for row, ep in zip(rows, episodes):
        mask = row.loss_mask
        assert len(row.turns) == ep.length and len(mask) == len(row.response_ids)
        policy = np.zeros(len(mask))
        for span in row.turns:
            policy[span.start:span.end] = 1
        np.testing.assert_array_equal(mask, policy)  # exactly the generated tokens are trained
        assert row.turns[-1].end == len(row.response_ids)  # nothing after the last response
        assert sum(s.env_reward for s in row.turns) == pytest.approx(ep.env_return)
        env_text = tok.decode([i for i, m in zip(row.response_ids, mask) if m == 0])
        assert env_text.count("Push every box") == len(row.turns) - 1  # one observation between two turns
    assert stats["gen_tokens"] == sum(int(r.loss_mask.sum()) for r in rows)
    assert max(len(r.turns) for r in rows) > 1  # a random policy does not solve a room in one move


def test_env_tokens_are_out_of_the_loss_kl_and_entropy(model_and_tokenizer):
    model, tok = model_and_tokenizer
    rollout = wrappers.GroupRollout(make_env, 1, 2)
    config = RolloutConfig(max_turns=3, max_prompt_tokens=4096, max_response_tokens=6, row_layout="trajectory")
    rows, _ = collect_rows(HFBackend(model, tok), tok, rollout, [5], config, defaultdict(float), greedy=True)
    assert all((r.loss_mask == 0).any() for r in rows)
    batch = make_batch(rows, tok.pad_token_id, "cpu")
    for b, row in enumerate(rows):
        np.testing.assert_array_equal(batch["mask"][b, :len(row.response_ids)].numpy(), row.loss_mask)
    score_rows(model, model, rows, micro_batch_size=4, temperature=1.0, pad_id=tok.pad_token_id, device="cpu",
               stats=defaultdict(float))
    with torch.no_grad():
        logp, entropy = sequence_logprobs(model, batch, 1.0)
    for b, row in enumerate(rows):  # the row's mean entropy is over the policy's tokens only
        policy = torch.as_tensor(row.loss_mask) > 0
        assert row.entropy == pytest.approx(float(entropy[b, :len(policy)][policy].mean()), rel=1e-5)
    # the KL and entropy terms aggregate through the mask: poisoning every env token changes neither
    env = batch["mask"] == 0
    poisoned = torch.where(env, torch.full_like(logp, 50.0), logp)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        ref = logp - 0.3
        for x, y in ((losses.kl_penalty(poisoned, ref, "k3"), losses.kl_penalty(logp, ref, "k3")),
                     (torch.where(env, 1e6, entropy), entropy)):
            assert float(losses.agg_loss(x, batch["mask"], mode)) == pytest.approx(
                float(losses.agg_loss(y, batch["mask"], mode)))


def direct_gae(rewards, values, mask, gamma, lam):
    """A_t = sum_l (gamma lam)^l delta_{t_l} over the policy tokens t_0 = t < t_1 < ... only (env tokens are not
    steps), delta_{t_j} = r_{t_j} + gamma V_{t_{j+1}} - V_{t_j}, V = 0 after the last policy token."""
    idx = np.flatnonzero(mask)
    v_next = np.append(values[idx][1:], 0.0)
    delta = rewards[idx] + gamma * v_next - values[idx]
    adv = np.zeros(len(rewards))
    for j, t in enumerate(idx):
        adv[t] = sum((gamma * lam) ** m * d for m, d in enumerate(delta[j:]))
    return adv


@settings(max_examples=60, deadline=None)
@given(turns=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 3), st.floats(-1, 1), st.sampled_from([0, .1])),
                      min_size=1, max_size=4),
       gamma=st.floats(0.5, 1.0), lam=st.floats(0.0, 1.0), density=st.sampled_from(["sparse", "dense"]),
       seed=st.integers(0, 1000))
def test_gae_over_the_concatenated_trajectory_matches_the_direct_formula(turns, gamma, lam, density, seed):
    spans, mask = [], []
    for k, (n_policy, n_env, reward, penalty) in enumerate(turns):
        spans.append(TurnSpan(len(mask), len(mask) + n_policy, reward, penalty))
        mask += [1] * n_policy + ([0] * n_env if k < len(turns) - 1 else [])
    row = Row(group=0, episode=0, turn=0, prompt_ids=[1], response_ids=[7] * len(mask), step_reward=0.0,
              format_penalty=0.0, format_ok=True, action_is_valid=True, anchor=None, won=False,
              env_return=sum(r for _, _, r, _ in turns), loss_mask=np.array(mask, np.float32), turns=spans)
    rewards = token_rewards([row], density)[0]
    values = np.random.default_rng(seed).normal(size=len(mask)).astype(np.float32)
    adv, returns = ppo.gae(torch.tensor(rewards)[None], torch.tensor(values)[None],
                           torch.tensor(loss_masks([row])[0])[None], gamma, lam)
    expected = direct_gae(rewards, values, np.array(mask), gamma, lam)
    policy = np.array(mask) == 1
    np.testing.assert_allclose(adv[0].numpy()[policy], expected[policy], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(returns[0].numpy()[policy], (expected + values)[policy], rtol=1e-4, atol=1e-4)


def test_single_turn_layouts_are_identical(model_and_tokenizer):
    """One turn per episode: same rows, same batch, same scores, same PPO token rewards in both layouts."""
    model, tok = model_and_tokenizer
    out = {}
    for layout in ("step", "trajectory"):
        rollout = wrappers.GroupRollout(make_env, 2, 2)
        config = RolloutConfig(max_turns=1, max_prompt_tokens=512, max_response_tokens=6, row_layout=layout)
        out[layout], _ = collect_rows(HFBackend(model, tok), tok, rollout, [11, 12], config, defaultdict(float),
                                      greedy=True)
    step, traj = out["step"], out["trajectory"]
    assert len(step) == len(traj) == 4
    for a, b in zip(step, traj):
        assert (a.group, a.episode, a.prompt_ids, a.response_ids) == (b.group, b.episode, b.prompt_ids, b.response_ids)
        assert (a.step_reward, a.format_penalty, a.env_return, a.won) == (b.step_reward, b.format_penalty,
                                                                          b.env_return, b.won)
    batches = [make_batch(rows, tok.pad_token_id, "cpu") for rows in (step, traj)]
    for key in batches[0]:
        torch.testing.assert_close(batches[0][key], batches[1][key])
    for density in ("sparse", "dense"):
        np.testing.assert_allclose(segment_scores(step, density).score, segment_scores(traj, density).score)
        for x, y in zip(token_rewards(step, density), token_rewards(traj, density)):
            np.testing.assert_allclose(x, y)


def test_unknown_layout_is_a_clear_error(model_and_tokenizer):
    model, tok = model_and_tokenizer
    config = RolloutConfig(max_turns=1, max_prompt_tokens=64, max_response_tokens=2, row_layout="episode")
    with pytest.raises(ValueError, match="row_layout"):
        collect_rows(HFBackend(model, tok), tok, wrappers.GroupRollout(make_env, 1, 1), [0], config, {})


def test_over_budget_contexts_drop_their_oldest_turns_and_keep_the_first_prompt(model_and_tokenizer):
    """A context over --max-prompt-tokens keeps the whole first prompt (instructions, task) and its latest turns;
    the turns left out are counted. A budget of twice the first prompt forces drops."""
    from arena_train.trajectory import fit_context

    model, tok = model_and_tokenizer
    backend = RecordingBackend(model, tok)
    rollout = wrappers.GroupRollout(make_env, 2, 2)
    first, _ = encode_prompt(tok, make_env().reset(seed=3)[1]["messages"], 10_000)
    budget = 2 * len(first)  # the first prompt and about one turn (an observation is shorter than the prompt)
    config = RolloutConfig(max_turns=8, max_prompt_tokens=budget, max_response_tokens=8, temperature=1.0,
                           row_layout="trajectory")
    torch.manual_seed(0)
    stats = defaultdict(float)
    rows, _ = collect_rows(backend, tok, rollout, [3, 4], config, stats)
    assert stats["dropped_history"] > 0 and stats["truncated_prompts"] == 0
    assert all(len(c) <= budget for c in backend.contexts)
    assert rows[0].prompt_ids == first
    starts = {tuple(r.prompt_ids) for r in rows}  # every context starts with a whole first prompt
    assert all(any(c[:len(p)] == list(p) for p in starts) for c in backend.contexts)
    # fit_context itself: drops whole turns from the oldest, then cuts the middle as a last resort
    prompt, body = [1, 2, 3], list(range(10, 30))
    assert fit_context(prompt, body, [0, 5, 12], 100) == (prompt + body, 0, False)
    assert fit_context(prompt, body, [0, 5, 12], 3 + 15) == (prompt + body[5:], 1, False)
    assert fit_context(prompt, body, [0, 5, 12], 3 + 8) == (prompt + body[12:], 2, False)
    context, dropped, cut = fit_context(prompt, body, [0, 5, 12], 6)
    assert cut and dropped == 2 and context == [1, 2, 3] + body[-3:]


def test_stop_reasons_of_turns_and_episodes(model_and_tokenizer):
    """A 2-token limit cuts nearly every response (max_response_tokens); a prompt cut beyond history is
    context_overflow; every episode ends with one reason; the fractions of each kind sum to 1."""
    from arena_train.logger import stop_metrics

    class OneProcess:
        device = torch.device("cpu")

        def reduce(self, t, reduction="sum"):
            return t

    model, tok = model_and_tokenizer
    for layout in ("step", "trajectory"):
        rollout = wrappers.GroupRollout(make_env, 2, 2)
        torch.manual_seed(0)
        stats = defaultdict(float)
        config = RolloutConfig(max_turns=3, max_prompt_tokens=4096, max_response_tokens=2, temperature=1.0,
                               row_layout=layout)
        rows, episodes = collect_rows(HFBackend(model, tok), tok, rollout, [3, 4], config, stats)
        metrics = stop_metrics(OneProcess(), stats)
        turns = sum(stats[f"stop/{r}"] for r in ("eos", "turn_end", "max_response_tokens", "context_overflow"))
        assert turns == sum(e.length for e in episodes) and stats["stop/max_response_tokens"] >= turns - 1
        assert metrics["stop/max_response_tokens"] > 0.5
        assert sum(v for k, v in metrics.items() if k.startswith("stop/episode/")) == pytest.approx(1.0)
        assert all(e.stop in ("won", "terminated", "max_turns", "truncated") for e in episodes)
        assert {r.stop for r in rows} <= {"eos", "max_response_tokens"}
    rollout = wrappers.GroupRollout(make_env, 1, 2)
    stats = defaultdict(float)
    collect_rows(HFBackend(model, tok), tok, rollout, [3], RolloutConfig(max_turns=1, max_prompt_tokens=20,
                                                                        max_response_tokens=2), stats)
    assert stats["stop/context_overflow"] == 2 and stats["truncated_prompts"] == 2
