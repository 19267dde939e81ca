"""Mini-arena: the whole ARLArena recipe on a CPU in minutes — ``python -m eval.mini_arena``.

Stages, per pipeline seed:

1. **model** — a fresh tiny Qwen3 whose BPE tokenizer is trained on the env's prompts (``--profile
   tiny``), or the converted SmolLM2-135M-Instruct (``--profile smollm2``);
2. **BC** — behaviour cloning on a teacher's labels of the states it visits while acting noisily
   (``algos/sft.py``'s data and loss; the tiny profile's teacher is the greedy heuristic of
   ``arena_envs.sokoban_teachers``, with its plan of its next moves in ``<think>``) for the profile's steps,
   evaluated greedily on validation seeds every few steps; the best validation checkpoint is kept
   (``--bc-target`` < 1 stops early once validation reaches it);
3. **RL** — ``algos/<rl-script>.py`` (SAMPO by default) from the BC checkpoint, as a subprocess with the
   profile's flags, logging its held-out greedy success every ``--rl-eval-every`` iterations;
4. **evaluation** — BC start and RL result greedy on the SAME held-out seeds (``eval.evaluate``,
   Wilson 95 % intervals), beside the env's expert, the BC teacher itself and a random policy;
5. **report** — ``report.md`` (table, per-seed numbers, mean over seeds with a Student-t interval,
   stage timings) and ``learning_curve.png``; everything also in ``results.json``.

Everything derives from the seeds: the same ``--seeds`` give the same models and numbers.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import subprocess
import sys
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np

from arena_envs import held_out_split
from arena_train.bc import (
    collect_expert_data,
    load_or_build_model,
    save_model,
    sft_loss,
    tokenize_examples,
    warmup_cosine_lr,
)
from arena_train.dist import cpu_launch, free_port
from arena_train.rollout import EVAL_SEED_OFFSET, RolloutConfig
from arena_train.stats import mean_ci, pct_ci
from eval.evaluate import EvalResult, evaluate_policy, format_results, hf_policy
from eval.side_process import SideProcess, bc_env, evaluate_start, run_seeds_apart

ROOT = Path(__file__).resolve().parents[1]

#: Values for the ``Args`` fields left unset (None). See the README section "Mini-arena: the CPU default".
PROFILES: dict[str, dict[str, Any]] = {
    # BC on an imperfect teacher (greedy, 61.7 % of the held-out rooms; its next moves in <think>), then SAMPO at
    # rollout temperature 1.0 (exploration past the teacher's mistakes); docs/mini_arena.md has what was tried.
    # The earlier expert-label default is a study there: --teacher expert --think-horizon 0 --max-response-tokens 8
    "tiny": dict(env_id="ARL/Sokoban-Mini-v0", model="tiny", tiny_size="xs", teacher="greedy", think_horizon=4,
                 bc_episodes=4000, bc_max_steps=1500,
                 bc_batch_size=64, bc_learning_rate=1e-3, bc_target=1.0, bc_eval_every=100, bc_eval_start=800,
                 bc_eval_episodes=100, rl_iterations=250, num_groups=8, group_size=8, learning_rate=1e-4,
                 temperature=1.0, mini_batch_size=128, rl_eval_every=10, rl_eval_episodes=100, eval_episodes=300,
                 max_response_tokens=12, bc_threads=2, rl_processes=2),
    # The same recipe on the real pretrained SmolLM2-135M-Instruct: hours on a CPU, minutes on a GPU.
    "smollm2": dict(env_id="ARL/Sokoban-Mini-v0", model="smollm2", tiny_size="xs", teacher="expert", think_horizon=0,
                    bc_episodes=1000,
                    bc_max_steps=400, bc_batch_size=16, bc_learning_rate=5e-5, bc_target=0.45, bc_eval_every=50,
                    bc_eval_start=50, bc_eval_episodes=100, rl_iterations=40, num_groups=8, group_size=8,
                    learning_rate=2e-6, temperature=0.5, mini_batch_size=64, rl_eval_every=5, rl_eval_episodes=100,
                    eval_episodes=300, max_response_tokens=16, bc_threads=1, rl_processes=1),
}


@dataclass
class Args:
    """BC -> RL -> held-out evaluation -> report, for one or more pipeline seeds."""

    profile: Literal["tiny", "smollm2"] = "tiny"
    """fills every field left unset: tiny = the CPU default (<= 15 min on 2 cores), smollm2 = pretrained 135M"""
    seeds: list[int] = field(default_factory=lambda: [1])
    """pipeline seeds (model init, BC data and batches, RL); several give an interval over seeds"""
    out: Path = Path("runs/mini_arena")
    """output folder: <out>/seed<s>/{bc,<rl-script>}, <out>/results.json, report.md, learning_curve.png"""
    env_id: str | None = None
    """registered env id"""
    model: str | None = None
    """'tiny' (fresh tiny Qwen3), 'smollm2', or a local HF folder"""
    tiny_size: str | None = None
    """tiny model size (xs, s, m)"""
    teacher: str | None = None
    """who labels the BC data: 'expert' (the env's optimal expert_action, empty <think>) or a teacher of
    arena_envs.sokoban_teachers ('greedy', 'no-up-push', 'optimal') whose plan goes in <think>"""
    think_horizon: int | None = None
    """moves of the teacher's plan written in <think> (0: empty <think>)"""
    bc_episodes: int | None = None
    """teacher episodes of BC data (task seeds 0..N-1, disjoint from RL's and the held-out seeds)"""
    bc_max_steps: int | None = None
    """BC optimizer steps at most (cosine schedule over them)"""
    bc_batch_size: int | None = None
    """BC examples per step"""
    bc_learning_rate: float | None = None
    """BC peak learning rate"""
    bc_target: float | None = None
    """stop BC once greedy validation success >= this (1.0 = train all steps and keep the best)"""
    bc_eval_every: int | None = None
    """BC validation every N steps"""
    bc_eval_start: int | None = None
    """first BC step that is validated (before it, the tiny model is still learning the format)"""
    bc_eval_episodes: int | None = None
    """validation episodes per BC check (seeds from arena_train.bc.VALIDATION_SEED_OFFSET)"""
    rl_script: str = "sampo"
    """algos/<name>.py run from the BC checkpoint"""
    rl_iterations: int | None = None
    """RL iterations"""
    num_groups: int | None = None
    """RL groups (task instances) per iteration"""
    group_size: int | None = None
    """RL episodes per group"""
    learning_rate: float | None = None
    """RL learning rate"""
    temperature: float | None = None
    """RL rollout sampling temperature (log-probs use the same; < 1 keeps rollouts near the greedy policy)"""
    mini_batch_size: int | None = None
    """RL rows per optimizer step"""
    rl_eval_every: int | None = None
    """held-out greedy evaluation inside the RL run every N iterations (the learning curve)"""
    rl_eval_episodes: int | None = None
    """held-out episodes per evaluation inside the RL run"""
    rl_args: list[str] = field(default_factory=list)
    """extra flags for the RL script, given last: --rl-args --kl-coef 0 --cold-start-steps 5 (or one quoted
    string: --rl-args "--kl-coef 0 --cold-start-steps 5")"""
    eval_episodes: int | None = None
    """final held-out greedy evaluation: episodes (seeds from EVAL_SEED_OFFSET), same for BC and RL"""
    max_response_tokens: int | None = None
    """generation budget per turn"""
    max_prompt_tokens: int = 512
    """prompt budget of BC, RL and evaluation (longer prompts keep their last tokens in BC and evaluation)"""
    bc_threads: int | None = None
    """torch threads of the BC training steps (compute-bound: the tiny profile's 2 use both cores of a 2-core
    machine; another count gives other float sums, so another checkpoint for the same seed)"""
    rl_processes: int | None = None
    """processes of the RL stage (accelerate launch, gloo; each plays and trains on its share of the groups, one
    --torch-threads each): the tiny profile's 2 use both cores; 1 = a plain python run. The numbers depend on it
    (each process draws from its own streams)"""
    torch_threads: int = 1
    """CPU threads per process of everything else: evaluation and each RL process (1 avoids OpenMP contention on
    shared machines; another count gives other float sums, so other numbers for the same seed)"""
    overlap: bool = False
    """BC validation checks and the BC start's and baselines' held-out evaluation in a second process, beside BC
    training and the RL stage (the same numbers; off by default, since BC and RL already use two cores)"""
    seed_workers: int = 0
    """pipeline seeds run at once, each in its own process (0: one per core, at most one per seed; 1: one after
    another); each seed gives the same numbers either way"""
    skip_rl: bool = False
    """stop after BC (e.g. to build the checkpoint a sweep starts from)"""
    resume: bool = False
    """reuse the BC checkpoint and RL run of each seed recorded in <out>/results.json; evaluate again"""
    merge: list[Path] = field(default_factory=list)
    """run nothing: combine the results.json of these finished --out folders (e.g. one seed each, run in
    parallel) into one report in --out"""


def resolve(args: Args) -> Args:
    processes_from_profile = args.rl_processes is None
    for key, value in PROFILES[args.profile].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("think_horizon",):
        if getattr(args, key) < 0:
            raise SystemExit(f"--{key.replace('_', '-')} must be >= 0")
    for key in ("bc_threads", "rl_processes"):
        if getattr(args, key) < 1:
            raise SystemExit(f"--{key.replace('_', '-')} must be >= 1")
    if args.seed_workers < 0:
        raise SystemExit("--seed-workers must be >= 0 (0: one per core)")
    for key in ("bc_episodes", "bc_max_steps", "bc_batch_size", "bc_eval_every", "bc_eval_episodes", "rl_iterations",
                "num_groups", "group_size", "mini_batch_size", "rl_eval_episodes", "eval_episodes",
                "max_response_tokens"):
        if getattr(args, key) < 1:
            raise SystemExit(f"--{key.replace('_', '-')} must be >= 1")
    _fit_rl_processes(args, processes_from_profile)
    if not args.seeds:
        raise SystemExit("--seeds needs at least one seed")
    if not (ROOT / "algos" / f"{args.rl_script}.py").is_file():
        raise SystemExit(f"no RL script algos/{args.rl_script}.py")
    return args


def _fit_rl_processes(args: Args, from_profile: bool) -> None:
    """Each RL process plays an equal share of the groups and held-out episodes. A profile's process count that
    does not divide them (a small try, e.g. --num-groups 1) falls to the largest one that does; a count given on
    the command line is an error here, before BC spends its minutes."""
    fits = [n for n in range(args.rl_processes, 0, -1)
            if args.num_groups % n == 0 and args.rl_eval_episodes % n == 0]
    if fits[0] == args.rl_processes:
        return
    if not from_profile:
        raise SystemExit(f"--num-groups ({args.num_groups}) and --rl-eval-episodes ({args.rl_eval_episodes}) must be "
                         f"multiples of --rl-processes ({args.rl_processes}); try --rl-processes {fits[0]}")
    print(f"RL on {fits[0]} process(es), not the profile's {args.rl_processes}: --num-groups {args.num_groups} and "
          f"--rl-eval-episodes {args.rl_eval_episodes} must be multiples of it", flush=True)
    args.rl_processes = fits[0]


@contextlib.contextmanager
def _env_var(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


# --- stage 2: behaviour cloning ---------------------------------------------------------
def run_bc(args: Args, seed: int, out: Path, side: SideProcess | None = None) -> dict[str, Any]:
    """BC until validation success >= bc_target (or the best of all checks); saves an HF folder at ``out``.

    ``algos/sft.py``'s recipe through ``arena_train.bc`` (its defaults for what the profiles leave out:
    random-action probability 0.2, 10 turns, --max-prompt-tokens, 30 warm-up steps, no weight decay), with a
    validation check every ``bc_eval_every`` steps from ``bc_eval_start`` on and an early stop at the target.
    A check validates a copy of the weights in ``side`` (the second process) while training goes on; its result
    is read in check order, and a check that reaches the target stops training there (the steps trained past it
    while it ran are dropped with the best checkpoint's reload): the same checkpoint and curve as checking in line.
    """
    import torch

    side = side or SideProcess(0, args.torch_threads)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.bc_threads)  # validation runs at --torch-threads (SideProcess), wherever it runs
    try:
        return _train_bc(args, seed, out, side)
    finally:
        torch.set_num_threads(threads)


def _train_bc(args: Args, seed: int, out: Path, side: SideProcess) -> dict[str, Any]:
    import torch

    make_env = partial(bc_env, args.env_id)
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    start = time.perf_counter()
    data = collect_expert_data(make_env, args.bc_episodes, max_turns=10, random_action_prob=0.2, think="", seed=seed,
                               teacher=args.teacher, think_horizon=args.think_horizon)
    if args.model == "tiny":  # the fresh model is built in the cache: one folder per run, no races
        with _env_var("ARENA_CACHE", str(out.parent / "init")):
            model, tokenizer = load_or_build_model(args.model, data, args.env_id, args.tiny_size, seed)
    else:
        model, tokenizer = load_or_build_model(args.model, data, args.env_id, args.tiny_size, seed)
    examples = tokenize_examples(tokenizer, data, max_prompt_tokens=args.max_prompt_tokens)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.bc_learning_rate, weight_decay=0.0)
    validation = RolloutConfig(max_turns=10, max_prompt_tokens=args.max_prompt_tokens,
                               max_response_tokens=args.max_response_tokens)
    order = np.random.default_rng(seed).permutation(len(examples))
    curve, best, best_state, best_step, losses = [], -1.0, None, 0, []
    pending: deque[tuple[int, float, Future, dict[str, torch.Tensor]]] = deque()  # checks in flight, in order
    key, reached = f"{out.resolve()}:{time.time_ns()}", False

    def read_check() -> None:  # the oldest check's result
        nonlocal best, best_state, best_step, reached
        check_step, loss, future, state = pending.popleft()
        success = side.result(future)
        curve.append({"step": check_step, "loss": loss, "val_success": success,
                      "time_s": time.perf_counter() - start})
        print(f"  [seed {seed}] BC step {check_step}: loss {loss:.3f}, validation success {success:.3f}", flush=True)
        if success > best:
            best, best_state, best_step = success, state, check_step
        reached = success >= args.bc_target

    for step in range(args.bc_max_steps):
        batch = [examples[order[(step * args.bc_batch_size + k) % len(order)]] for k in range(args.bc_batch_size)]
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine_lr(step, args.bc_learning_rate, args.bc_learning_rate / 10, warmup_steps=30,
                                           total_steps=args.bc_max_steps)
        model.train()
        loss = sft_loss(model, batch, tokenizer.pad_token_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        checkpoint = (step + 1) % args.bc_eval_every == 0 and step + 1 >= args.bc_eval_start
        if checkpoint or step + 1 == args.bc_max_steps:
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            pending.append((step + 1, float(np.mean(losses[-args.bc_eval_every:])),
                            side.validate(key, model, tokenizer, state, args.env_id, args.bc_eval_episodes,
                                          validation), state))
        while pending and not reached and pending[0][2].done():
            read_check()
        if reached:
            break
    while pending and not reached:
        read_check()
    for _, _, future, _ in pending:  # checks after the one that reached the target: not part of the run
        future.cancel()
    model.load_state_dict(best_state)
    save_model(model, tokenizer, out, lora=False)
    record = {"step": best_step, "val_success": best, "examples": len(examples), "curve": curve,
              "params": sum(p.numel() for p in model.parameters()), "seconds": time.perf_counter() - start}
    (out / "bc_summary.json").write_text(json.dumps(record, indent=1))
    return record


# --- stage 3: RL -------------------------------------------------------------------------
def rl_command(args: Args, seed: int, bc_dir: Path, runs_dir: Path, port: int | None = None) -> list[str]:
    """The training-script command line of the RL stage (what a user would type); paths absolute, since the
    script runs in the repository root. ``--rl-processes`` > 1: under ``accelerate launch`` on that many CPU
    processes (gloo), rendezvous on ``port`` (None: accelerate's default)."""
    launcher = cpu_launch(args.rl_processes, port) if args.rl_processes > 1 else [sys.executable]
    return [*launcher, str(ROOT / "algos" / f"{args.rl_script}.py"), "--model-path", str(bc_dir.resolve()),
            "--env-id", args.env_id, "--seed", str(seed), "--num-iterations", str(args.rl_iterations),
            "--num-groups", str(args.num_groups), "--group-size", str(args.group_size),
            "--learning-rate", str(args.learning_rate), "--temperature", str(args.temperature),
            "--mini-batch-size", str(args.mini_batch_size),
            "--micro-batch-size", str(args.mini_batch_size), "--max-response-tokens", str(args.max_response_tokens),
            "--max-prompt-tokens", str(args.max_prompt_tokens),
            "--history-length", "0", "--prompt-style", "compact", "--eval-every", str(args.rl_eval_every),
            "--eval-episodes", str(args.rl_eval_episodes), "--eval-greedy", "--checkpoint-every", "0",
            "--torch-threads", str(args.torch_threads), "--output-dir", str(runs_dir.resolve()),
            "--run-name", args.rl_script,
            "--overwrite",
            *(["--cold-start-steps", "0"] if args.rl_script in ("sampo", "dapo") else []), *args.rl_args]


def run_rl(args: Args, seed: int, bc_dir: Path, runs_dir: Path) -> dict[str, Any]:
    cmd = rl_command(args, seed, bc_dir, runs_dir, free_port() if args.rl_processes > 1 else None)
    run_dir = runs_dir / args.rl_script
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(run_dir / "stdout.log", "w") as log:
        code = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "OMP_NUM_THREADS": str(args.torch_threads)}).returncode
    if code != 0:
        tail = (run_dir / "stdout.log").read_text()[-3000:]
        raise SystemExit(f"RL stage failed (exit {code}): {' '.join(cmd)}\n{tail}")
    metrics = training_lines((run_dir / "metrics.jsonl").read_text())
    return {"command": cmd, "metrics": metrics, "model": str(run_dir / "final"), "seconds": time.perf_counter() - start}


