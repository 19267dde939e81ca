"""Behaviour cloning (SFT) initialisation for the RL scripts: `python algos/sft.py`.

ARLArena starts every RL run from a behaviour-cloned model (§1.3). This script
1. collects a teacher's trajectories through the same wrapper stack and prompt format as the RL scripts,
   labelling the states visited while executing a random action with probability ``--random-action-prob``
   (recovery states the teacher alone never visits). The default teacher is the imperfect greedy heuristic of
   ``arena_envs.sokoban_teachers`` (61.7 % of the held-out rooms) with its plan of its next moves in ``<think>``:
   the cloned model leaves the RL scripts room to gain, and its responses vary in length with the state, so
   length- and token-level choices change the gradient (docs/mini_arena.md). ``--teacher expert`` clones the
   env's optimal ``expert_action()`` instead (every env has one; an env without teacher plans always uses it);
2. fine-tunes (full or LoRA) on ``<think>…</think><action>…</action>`` responses with the chat
   template, loss on response tokens only;
3. evaluates greedily on validation seeds every ``--eval-every`` steps and keeps the best checkpoint
   (BC learning is a phase transition: a fixed step budget can land just before it).

The saved folder is what the RL scripts' ``--model-path`` loads (their CPU default). ``--model-path tiny``
(default) builds a fresh tiny Qwen3 whose tokenizer is trained on the collected prompts. The pieces (data,
loss, schedule, validation) are ``arena_train.bc``, shared with ``eval.mini_arena``.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from arena_envs.sokoban_teachers import TEACHERS
from arena_train.bc import (
    collect_expert_data,
    load_or_build_model,
    save_model,
    sft_loss,
    tokenize_examples,
    validation_success,
    warmup_cosine_lr,
)
from arena_train.cli import parse_args, range_problem
from arena_train.mixture import Mixture
from arena_train.models import BC_CHECKPOINT, model_path_problem
from arena_train.rollout import RolloutConfig
from arena_train.run import clear_run, default_threads, run_dir_problem

#: The files of a finished ``sft.py`` run: a new one in the same folder needs ``--overwrite``.
SFT_ENTRIES = ("config.json", "model.safetensors", "sft_metrics.jsonl", "sft_summary.json")


@dataclass
class Args:
    env_id: list[str] = field(default_factory=lambda: ["ARL/Sokoban-Mini-v0"])
    """registered ARLArena env id; several ids clone one model on all of them (--env-weights)"""
    env_weights: list[float] | None = None
    """share of --num-episodes and of the validation episodes per --env-id (default: equal)"""
    model_path: str = "tiny"
    """'tiny' (fresh tiny Qwen3), 'smollm2', a local folder or a HF hub id"""
    tiny_size: str = "xs"
    """size of the fresh tiny model (xs, s, m)"""
    output_dir: str = BC_CHECKPOINT
    """where the best checkpoint is saved (a normal HF folder); the RL scripts start from it by default"""
    overwrite: bool = False
    """replace the model already in output_dir (without it, that is an error)"""
    num_episodes: int = 4000
    """teacher episodes collected (task seeds 0..N-1)"""
    random_action_prob: float = 0.2
    """probability of executing a random action instead of the teacher's (recovery states)"""
    teacher: str = "greedy"
    """who labels the data: a teacher of arena_envs.sokoban_teachers (greedy, no-up-push, optimal) on envs with
    teacher plans (Sokoban; the others use their expert), or 'expert' (the env's optimal expert_action). Default
    greedy: an imperfect teacher (61.7 % held-out) whose clone RL improves on; cloning the optimal expert leaves
    no room (docs/mini_arena.md)"""
    think_horizon: int = 4
    """moves of the teacher's plan written in <think> (0: --think); 4 makes responses 5-9 tokens, varying with
    the state, as in eval.mini_arena"""
    think: str = ""
    """text placed inside <think></think> of every expert response (and of a teacher's with --think-horizon 0)"""
    max_turns: int = 10
    """turn budget per episode (data and evaluation)"""
    history_length: int = 0
    """past (observation, action) pairs in the prompt (must match the RL script's)"""
    prompt_style: str = "compact"
    """prompt template of the wrappers (must match the RL script's)"""
    format_penalty: float = 0.1
    """format penalty of the wrapper stack (only affects logged rewards)"""
    max_prompt_tokens: int = 512
    """prompts longer than this keep their last tokens"""
    max_response_tokens: int = 12
    """generation budget in evaluation (the RL scripts' default: a 4-move plan and the tags fit)"""
    num_steps: int = 1500
    """optimizer steps (eval.mini_arena's: imitating the plans takes longer than the 6-token expert responses)"""
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
    """greedy evaluation on validation seeds every N steps from --eval-start (and at the end)"""
    eval_start: int = 800
    """first step that may be validated: earlier checks cost time and are not picked (the default run's best
    checkpoints came at steps 1,300-1,500 on seeds 1-3, as in eval.mini_arena)"""
    eval_episodes: int = 100
    """validation episodes per evaluation (eval.mini_arena's 100: enough to pick among the last checkpoints)"""
    seed: int = 1
    """seed of data collection, initialisation and batching"""
    torch_threads: int = 0
    """CPU threads; 0 = $OMP_NUM_THREADS if set, else all available cores (pin 1 on a shared machine)"""


