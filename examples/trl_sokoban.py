"""Train ``ARL/Sokoban-Mini-v0`` with TRL's ``GRPOTrainer`` through :mod:`integrations.trl_env`.

    pip install -e ".[trl]"
    python examples/trl_sokoban.py                          # tiny model on CPU: BC start, then 4 GRPO steps
    python examples/trl_sokoban.py --model-path Qwen/Qwen3-0.6B --max-steps 200 --no-use-cpu

The env keeps ARLArena's semantics: its prompts, the ``<think>/<action>`` response format checked by our
projection, the format penalty, and the episode return as the reward (``get_reward``). The model answers each
turn with a call of the ``act`` tool, so it needs a tool-calling chat template; the tiny model's plain ChatML
template gets TRL's Qwen3 template (the tiny model is a Qwen3).

A random tiny model never calls the tool (no episode is played, every reward is the same, loss and gradient are
0), so with ``--model-path tiny`` the example first behaviour-clones it for ``--bc-steps`` steps (seconds) on
the expert's first moves written as ``act`` calls: the GRPO steps then play the env through the tool, and the
rewards of a group differ. The last line says what the run showed: a few CPU steps on a tiny model check the
plumbing, they are not a learning result.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import tyro

import wrappers
from integrations.trl_env import TRLEnvironment, environment_factory, trl_dataset


@dataclass
class Args:
    env_id: str = "ARL/Sokoban-Mini-v0"
    model_path: str = "tiny"
    """HF hub id or local folder; 'tiny' = the offline random tiny Qwen3 of arena_models"""
    output_dir: str = "runs/trl_sokoban"
    bc_steps: int = 60
    """with --model-path tiny: behaviour-cloning steps on expert first moves as act calls first (0 = random)"""
    max_steps: int = 4
    """GRPO optimizer steps"""
    num_tasks: int = 64
    """task seeds in the dataset (0 .. num_tasks-1)"""
    num_generations: int = 2
    """rollouts per task (the GRPO group)"""
    per_device_train_batch_size: int = 2
    max_completion_length: int = 64
    """tokens of the whole multi-turn rollout (every act call and tool result included)"""
    learning_rate: float = 1e-5
    temperature: float = 1.0
    prompt_style: str = "compact"
    """prompt template of the wrappers: 'full' (ARLArena), 'compact' (tiny models) or 'arlarena'"""
    history_length: int = 0
    """past steps repeated in each prompt; 0 because the conversation already holds them"""
    format_penalty: float = 0.1
    seed: int = 1
    use_cpu: bool = True


def tool_call(response: str) -> str:
    """A Qwen3 tool call of ``act`` with the turn ``response``."""
    return "<tool_call>\n" + json.dumps({"name": "act", "arguments": {"response": response}}) + "\n</tool_call>"


def cloned_tiny_model(folder: Path, env_id: str, steps: int, seed: int, **env_kwargs) -> str:
    """A tiny Qwen3 (its tokenizer built on ``act`` calls) with TRL's Qwen3 tool template, behaviour-cloned for
    ``steps`` AdamW steps (batch 4, lr 5e-3) on the expert's first move of 16 tasks written as an ``act`` call:
    enough for GRPO rollouts to call the tool; a random model never does."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen3_chat_template

    from arena_models import build_tiny_model

    path = build_tiny_model(folder, corpus=[tool_call(wrappers.format_response(m))
                                            for m in ("up", "down", "left", "right")])
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = qwen3_chat_template
    model = AutoModelForCausalLM.from_pretrained(path)
    env, data = TRLEnvironment(env_id, **env_kwargs), trl_dataset(env_id, range(16), **env_kwargs)
    examples = []
    for row in data:
        messages = row["prompt"][:-1] + [{"role": "user", "content": env.reset(seed=row["seed"])}]
        prompt = tokenizer.apply_chat_template(messages, tools=[env.act], add_generation_prompt=True,
                                               tokenize=True)["input_ids"]
        target = tool_call(wrappers.format_response(env._env.unwrapped.expert_action())) + "<|im_end|>"
        examples.append((prompt, tokenizer(target, add_special_tokens=False)["input_ids"]))
    torch.manual_seed(seed)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(steps):
        batch = rng.sample(examples, 4)
        width = max(len(p) + len(t) for p, t in batch)
        ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        for i, (prompt, target) in enumerate(batch):
            ids[i, :len(prompt) + len(target)] = torch.tensor(prompt + target)
            labels[i, len(prompt):len(prompt) + len(target)] = torch.tensor(target)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def summary(steps: list[dict], tiny: bool) -> str:
    """The run in one line: tool use, reward and gradient over the GRPO steps, and what that shows."""
    first, last = steps[0], steps[-1]
    calls = max(entry.get("tools/call_frequency", 0.0) for entry in steps)
    moved = any(entry.get("grad_norm", 0.0) > 0 for entry in steps)
    reward = "rewards/TRLEnvironment/mean"
    line = (f"summary: {len(steps)} GRPO steps, act calls per rollout up to {calls:.2f}, mean reward "
            f"{first.get(reward, float('nan')):.3f} (step 1) -> {last.get(reward, float('nan')):.3f} (step "
            f"{last['step']}), {'non-zero' if moved else 'zero'} gradient")
    if calls == 0:
        return line + ": the model never called the tool, so nothing was trained (give a tool-calling model)"
    if tiny:
        return line + ": a plumbing check (the env is played through TRL and scored), not a learning result"
    return line


def main(args: Args) -> None:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is marked experimental in TRL
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_chat_template, supports_tool_calling

    from arena_models import resolve_model_path

    env_kwargs = dict(prompt_style=args.prompt_style, history_length=args.history_length,
                      format_penalty=args.format_penalty)
    tiny = args.model_path == "tiny"
    if tiny and args.bc_steps > 0:
        model_path = cloned_tiny_model(Path(args.output_dir) / "bc-start", args.env_id, args.bc_steps, args.seed,
                                       **env_kwargs)
    else:
        model_path = resolve_model_path(args.model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if not supports_tool_calling(tokenizer):
        tokenizer.chat_template = qwen3_chat_template
    config = GRPOConfig(
        output_dir=args.output_dir, max_steps=args.max_steps, num_generations=args.num_generations,
        per_device_train_batch_size=args.per_device_train_batch_size, max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=gym.spec(args.env_id).max_episode_steps, learning_rate=args.learning_rate,
        temperature=args.temperature, seed=args.seed, use_cpu=args.use_cpu, logging_steps=1, save_strategy="no",
        report_to="none", disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model_path, processing_class=tokenizer, args=config,
        train_dataset=trl_dataset(args.env_id, range(args.num_tasks), **env_kwargs),
        environment_factory=environment_factory(args.env_id, **env_kwargs),
    )
    trainer.train()
    for entry in trainer.state.log_history:
        print(json.dumps(entry))
    print(summary([entry for entry in trainer.state.log_history if "loss" in entry], tiny), flush=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