def training_lines(text: str) -> list[dict]:
    """The training iterations' lines of a metrics.jsonl text (iteration 0, the start's held-out evaluation, is
    left out: the BC start is evaluated here on its own)."""
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [m for m in lines if m.get("iteration", 1) >= 1]


# --- stage 4: held-out evaluation ---------------------------------------------------------
def evaluate_model(args: Args, path: str | Path, name: str, seeds: list[int]) -> tuple[EvalResult, list[int]]:
    """Greedy held-out evaluation (as eval.evaluate) plus the per-seed outcomes, for paired comparisons."""
    import gymnasium as gym

    import wrappers
    from eval.evaluate import load_model, summarize

    model, tokenizer = load_model(str(path), device="cpu")
    policy = hf_policy(model, tokenizer, greedy=True, max_new_tokens=args.max_response_tokens,
                       max_prompt_tokens=args.max_prompt_tokens,
                       batch_size=256)
    start = time.perf_counter()
    split = held_out_split(args.env_id)  # the rooms evaluate_baselines plays, never a training room
    rollout = wrappers.GroupRollout(
        lambda: wrappers.make_env(args.env_id, history_length=0, prompt_style="compact", split=split), len(seeds), 1)
    rollout.reset(seeds)
    rollout.run(policy, gym.spec(args.env_id).max_episode_steps)
    episodes = rollout.episodes()  # one per task seed, in seed order
    return (summarize(name, args.env_id, episodes, 1, seconds=time.perf_counter() - start),
            [int(ep.won) for ep in episodes])


