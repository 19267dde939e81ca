"""The default setting leaves room for length- and token-level ideas: ``algos/sft.py``'s default data (the greedy
teacher's plan in ``<think>``) gives responses whose length varies with the state, so a length-penalty fork's
advantages and GRPO_ST's update differ from GRPO's. With the optimal expert's empty ``<think>`` (the earlier
default) every response has the same tokens' count and both coincide with GRPO: the controls below."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
from conftest import load_script

import wrappers
from arena_train.bc import collect_expert_data, tokenize_examples

SFT, GRPO = load_script("sft"), load_script("grpo")
GROUP = 8  # rows per group, as the RL scripts' --group-size


def response_lengths(tokenizer, **overrides) -> np.ndarray:
    """Token counts (end token included) of the BC labels of 6 episodes of sft.py's defaults (``overrides``
    replace some of them), the counts the RL update sees once the cloned model reproduces them."""
    args = SFT.Args(**overrides)
    (env_id,) = args.env_id
    make_env = partial(wrappers.make_env, env_id, history_length=args.history_length,
                       format_penalty=args.format_penalty, prompt_style=args.prompt_style)
    data = collect_expert_data(make_env, 6, args.max_turns, args.random_action_prob, args.think, args.seed,
                               teacher=args.teacher, think_horizon=args.think_horizon)
    examples = tokenize_examples(tokenizer, data, args.max_prompt_tokens)[:5 * GROUP]
    return np.array([len(response) for _, response in examples])


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def default_lengths(tokenizer) -> np.ndarray:
    return response_lengths(tokenizer)


@pytest.fixture(scope="module")
def expert_lengths(tokenizer) -> np.ndarray:
    return response_lengths(tokenizer, teacher="expert")


def rows(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scores, group ids, episode ids): one-turn episodes in groups of GROUP, half of each group solved."""
    n = len(lengths)
    scores = np.tile([1.0, 0.0], n // 2 + 1)[:n] * 10.0
    return scores, np.arange(n) // GROUP, np.arange(n)


def length_penalty_advantages(lengths: np.ndarray, coef: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """(GRPO's advantages, a fork's that subtracts ``coef`` per response token from the score) on the same rows."""
    scores, groups, episodes = rows(lengths)
    return (GRPO.compute_advantages(scores, groups, episodes),
            GRPO.compute_advantages(scores - coef * lengths, groups, episodes))


def test_default_responses_vary_in_length(default_lengths, expert_lengths):
    assert len(set(default_lengths.tolist())) >= 3, default_lengths
    assert len(set(expert_lengths.tolist())) == 1  # the control: the expert's labels are all alike


def test_length_penalty_changes_the_advantages(default_lengths, expert_lengths):
    grpo, fork = length_penalty_advantages(default_lengths)
    assert np.abs(grpo - fork).max() > 1e-2
    # within a group, the longer of two equally scored responses now gets the lower advantage
    scores, groups, _ = rows(default_lengths)
    for i in range(len(grpo)):
        for j in range(len(grpo)):
            if groups[i] == groups[j] and scores[i] == scores[j] and default_lengths[i] > default_lengths[j]:
                assert fork[i] < fork[j]
    np.testing.assert_allclose(*length_penalty_advantages(expert_lengths), atol=1e-9)  # the control


def policy_gradient(lengths: np.ndarray, agg_mode: str) -> torch.Tensor:
    """Gradient of grpo.py's policy loss with respect to the token log-probs of the rows (on-policy, ratio 1):
    the direction every parameter's gradient is a chain-rule image of."""
    scores, groups, episodes = rows(lengths)
    adv = torch.tensor(GRPO.compute_advantages(scores, groups, episodes), dtype=torch.float32)
    width = int(lengths.max())
    mask = (torch.arange(width)[None, :] < torch.as_tensor(lengths)[:, None]).float()  # (B, T)
    logp = torch.linspace(-2.0, -0.1, len(lengths) * width).reshape(len(lengths), width).requires_grad_()
    loss, _ = GRPO.policy_loss(logp, logp.detach(), adv[:, None].expand_as(mask) * mask, mask, agg_mode=agg_mode)
    loss.backward()
    return logp.grad


def test_grpo_st_update_differs_from_grpo(default_lengths, expert_lengths):
    grpo, grpo_st = (policy_gradient(default_lengths, mode) for mode in ("token-mean", "seq-mean-token-mean"))
    cosine = torch.nn.functional.cosine_similarity(grpo.flatten(), grpo_st.flatten(), dim=0)
    assert cosine < 0.999  # not the same direction rescaled: a different update
    torch.testing.assert_close(*(policy_gradient(expert_lengths, mode)  # the control: equal lengths, equal updates
                                 for mode in ("token-mean", "seq-mean-token-mean")))


@pytest.mark.parametrize(("flags", "message"), [({"teacher": "oracle"}, "--teacher 'oracle' is not one of"),
                                                ({"think_horizon": -1}, "--think-horizon must be >= 0")])
def test_sft_refuses_a_bad_teacher_flag_in_one_line(tmp_path, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        SFT.main(SFT.Args(output_dir=str(tmp_path / "bc"), **flags))
    assert message in str(exit_info.value) and "\n" not in str(exit_info.value)
