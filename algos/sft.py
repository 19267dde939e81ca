"""Behaviour cloning (SFT) initialisation for the RL scripts: `python algos/sft.py`.

ARLArena starts every RL run from a behaviour-cloned model (§1.3). This script
1. collects expert trajectories from any env's ``expert_action()`` through the same wrapper stack and
   prompt format as grpo.py, labelling the states visited while executing a random action with
   probability ``--random-action-prob`` (recovery states the expert alone never visits);
2. fine-tunes (full or LoRA) on ``<think>…</think><action>…</action>`` responses with the chat
   template, loss on response tokens only;
3. evaluates greedily on validation seeds every ``--eval-every`` steps and keeps the best checkpoint
   (BC learning is a phase transition: a fixed step budget can land just before it).

The saved folder is what ``grpo.py --model-path`` loads. ``--model-path tiny`` (default) builds a fresh
tiny Qwen3 whose tokenizer is trained on the collected prompts.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from grpo import HFBackend, collect_rows, encode_prompt

#: Validation seeds for checkpoint selection: disjoint from BC data (0..N) and from grpo's eval seeds.
VALIDATION_SEED_OFFSET = 900_000_000


@dataclass
class Args:
    env_id: str = "ARL/Sokoban-Mini-v0"
    """registered ARLArena env id"""
    model_path: str = "tiny"
    """'tiny' (fresh tiny Qwen3), 'smollm2', a local folder or a HF hub id"""
    tiny_size: str = "xs"
    """size of the fresh tiny model (xs, s, m)"""
    output_dir: str = "checkpoints/sft-sokoban-tiny"
    """where the best checkpoint is saved (a normal HF folder)"""
    num_episodes: int = 4000
    """expert episodes collected (task seeds 0..N-1)"""
    random_action_prob: float = 0.2
    """probability of executing a random action instead of the expert's (recovery states)"""
    think: str = ""
    """text placed inside <think></think> of every expert response"""
    max_turns: int = 10
    """turn budget per episode (data and evaluation)"""
    history_length: int = 0
    """past (observation, action) pairs in the prompt (must match grpo.py)"""
    prompt_style: str = "compact"
    """prompt template of the wrappers (must match grpo.py)"""
    format_penalty: float = 0.1
    """format penalty of the wrapper stack (only affects logged rewards)"""
    max_prompt_tokens: int = 512
    """prompts longer than this keep their last tokens"""
    max_response_tokens: int = 24
    """generation budget in evaluation"""
    num_steps: int = 800
    """optimizer steps"""
    batch_size: int = 64
    """examples per step"""
    learning_rate: float = 1e-3
    """peak learning rate (use ~1e-5 for pretrained models)"""
    min_learning_rate: float = 1e-4
    """end of the cosine schedule"""
    warmup_steps: int = 30
    """linear warm-up steps"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    lora: bool = False
    """train LoRA adapters (merged into the saved model) instead of all weights"""
    lora_r: int = 16
    """LoRA rank"""
    eval_every: int = 100
    """greedy evaluation on validation seeds every N steps (and at the end)"""
    eval_episodes: int = 200
    """validation episodes per evaluation"""
    seed: int = 1
    """seed of data collection, initialisation and batching"""
    torch_threads: int = 1
    """CPU threads (1 avoids OpenMP contention on shared machines)"""
    temperature: float = 1.0
    """unused by greedy evaluation; kept for the shared rollout code"""
    top_p: float = 1.0
    """unused by greedy evaluation; kept for the shared rollout code"""


def make_env(args: Args):
    import wrappers

    return wrappers.make_env(args.env_id, history_length=args.history_length, format_penalty=args.format_penalty,
                             prompt_style=args.prompt_style)


def collect_expert_data(args: Args) -> list[tuple[list[dict[str, str]], str]]:
    """(chat messages, expert response) for every state visited by the noisy expert."""
    from wrappers import format_response

    env, rng, data = make_env(args), random.Random(args.seed), []
    for seed in range(args.num_episodes):
        _, info = env.reset(seed=seed)
        for _ in range(args.max_turns):
            expert = env.unwrapped.expert_action()
            data.append((info["messages"], format_response(expert, args.think)))
            actions = info.get("admissible_actions") or [expert]
            executed = rng.choice(actions) if rng.random() < args.random_action_prob else expert
            _, _, terminated, truncated, info = env.step(format_response(executed, args.think))
            if terminated or truncated:
                break
    return data


def tokenize(tokenizer, data, max_prompt_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids with generation prompt, response ids + end token) per example."""
    out = []
    for messages, response in data:
        prompt, _ = encode_prompt(tokenizer, messages, max_prompt_tokens)
        out.append((prompt, tokenizer.encode(response, add_special_tokens=False) + [tokenizer.eos_token_id]))
    return out