def main(args: Args) -> None:
    from transformers.utils import logging as hf_logging

    import wrappers

    out = Path(args.output_dir)
    problem = (range_problem(args, {"eval_every": (1, None, True), "think_horizon": (0, None, True)})
               or (f"error: --teacher {args.teacher!r} is not one of: expert, {', '.join(TEACHERS)}"
                   if args.teacher not in ("expert", *TEACHERS) else None)
               or model_path_problem(args.model_path)
               or run_dir_problem(out, resume=False, overwrite=args.overwrite, entries=SFT_ENTRIES, resumable=False))
    if problem is not None:
        raise SystemExit(problem)
    if args.overwrite:
        clear_run(out, SFT_ENTRIES)
    torch.set_num_threads(default_threads(args.torch_threads))
    hf_logging.disable_progress_bar()
    random.seed(args.seed), np.random.seed(args.seed), torch.manual_seed(args.seed)

    mixture = Mixture.parse(args.env_id, args.env_weights)

    def env_maker(env_id: str):
        return lambda: wrappers.make_env(env_id, history_length=args.history_length,
                                         format_penalty=args.format_penalty, prompt_style=args.prompt_style)

    def shares(total: int) -> list[int]:  # a weight's share of ``total`` (largest remainders)
        exact = total * np.asarray(mixture.weights)
        counts = np.floor(exact).astype(int)
        for k in np.argsort(counts - exact)[:total - int(counts.sum())]:
            counts[k] += 1
        return counts.tolist()

    # teacher plans exist on Sokoban only: the other envs' labels are their expert's
    teacher = {env_id: args.teacher if hasattr(env_maker(env_id)().unwrapped, "teacher_plan") else "expert"
               for env_id in mixture.env_ids}

    t0 = time.perf_counter()
    data = [example for env_id, n in zip(mixture.env_ids, shares(args.num_episodes)) for example in
            collect_expert_data(env_maker(env_id), n, args.max_turns, args.random_action_prob, args.think, args.seed,
                                teacher=teacher[env_id], think_horizon=args.think_horizon)]
    print(f"collected {len(data)} examples of {', '.join(sorted(set(teacher.values())))} labels "
          f"from {args.num_episodes} episodes in {time.perf_counter() - t0:.1f} s")
    model, tokenizer = load_or_build_model(args.model_path, data, mixture.label, args.tiny_size, args.seed)
    if args.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    examples = tokenize_examples(tokenizer, data, args.max_prompt_tokens)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate,
                                  weight_decay=args.weight_decay)
    validation = RolloutConfig(max_turns=args.max_turns, max_prompt_tokens=args.max_prompt_tokens,
                               max_response_tokens=args.max_response_tokens)

    log = (out / "sft_metrics.jsonl").open("w")
    order, best, losses = np.random.default_rng(args.seed).permutation(len(examples)), -1.0, []
    best_state = None
    for step in range(args.num_steps):
        idx = [order[(step * args.batch_size + k) % len(order)] for k in range(args.batch_size)]
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine_lr(step, args.learning_rate, args.min_learning_rate, args.warmup_steps,
                                           args.num_steps)
        model.train()
        loss = sft_loss(model, [examples[i] for i in idx], tokenizer.pad_token_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if ((step + 1) % args.eval_every == 0 and step + 1 >= args.eval_start) or step + 1 == args.num_steps:
            model.eval()
            per_env = {name: validation_success(model, tokenizer, env_maker(env_id), n, validation)
                       for name, env_id, n in zip(mixture.names, mixture.env_ids, shares(args.eval_episodes)) if n}
            success = float(np.average(list(per_env.values()), weights=[n for n in shares(args.eval_episodes) if n]))
            record = {"step": step + 1, "loss": float(np.mean(losses[-args.eval_every:])), "eval/success_rate": success,
                      **({f"eval/{k}/success_rate": v for k, v in per_env.items()} if len(per_env) > 1 else {}),
                      "time_s": time.perf_counter() - t0}
            log.write(json.dumps(record) + "\n")
            log.flush()
            print(json.dumps(record))
            if success > best:
                best = success
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                best_step = step + 1
    model.load_state_dict(best_state)
    save_model(model, tokenizer, out, args.lora)
    summary = {"best_step": best_step, "best_eval_success_rate": best, "examples": len(examples),
               "time_s": time.perf_counter() - t0, "args": asdict(args)}
    (out / "sft_summary.json").write_text(json.dumps(summary, indent=1))
    print(f"saved best checkpoint (step {best_step}, greedy success {best:.3f}) to {out}\n"
          f"next: python algos/grpo.py --model-path {out}")


if __name__ == "__main__":
    main(parse_args(Args, {}))
