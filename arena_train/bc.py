"""Behaviour cloning pieces shared by ``algos/sft.py`` and ``eval.mini_arena``: a noisy teacher's data, the
response-only loss, the learning-rate schedule, greedy validation and the saved model folder."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from arena_train.backends import HFBackend
from arena_train.chat import format_of
from arena_train.models import load_model_and_tokenizer
from arena_train.rollout import RolloutConfig, collect_rows, encode_prompts
from wrappers.special_tokens import escape_special_tokens

#: Validation seeds for BC checkpoint selection: disjoint from BC data (0..N) and from the held-out eval seeds.
VALIDATION_SEED_OFFSET = 900_000_000

Example = tuple[list[dict[str, str]], str]  # (chat messages, expert response text)


def collect_expert_data(env_fn: Callable, num_episodes: int, max_turns: int, random_action_prob: float,
                        think: str, seed: int, teacher: str = "expert", think_horizon: int = 0) -> list[Example]:
    """(chat messages, teacher response) for every state the noisy teacher visits on task seeds 0..N-1: it executes
    a random admissible action with probability ``random_action_prob`` (recovery states get labelled too).

    ``teacher="expert"`` labels with the env's ``expert_action()`` and puts ``think`` in every ``<think>``; any other
    name is a teacher of the env's ``teacher_plan`` (Sokoban: ``arena_envs.sokoban_teachers``), whose ``<think>``
    holds its plan of its next ``think_horizon`` moves (0: ``think``), so response lengths vary with the plan."""
    from wrappers import format_response

    env, rng, data = env_fn(), random.Random(seed), []
    for task_seed in range(num_episodes):
        _, info = env.reset(seed=task_seed)
        for _ in range(max_turns):
            if teacher == "expert":
                label, text = env.unwrapped.expert_action(), think
            else:
                label, plan = env.unwrapped.teacher_plan(teacher, think_horizon)
                text = " ".join(plan) if think_horizon > 0 else think
            data.append((info["messages"], format_response(label, text)))
            actions = info.get("admissible_actions") or [label]
            executed = rng.choice(actions) if rng.random() < random_action_prob else label
            _, _, terminated, truncated, info = env.step(format_response(executed, think))
            if terminated or truncated:
                break
    return data


def tokenize_examples(tokenizer, data: list[Example], max_prompt_tokens: int, chunk: int = 1024
                      ) -> list[tuple[list[int], list[int]]]:
    """(prompt ids with generation prompt, response ids + the template's end-of-turn token) per example: the ids
    ``encode_prompt`` and ``tokenizer.encode`` give one by one, in batched template and tokenizer calls of
    ``chunk`` examples (the per-call overhead was about a quarter of the tokenizing CPU time for the main job's
    28.5 k examples)."""
    out, end = [], format_of(tokenizer).terminator  # Gemma's <end_of_turn>, not its <eos>
    for start in range(0, len(data), chunk):
        part = data[start:start + chunk]
        prompts = encode_prompts(tokenizer, [messages for messages, _ in part], max_prompt_tokens)
        responses = tokenizer([escape_special_tokens(response, tokenizer) for _, response in part],
                              add_special_tokens=False, return_attention_mask=False)["input_ids"]
        out += [(prompt, list(ids) + [end]) for (prompt, _), ids in zip(prompts, responses)]
    return out


def sft_loss(model, examples: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    """Mean cross-entropy over the response tokens of ``examples`` ((prompt ids, response ids) pairs).

    Rows are left-padded, so every response ends in the last column and only the last R + 1 positions (R the
    longest response) go through the LM head (``logits_to_keep``): the prompt positions' logits, most of a
    row, are never computed. Position ids count real tokens only, as in an unpadded pass."""
    B, L, R = len(examples), max(len(p) + len(r) for p, r in examples), max(len(r) for _, r in examples)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    labels = torch.full((B, R), -100, dtype=torch.long)  # (B, R): the last R columns' tokens, responses only
    for b, (p, r) in enumerate(examples):
        ids[b, L - len(p) - len(r):], attn[b, L - len(p) - len(r):] = torch.tensor(p + r), 1
        labels[b, R - len(r):] = torch.tensor(r)
    device = next(model.parameters()).device
    positions = (attn.cumsum(-1) - 1).clamp(min=0)  # (B, L)
    logits = model(input_ids=ids.to(device), attention_mask=attn.to(device), position_ids=positions.to(device),
                   logits_to_keep=R + 1).logits[:, :-1]  # (B, R, V): columns L-R-1 .. L-2 predict L-R .. L-1
    return torch.nn.functional.cross_entropy(logits.reshape(B * R, -1).float(), labels.reshape(-1).to(device))


def warmup_cosine_lr(step: int, peak: float, floor: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warm-up to ``peak`` over ``warmup_steps``, then a cosine down to ``floor`` at ``total_steps``."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))


def validation_success(model, tokenizer, env_fn: Callable, num_episodes: int, config: RolloutConfig) -> float:
    """Greedy success rate on ``num_episodes`` validation seeds, through the training scripts' rollout code."""
    import wrappers

    rollout = wrappers.GroupRollout(env_fn, num_episodes, 1)
    seeds = [VALIDATION_SEED_OFFSET + k for k in range(num_episodes)]
    _, episodes = collect_rows(HFBackend(model, tokenizer), tokenizer, rollout, seeds, config, defaultdict(float),
                               greedy=True)
    return float(np.mean([e.won for e in episodes]))


def load_or_build_model(model_path: str, data: list[Example], env_id: str, tiny_size: str, seed: int):
    """(float32 model, tokenizer) to fine-tune: 'tiny' builds a fresh tiny Qwen3 (in ``arena_models``' cache)
    whose tokenizer is trained on the data's prompts; anything else goes through ``resolve_model_path``."""
    from arena_models import build_tiny_model, cache_dir, resolve_model_path

    if model_path == "tiny":
        prompts = {m[-1]["content"] for m, _ in data[:2000]} | {m[0]["content"] for m, _ in data[:10]}
        path = build_tiny_model(cache_dir() / f"sft-init-{env_id.replace('/', '_')}-{tiny_size}",
                                corpus=sorted(prompts), size=tiny_size, seed=seed)
    else:
        path = resolve_model_path(model_path)
    return load_model_and_tokenizer(str(path), torch.float32)


def save_model(model, tokenizer, out: Path, lora: bool) -> None:
    """A plain HF folder: LoRA adapters are merged, so the RL scripts need no peft."""
    (model.merge_and_unload() if lora else model).save_pretrained(out)
    tokenizer.save_pretrained(out)