def evaluate_teacher(args: Args, seeds: list[int]) -> EvalResult:
    """The BC teacher itself on the held-out seeds (noise-free): what imitation alone can reach."""
    import gymnasium as gym

    import wrappers
    from eval.evaluate import summarize

    start = time.perf_counter()
    split = held_out_split(args.env_id)
    rollout = wrappers.GroupRollout(
        lambda: wrappers.make_env(args.env_id, history_length=0, prompt_style="compact", split=split), len(seeds), 1)
    rollout.reset(seeds)

    def act(batch):
        moves = [rollout.envs[i].unwrapped.teacher_plan(args.teacher, args.think_horizon)
                 for i in rollout.active()]
        return [wrappers.format_response(action, " ".join(plan)) for action, plan in moves]

    rollout.run(act, gym.spec(args.env_id).max_episode_steps)
    return summarize(f"teacher ({args.teacher})", args.env_id, rollout.episodes(), 1,
                     seconds=time.perf_counter() - start)


def evaluate_baselines(args: Args, seeds: list[int]) -> list[EvalResult]:
    """The optimal expert, the BC teacher (when it is not the expert) and a random policy."""
    common = dict(history_length=0, prompt_style="compact", progress=False)
    teacher = [] if args.teacher == "expert" else [evaluate_teacher(args, seeds)]
    return [evaluate_policy(args.env_id, "expert", seeds, **common), *teacher,
            evaluate_policy(args.env_id, "random", seeds, samples=4, **common)]