def sft_loss(model, examples: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    """Mean cross-entropy over response tokens (prompt and padding labelled -100)."""
    L = max(len(p) + len(r) for p, r in examples)
    ids = torch.full((len(examples), L), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), L), -100, dtype=torch.long)
    attn = torch.zeros((len(examples), L), dtype=torch.long)
    for b, (p, r) in enumerate(examples):
        seq = torch.tensor(p + r)
        ids[b, :len(seq)], attn[b, :len(seq)] = seq, 1
        labels[b, len(p):len(seq)] = torch.tensor(r)
    device = next(model.parameters()).device
    return model(input_ids=ids.to(device), attention_mask=attn.to(device), labels=labels.to(device)).loss


def evaluate(model, tokenizer, args: Args) -> float:
    """Greedy success rate on validation seeds, through the same rollout code as grpo.py."""
    from collections import defaultdict

    import wrappers

    rollout = wrappers.GroupRollout(lambda: make_env(args), args.eval_episodes, 1)
    seeds = [VALIDATION_SEED_OFFSET + k for k in range(args.eval_episodes)]
    _, episodes = collect_rows(HFBackend(model, tokenizer), tokenizer, rollout, seeds, args, defaultdict(float),
                               greedy=True)
    return float(np.mean([e.won for e in episodes]))


def load_or_build(args: Args, data):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arena_models import build_tiny_model, cache_dir, resolve_model_path

    if args.model_path == "tiny":
        prompts = {m[-1]["content"] for m, _ in data[:2000]} | {m[0]["content"] for m, _ in data[:10]}
        path = build_tiny_model(cache_dir() / f"sft-init-{args.env_id.replace('/', '_')}-{args.tiny_size}",
                                corpus=sorted(prompts), size=args.tiny_size, seed=args.seed)
    else:
        path = resolve_model_path(args.model_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), tokenizer


def save(model, tokenizer, out: Path, lora: bool) -> None:
    """A plain HF folder: LoRA adapters are merged so grpo.py needs no peft."""
    (model.merge_and_unload() if lora else model).save_pretrained(out)
    tokenizer.save_pretrained(out)


def main(args: Args) -> None:
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(args.torch_threads)
    hf_logging.disable_progress_bar()
    random.seed(args.seed), np.random.seed(args.seed), torch.manual_seed(args.seed)
    out = Path(args.output_dir)
    t0 = time.perf_counter()
    data = collect_expert_data(args)
    print(f"collected {len(data)} expert examples from {args.num_episodes} episodes in {time.perf_counter() - t0:.1f} s")
    model, tokenizer = load_or_build(args, data)
    if args.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    examples = tokenize(tokenizer, data, args.max_prompt_tokens)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate,
                                  weight_decay=args.weight_decay)

    def lr_at(step: int) -> float:
        if step < args.warmup_steps:
            return args.learning_rate * (step + 1) / args.warmup_steps
        progress = (step - args.warmup_steps) / max(1, args.num_steps - args.warmup_steps)
        return args.min_learning_rate + 0.5 * (args.learning_rate - args.min_learning_rate) * (1 + math.cos(math.pi * progress))

    out.mkdir(parents=True, exist_ok=True)
    log = (out / "sft_metrics.jsonl").open("w")
    order, best, losses = np.random.default_rng(args.seed).permutation(len(examples)), -1.0, []
    best_state = None
    for step in range(args.num_steps):
        idx = [order[(step * args.batch_size + k) % len(order)] for k in range(args.batch_size)]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        model.train()
        loss = sft_loss(model, [examples[i] for i in idx], tokenizer.pad_token_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % args.eval_every == 0 or step + 1 == args.num_steps:
            model.eval()
            success = evaluate(model, tokenizer, args)
            record = {"step": step + 1, "loss": float(np.mean(losses[-args.eval_every:])), "eval/success_rate": success,
                      "time_s": time.perf_counter() - t0}
            log.write(json.dumps(record) + "\n")
            log.flush()
            print(json.dumps(record))
            if success > best:
                best = success
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                best_step = step + 1
    model.load_state_dict(best_state)
    save(model, tokenizer, out, args.lora)
    summary = {"best_step": best_step, "best_eval_success_rate": best, "examples": len(examples),
               "time_s": time.perf_counter() - t0, "args": asdict(args)}
    (out / "sft_summary.json").write_text(json.dumps(summary, indent=1))
    print(f"saved best checkpoint (step {best_step}, greedy success {best:.3f}) to {out}\n"
          f"next: python algos/grpo.py --model-path {out}")


if __name__ == "__main__":
    import tyro

    main(tyro.cli(Args))