# --- stage 5: report ----------------------------------------------------------------------
def summarize_seeds(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean held-out success over pipeline seeds with Student-t intervals (and of the paired gain)."""
    bc = [r["eval"]["bc"]["success"]["mean"] for r in per_seed]
    rl = [r["eval"]["rl"]["success"]["mean"] for r in per_seed if "rl" in r["eval"]]
    out = {"bc": mean_ci(bc).as_dict()}
    if len(rl) == len(bc):
        out["rl"] = mean_ci(rl).as_dict()
        out["gain"] = mean_ci([b - a for a, b in zip(bc, rl)]).as_dict()
        wins = [r["eval"].get("wins") for r in per_seed]
        if all(wins):  # every (pipeline seed, task seed) pair: the same tasks, different models
            out["paired_gain_pooled"] = mean_ci([y - x for w in wins for x, y in zip(w["bc"], w["rl"])]).as_dict()
    return out


def plot_curves(per_seed: list[dict[str, Any]], path: Path, rl_name: str, temperature: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_bc, ax_rl) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [1, 1.6]})
    for k, r in enumerate(per_seed):
        color = f"C{k}"
        bc = r["bc"]["curve"]
        ax_bc.plot([c["step"] for c in bc], [c["val_success"] for c in bc], "o-", color=color, ms=3,
                   label=f"seed {r['seed']}")
        if "rl" not in r:
            continue
        evals = [(m["iteration"], m["eval/success_rate"]) for m in r["rl"]["metrics"] if "eval/success_rate" in m]
        start = r["eval"]["bc_curve_point"]
        its = [0] + [i for i, _ in evals]
        ax_rl.plot(its, [start] + [v for _, v in evals], "o-", color=color, ms=3,
                   label=f"seed {r['seed']} held-out greedy")
        rl_metrics = r["rl"]["metrics"]
        ax_rl.plot([m["iteration"] for m in rl_metrics], [m["rollout/success_rate"] for m in rl_metrics],
                   ":", color=color, alpha=0.6, label=f"seed {r['seed']} training rollouts (T={temperature:g})")
    ax_bc.axhline(per_seed[0]["bc"]["target"], color="grey", ls="--", lw=0.8)
    ax_bc.set(title="behaviour cloning (stops at the target)", xlabel="BC step", ylabel="validation success",
              ylim=(0, 1))
    ax_rl.set(title=f"{rl_name} from the BC checkpoint", xlabel="RL iteration", ylabel="success", ylim=(0, 1))
    ax_rl.legend(fontsize=7, loc="lower right")
    ax_bc.legend(fontsize=7)
    for ax in (ax_bc, ax_rl):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(results: dict[str, Any], out: Path) -> str:
    a, per_seed, rl = results["args"], results["per_seed"], results["args"]["rl_script"].upper()
    lines = [f"# Mini-arena: BC -> {rl} on {a['env_id']} ({a['profile']} profile)", "",
             f"Held-out greedy success on {a['eval_episodes']} task seeds from {EVAL_SEED_OFFSET} "
             "(95 % Wilson intervals; the same seeds for every row).", ""]
    for r in per_seed:
        lines += [f"## Seed {r['seed']}", "", r["eval"]["table"], ""]
    summary = results["summary"]
    lines += ["## Over seeds", "", "| policy | success % (mean over seeds, 95 % t-interval) |", "|---|---|",
              f"| BC start | {pct_ci(summary['bc'])} |"]
    if "rl" in summary:
        lines += [f"| {rl} | {pct_ci(summary['rl'])} |", f"| gain ({rl} − BC) | {pct_ci(summary['gain'])} |"]
    if "paired_gain_pooled" in summary:
        lines.append(f"| gain, paired per task seed, pooled over seeds | {pct_ci(summary['paired_gain_pooled'])} |")
    lines += ["", f"| seed | BC steps | BC validation | BC held-out % | {rl} held-out % | paired gain % | BC s | RL s "
              "| eval s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in per_seed:
        e, t = r["eval"], r["timing"]
        rl_cell = pct_ci(e["rl"]["success"]) if "rl" in e else "-"
        gain_cell = pct_ci(e["paired_gain"]) if "paired_gain" in e else "-"
        lines.append(f"| {r['seed']} | {r['bc']['step']} | {r['bc']['val_success']:.2f} | {pct_ci(e['bc']['success'])} "
                     f"| {rl_cell} | {gain_cell} | {t['bc_s']:.0f} | {t.get('rl_s', 0):.0f} | {t['eval_s']:.0f} |")
    wall = (f"Wall time {results['wall_s'] / 60:.1f} min summed over {len(results['merged_from'])} runs"
            if "merged_from" in results else f"Total wall time {results['wall_s'] / 60:.1f} min")
    machines = results.get("machines") or ([results["machine"]] if "machine" in results else [])
    lines += ["", f"{wall}; peak memory {results['peak_rss_mb']:.0f} MB (largest process).", "",
              *[f"Machine: {describe_machine(m)}." for m in machines],
              "Exact success rates depend on the CPU, torch and the thread count (float sums); the same seed on "
              "the same machine gives the same numbers.", "", "![learning curve](learning_curve.png)", ""]
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    return text


def machine_info(torch_threads: int, processes: int, bc_threads: int = 1, rl_processes: int = 1) -> dict[str, Any]:
    """What the figures and times of a run were measured on: float sums (and so the exact numbers) and speed
    depend on the CPU, the torch version and the thread count."""
    import platform

    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores": cores, "torch": torch.__version__, "torch_threads": torch_threads,
            "processes": processes, "bc_threads": bc_threads, "rl_processes": rl_processes}


def describe_machine(machine: dict[str, Any]) -> str:
    return (f"{machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}, {machine['torch_threads']} "
            f"torch thread(s) per process, {machine['processes']} process(es) at a time, BC on "
            f"{machine.get('bc_threads', 1)} thread(s), RL on {machine.get('rl_processes', 1)} process(es)")


def peak_rss_mb() -> float:
    """Largest resident set of this process or any finished child (Linux reports KiB)."""
    return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
               resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024


# --- pipeline ------------------------------------------------------------------------------
def _previous(args: Args, seed: int) -> dict[str, Any] | None:
    """This seed's record in an earlier results.json of --out (for --resume)."""
    path = args.out / "results.json"
    if not args.resume or not path.is_file():
        return None
    return next((r for r in json.loads(path.read_text())["per_seed"] if r["seed"] == seed), None)


def run_seed(args: Args, seed: int, side: SideProcess | None = None) -> dict[str, Any]:
    """BC, RL and the held-out evaluation of one pipeline seed; what needs no RL model (the BC start's and the
    baselines' evaluation) runs in ``side`` while the RL stage trains."""
    side = side or SideProcess(0, args.torch_threads)
    seed_dir = args.out / f"seed{seed}"
    seed_dir.mkdir(parents=True, exist_ok=True)
    prev = _previous(args, seed)
    if prev is not None and (seed_dir / "bc" / "bc_summary.json").is_file():
        bc, timing = prev["bc"], {"bc_s": prev["timing"]["bc_s"]}
        print(f"[seed {seed}] BC: reusing {seed_dir / 'bc'}", flush=True)
    else:
        print(f"[seed {seed}] BC on {args.env_id} ({args.model})", flush=True)
        t0 = time.perf_counter()
        bc = run_bc(args, seed, seed_dir / "bc", side)
        bc["target"] = args.bc_target
        timing = {"bc_s": time.perf_counter() - t0}
    record: dict[str, Any] = {"seed": seed, "bc": bc, "timing": timing}
    print(f"[seed {seed}] BC checkpoint: step {bc['step']}, validation success {bc['val_success']:.3f}, "
          f"{bc['params'] / 1e6:.2f} M parameters", flush=True)
    seeds = [EVAL_SEED_OFFSET + k for k in range(args.eval_episodes)]
    t_start_eval = time.perf_counter()
    start_eval = side.submit(evaluate_start, args, seed_dir / "bc", seeds)
    t_start_eval = time.perf_counter() - t_start_eval  # in line (no --overlap): the whole evaluation
    if not args.skip_rl and prev is not None and "rl" in prev and Path(prev["rl"]["model"]).is_dir():
        record["rl"], timing["rl_s"] = prev["rl"], prev["timing"]["rl_s"]
        print(f"[seed {seed}] RL: reusing {prev['rl']['model']}", flush=True)
    elif not args.skip_rl:
        print(f"[seed {seed}] RL: algos/{args.rl_script}.py, {args.rl_iterations} iterations", flush=True)
        t1 = time.perf_counter()
        record["rl"] = run_rl(args, seed, seed_dir / "bc", seed_dir)
        timing["rl_s"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    rl_eval = evaluate_model(args, record["rl"]["model"], args.rl_script.upper(), seeds) if "rl" in record else None
    bc_result, bc_wins, baselines = side.result(start_eval)
    results = [bc_result]
    record["eval"] = {"bc": bc_result.as_dict(),
                      # iteration 0 of the learning curve: BC on the RL run's in-training evaluation seeds
                      "bc_curve_point": float(np.mean(bc_wins[:args.rl_eval_episodes]))}
    if rl_eval is not None:
        rl_result, rl_wins = rl_eval
        results.append(rl_result)
        record["eval"]["rl"] = rl_result.as_dict()
        # same task seeds for both policies: a paired interval on the per-seed difference is much tighter
        record["eval"]["paired_gain"] = mean_ci([r - b for b, r in zip(bc_wins, rl_wins)]).as_dict()
        record["eval"]["wins"] = {"bc": bc_wins, "rl": rl_wins}
    results += baselines
    record["eval"].update(table=format_results(results), baselines=[r.as_dict() for r in baselines])
    timing["eval_s"] = time.perf_counter() - t2 + t_start_eval  # after RL (overlapped: the wait for the rest)
    print(f"[seed {seed}] held-out evaluation\n{record['eval']['table']}", flush=True)
    return record


def read_finished(folders: list[Path], ignore: tuple[str, ...]) -> list[dict[str, Any]]:
    """The results.json records of finished runs for ``--merge``; their settings (except ``ignore``) must match."""
    records = []
    for folder in folders:
        path = Path(folder) / "results.json"
        if not path.is_file():
            raise SystemExit(f"--merge: no results.json in {folder}")
        records.append(json.loads(path.read_text()))
    settings = [{k: v for k, v in r["args"].items() if k not in ignore} for r in records]
    if any(s != settings[0] for s in settings):
        raise SystemExit("--merge: the folders were run with different settings")
    return records


def merge_results(folders: list[Path]) -> dict[str, Any]:
    """One results record from several finished pipeline folders (seeds must differ, settings must match)."""
    records = read_finished(folders, ignore=("seeds", "out", "merge", "resume", "overlap", "seed_workers"))
    per_seed = [p for r in records for p in r["per_seed"]]
    if len({p["seed"] for p in per_seed}) != len(per_seed):
        raise SystemExit("--merge: a seed appears twice")
    args = {**records[0]["args"], "seeds": [p["seed"] for p in per_seed]}
    machines = [m for r in records for m in r.get("machines", [r["machine"]] if "machine" in r else [])]
    return {"args": args, "per_seed": per_seed, "summary": summarize_seeds(per_seed),
            "wall_s": sum(r["wall_s"] for r in records), "peak_rss_mb": max(r["peak_rss_mb"] for r in records),
            "merged_from": [str(f) for f in folders], "machines": [m for k, m in enumerate(machines)
                                                                    if m not in machines[:k]]}


def main(args: Args) -> dict[str, Any]:
    import torch
    from transformers.utils import logging as hf_logging

    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        results = merge_results(args.merge)
    else:
        args = resolve(args)
        torch.set_num_threads(args.torch_threads)
        hf_logging.disable_progress_bar()
        prev_path = args.out / "results.json"
        prev = json.loads(prev_path.read_text()) if args.resume and prev_path.is_file() else None
        start = time.perf_counter()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        workers = min(len(args.seeds), args.seed_workers or cores)
        if workers > 1:
            print(f"{len(args.seeds)} pipeline seeds, {workers} at a time", flush=True)
            per_seed = run_seeds_apart(args, workers)
        else:
            side = SideProcess(1 if args.overlap else 0, args.torch_threads)
            try:
                per_seed = [run_seed(args, seed, side) for seed in args.seeds]
            finally:
                side.close()
        wall, peak = time.perf_counter() - start, peak_rss_mb()
        if prev is not None:  # reused stages count with their original times and memory
            wall = sum(sum(r["timing"].values()) for r in per_seed)
            peak = max(peak, prev["peak_rss_mb"])
        results = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(args).items()},
                   "per_seed": per_seed, "summary": summarize_seeds(per_seed), "wall_s": wall, "peak_rss_mb": peak,
                   "machine": machine_info(args.torch_threads, 2 if workers > 1 or args.overlap else 1,
                                           args.bc_threads, args.rl_processes)}
    plot_curves(results["per_seed"], args.out / "learning_curve.png", results["args"]["rl_script"].upper(),
                results["args"]["temperature"])
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(write_report(results, args.out))
    return results


if __name__ == "__main__":
    import dataclasses

    import tyro

    from arena_train.cli import split_passthrough

    own_argv, rl_argv = split_passthrough(sys.argv[1:], "--rl-args")
    main(dataclasses.replace(tyro.cli(Args, args=own_argv), rl_args=rl_argv))
