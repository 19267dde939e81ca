"""algos/grpo.py against TRL's GRPOTrainer on matched work, side by side in one run; and the multi-turn
mini-arena RL iteration (algos/sampo.py) of this checkout against a baseline git ref.

Half 1 (single turn): per model size and completion length, rounds that run grpo.py and TRL alternately (the
order flips every round), each in its own process: same tiny Qwen3, same Sokoban first-turn prompts (the boards
grpo.py draws, rendered by the same chat template: 119 tokens), 8 prompts x 8 completions, one optimizer step
per iteration on all 64 rows, KL 0.01, temperature 1, float32, the same thread count. The first ``--warmup``
iterations of each run are skipped. Printed per phase (generate / score / update): seconds, tokens/s, the
process's peak RSS, and grpo/TRL ratios (min and median over rounds); and, to show that both sides sample,
the distinct completions per group of 8 in the timed runs themselves (8 = every completion differs, 1 = greedy).
The mismatches that remain are printed.

Half 2 (multi-turn): algos/sampo.py at the mini-arena settings (8 groups x 8, 10 turns, 8 new tokens, 128 rows
per mini-batch) for a few iterations, this checkout vs ``--baseline-ref`` (exported with ``git archive``),
alternating; the ratio of median iteration times. Not a test: numbers depend on the machine and its load.

    pip install -e ".[bench]"
    python benchmarks/bench_vs_trl.py                          # both halves
    python benchmarks/bench_vs_trl.py --sizes s --completion-lengths 16 --rounds 3 --skip-multi-turn
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import runpy
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from arena_train.run import default_threads

ROOT = Path(__file__).resolve().parents[1]
GROUPS, GROUP_SIZE, KL, LR, SEED = 8, 8, 0.01, 1e-4, 1
PHASES = ("generate", "score", "update")
MISMATCHES = [
    "rewards: grpo.py steps the Sokoban env on each response (a row's reward is its episode's return); TRL calls "
    "a Python reward function (format check); both cost well under 1 % of an iteration",
    "completion lengths: both stop at the end token or the length cap; samples come from different random streams, "
    "so mean lengths differ slightly (printed per run; tokens/s normalise for it)",
    "loss: grpo.py's token-mean clipped surrogate + k3 KL + entropy bonus (0.001); TRL's default 'dapo' token-mean "
    "clipped surrogate + k3 KL; both compute per-token entropies in the update forward",
    "grpo.py's generate phase includes chat-template encoding and env steps; TRL's includes its reward call",
    "peak RSS is the whole process (Python, torch, transformers; TRL also imports datasets and its trainer stack)",
]


def sokoban_messages(seeds: list[int]) -> list[list[dict[str, str]]]:
    """First-turn chat messages of the Sokoban-Mini boards ``seeds``, as grpo.py's rollout renders them."""
    import wrappers

    def make_env():
        return wrappers.make_env("ARL/Sokoban-Mini-v0", history_length=0, format_penalty=0.1,
                                 prompt_style="compact")

    rollout = wrappers.GroupRollout(make_env, len(seeds), 1)
    rollout.reset(seeds)
    return [rollout.messages(i) for i in rollout.active()]


def format_reward(completions, **kwargs) -> list[float]:
    """1 for a response with an <action> tag, else 0 (a cheap stand-in for the env's reward)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float("<action>" in t and "</action>" in t) for t in texts]


def trl_worker(model_path: str, completion_length: int, iterations: int, threads: int) -> dict:
    """One TRL GRPOTrainer run in this process; per-iteration phase times (TRL's own methods, timed)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from arena_train.rollout import task_seeds

    torch.set_num_threads(threads)
    seeds = [s for it in range(1, iterations + 1) for s in task_seeds(SEED, it, GROUPS, 0, 1)]
    data = Dataset.from_list([{"prompt": m} for m in sokoban_messages(seeds)])
    timing: dict[str, list[float]] = {"gen_and_score": [], "score": [], "step": [], "completion_length": [],
                                      "distinct_per_group": []}

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose generation (with its scoring passes) and scoring passes are timed."""

        _in_generation = False

        def _generate_and_score_completions(self, inputs):
            start, self._in_generation = time.perf_counter(), True
            timing["score"].append(0.0)
            out = super()._generate_and_score_completions(inputs)
            self._in_generation = False
            timing["gen_and_score"].append(time.perf_counter() - start)
            timing["completion_length"].append(float(out["completion_mask"].sum(-1).float().mean()))
            completions = [tuple(ids[mask.bool()].tolist()) for ids, mask in zip(out["completion_ids"],
                                                                               out["completion_mask"])]
            # TRL repeats each prompt num_generations times in a row
            timing["distinct_per_group"].append(float(np.mean([len(set(completions[i:i + GROUP_SIZE]))
                                                               for i in range(0, len(completions), GROUP_SIZE)])))
            return out

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            start = time.perf_counter()
            out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            if self._in_generation:
                timing["score"][-1] += time.perf_counter() - start
            return out

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            timing["step"].append(time.perf_counter() - self.start)

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp, per_device_train_batch_size=GROUPS * GROUP_SIZE, num_generations=GROUP_SIZE,
            gradient_accumulation_steps=1, num_iterations=1, max_completion_length=completion_length, beta=KL,
            learning_rate=LR, weight_decay=0.01, max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0,
            temperature=1.0, top_p=1.0, top_k=0, max_steps=iterations, logging_steps=1, save_strategy="no",
            report_to=[], use_cpu=True, seed=SEED, shuffle_dataset=False, disable_tqdm=True, bf16=False)
        trainer = TimedGRPOTrainer(model=model, reward_funcs=format_reward, args=config, train_dataset=data,
                                   processing_class=tokenizer, callbacks=[StepTimer()])
        trainer.train()
    prompt_len = len(tokenizer.apply_chat_template(data[0]["prompt"], add_generation_prompt=True, tokenize=True,
                                                   return_dict=True)["input_ids"])
    iters = []
    for gs, sc, step, length, distinct in zip(timing["gen_and_score"], timing["score"], timing["step"],
                                              timing["completion_length"], timing["distinct_per_group"]):
        iters.append({"generate": gs - sc, "score": sc, "update": step - gs, "completion_length": length,
                      "distinct_per_group": distinct, "prompt_length": prompt_len})
    return {"iterations": iters}


def grpo_worker(result_file: str, argv: list[str]) -> None:
    """algos/grpo.py with ``argv`` in this process, its ``collect_rows`` counting the distinct responses per group
    of each iteration (written to ``result_file``)."""
    import arena_train.rollout as rollout

    collect, distinct = rollout.collect_rows, []

    def counted(*args, **kwargs):
        rows, episodes = collect(*args, **kwargs)
        groups = defaultdict(set)
        for r in rows:
            groups[r.group].add(tuple(r.response_ids))
        distinct.append(float(np.mean([len(g) for g in groups.values()])))
        return rows, episodes

    rollout.collect_rows = counted  # before the script's own ``from arena_train.rollout import collect_rows``
    script = ROOT / "algos" / "grpo.py"
    sys.argv = [str(script), *argv]
    runpy.run_path(str(script), run_name="__main__")
    Path(result_file).write_text(json.dumps(distinct))


def grpo_run(model_path: str, completion_length: int, iterations: int, threads: int, out: Path) -> dict:
    """One algos/grpo.py run (single turn, matched settings); per-iteration phase times from its metrics."""
    flags = ["--model-path", model_path, "--output-dir", str(out),
             "--run-name", "grpo", "--env-id", "ARL/Sokoban-Mini-v0", "--max-turns", "1", "--num-groups", str(GROUPS),
             "--group-size", str(GROUP_SIZE), "--max-response-tokens", str(completion_length), "--temperature", "1.0",
             "--top-p", "1.0", "--kl-coef", str(KL), "--learning-rate", str(LR), "--mini-batch-size",
             str(GROUPS * GROUP_SIZE), "--micro-batch-size", str(GROUPS * GROUP_SIZE), "--num-iterations",
             str(iterations), "--eval-every", "0", "--checkpoint-every", "0", "--torch-threads", str(threads),
             "--seed", str(SEED)]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--grpo-worker", str(out / "distinct.json"), "--", *flags]
    rss = run_measured(cmd, threads)
    lines = [json.loads(x) for x in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    distinct = json.loads((out / "distinct.json").read_text())
    iters = [{"generate": m["perf/time_rollout_s"] - m["perf/time_score_s"], "score": m["perf/time_score_s"],
              "update": m["perf/time_update_s"], "completion_length": m["rollout/response_length"],
              "distinct_per_group": d} for m, d in zip(lines, distinct)]
    return {"iterations": iters, "peak_rss_mib": rss, "command": shlex.join(cmd)}


def run_measured(cmd: list[str], threads: int, env_extra: dict[str, str] | None = None) -> float:
    """Run ``cmd``; its peak RSS in MiB (``wait4``'s rusage of that child alone). Raises on failure."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false",
           "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT), **(env_extra or {})}
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            log.seek(0)
            raise SystemExit(f"failed ({proc.returncode}): {shlex.join(cmd)}\n{log.read()[-3000:]}")
    return usage.ru_maxrss / 1024


def trl_run(model_path: str, completion_length: int, iterations: int, threads: int, out: Path) -> dict:
    result_file = out / "trl.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trl-worker", str(result_file), "--model", model_path,
           "--worker-completion-length", str(completion_length), "--iterations", str(iterations), "--threads",
           str(threads)]
    rss = run_measured(cmd, threads)
    return {**json.loads(result_file.read_text()), "peak_rss_mib": rss}


def summarise(run: dict, warmup: int) -> dict[str, float]:
    """Median per phase over the iterations after ``warmup``, tokens/s and the peak RSS."""
    iters = run["iterations"][warmup:]
    med = {k: float(np.median([it[k] for it in iters])) for k in (*PHASES, "completion_length", "distinct_per_group")}
    med["iteration"] = float(np.median([sum(it[p] for p in PHASES) for it in iters]))
    rows = GROUPS * GROUP_SIZE
    med["gen_tok_s"] = rows * med["completion_length"] / max(med["generate"], 1e-9)
    row_tokens = rows * (119 + med["completion_length"])  # 119-token prompts (checked by the TRL worker)
    med["score_tok_s"] = row_tokens / max(med["score"], 1e-9)
    med["update_tok_s"] = row_tokens / max(med["update"], 1e-9)
    med["peak_rss_mib"] = run["peak_rss_mib"]
    return med


def single_turn(args) -> None:
    from arena_models import resolve_model_path

    print(f"## grpo.py vs TRL GRPOTrainer: {GROUPS} prompts x {GROUP_SIZE} completions, KL {KL}, float32, "
          f"{args.threads} thread(s), {args.iterations} iterations per run ({args.warmup} warm-up skipped), "
          f"{args.rounds} alternating rounds")
    for size in args.sizes:
        model_path = resolve_model_path(f"tiny-{size}")
        n_params = _count_params(model_path)
        for length in args.completion_lengths:
            runs: dict[str, list[dict]] = {"grpo": [], "trl": []}
            for r in range(args.rounds):
                order = ("grpo", "trl") if r % 2 == 0 else ("trl", "grpo")
                for name in order:
                    with tempfile.TemporaryDirectory() as tmp:
                        fn = grpo_run if name == "grpo" else trl_run
                        runs[name].append(summarise(fn(model_path, length, args.iterations, args.threads,
                                                       Path(tmp)), args.warmup))
                    print(f"  run: tiny-{size} C={length} round {r} {name}: "
                          + ", ".join(f"{k} {v:.2f}" for k, v in runs[name][-1].items()), flush=True)
            _print_config(f"tiny-{size} ({n_params / 1e6:.1f} M params), completion length {length}", runs)
    print("\nRemaining mismatches of the workloads:")
    for m in MISMATCHES:
        print(f"- {m}")


def _count_params(model_path: str) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    return sum(p.numel() for p in model.parameters())


def _print_config(title: str, runs: dict[str, list[dict]]) -> None:
    print(f"\n### {title}")
    print("| | generate s | score s | update s | iteration s | gen tok/s | score tok/s | update tok/s | "
          "completion len | distinct / group of 8 | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, label in (("grpo", "grpo.py"), ("trl", "TRL")):
        s = {k: float(np.median([r[k] for r in runs[name]])) for k in runs[name][0]}
        print(f"| {label} (median of runs) | {s['generate']:.2f} | {s['score']:.2f} | {s['update']:.2f} | "
              f"{s['iteration']:.2f} | {s['gen_tok_s']:,.0f} | {s['score_tok_s']:,.0f} | {s['update_tok_s']:,.0f} | "
              f"{s['completion_length']:.1f} | {s['distinct_per_group']:.1f} | {s['peak_rss_mib']:,.0f} |")
    ratios = {k: [g[k] / max(t[k], 1e-9) for g, t in zip(runs["grpo"], runs["trl"])]
              for k in (*PHASES, "iteration", "peak_rss_mib")}
    print("| grpo.py / TRL, min / median over rounds | " + " | ".join(
        f"{min(ratios[k]):.2f} / {np.median(ratios[k]):.2f}" for k in (*PHASES, "iteration"))
        + " | | | | | | " + f"{min(ratios['peak_rss_mib']):.2f} / {np.median(ratios['peak_rss_mib']):.2f} |")


def multi_turn(args) -> None:
    """sampo.py at the mini-arena's RL settings: this checkout vs the baseline ref, alternating."""
    model = args.multi_turn_model
    flags = ["--model-path", model, "--env-id", "ARL/Sokoban-Mini-v0", "--num-groups", "8", "--group-size", "8",
             "--max-turns", "10", "--max-response-tokens", "8", "--temperature", "0.5", "--learning-rate", "1e-4",
             "--mini-batch-size", "128", "--micro-batch-size", "128", "--history-length", "0", "--prompt-style",
             "compact", "--cold-start-steps", "0", "--num-iterations", str(args.iterations), "--eval-every", "0",
             "--checkpoint-every", "0", "--seed", str(SEED)]
    print(f"\n## Multi-turn: algos/sampo.py, mini-arena RL settings (8 groups x 8, 10 turns), model {model}, "
          f"{args.iterations} iterations per run ({args.warmup} warm-up skipped), {args.rounds} alternating rounds")
    with tempfile.TemporaryDirectory() as tmp:
        base = args.baseline_dir
        if base is None:
            base = Path(tmp) / "baseline"
            base.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline_ref], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        variants = {f"baseline {args.baseline_dir or args.baseline_ref}, 1 thread": (base, 1),
                    **{f"this checkout, {n} thread(s)": (ROOT, n) for n in args.multi_turn_threads}}
        times: dict[str, list[float]] = {k: [] for k in variants}
        rows: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(args.rounds):
            names = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in names:
                root, threads = variants[name]
                out = Path(tmp) / f"run{r}-{list(variants).index(name)}"
                cmd = [sys.executable, str(root / "algos" / "sampo.py"), *flags, "--torch-threads", str(threads),
                       "--output-dir", str(out), "--run-name", "sampo"]
                run_measured(cmd, threads, {"PYTHONPATH": str(root)})
                lines = [json.loads(x) for x in (out / "sampo" / "metrics.jsonl").read_text().splitlines()]
                steady = lines[args.warmup:]
                times[name].append(float(np.median([m["perf/time_rollout_s"] + m["perf/time_update_s"]
                                                    for m in steady])))
                rows[name].append(float(np.mean([m["rollout/num_rows"] for m in steady])))
                print(f"  run: round {r} {name}: iteration {times[name][-1]:.2f} s, {rows[name][-1]:.0f} rows",
                      flush=True)
    base_name = next(iter(variants))
    print("| variant | iteration s, min / median | rows per iteration | speed-up vs baseline, min / median |")
    print("|---|---|---|---|")
    for name in variants:
        speedup = [b / t for b, t in zip(times[base_name], times[name])]
        print(f"| {name} | {min(times[name]):.2f} / {np.median(times[name]):.2f} | {np.mean(rows[name]):.0f} | "
              f"{min(speedup):.2f}x / {np.median(speedup):.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["s", "m"], help="arena_models tiny sizes (s: 1.1 M, m: 14.7 M)")
    parser.add_argument("--completion-lengths", nargs="+", type=int, default=[16, 64])
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs per configuration")
    parser.add_argument("--iterations", type=int, default=3, help="iterations per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=1, help="first iterations of each run left out")
    parser.add_argument("--threads", type=int, default=1, help="threads of both trainers in the single-turn half")
    parser.add_argument("--multi-turn-threads", type=int, nargs="+",
                        default=[1, default_threads(0)],
                        help="thread counts of this checkout in the multi-turn half (the baseline runs 1, its default)")
    parser.add_argument("--skip-single-turn", action="store_true")
    parser.add_argument("--skip-multi-turn", action="store_true")
    parser.add_argument("--baseline-ref", default="main", help="git ref of the multi-turn baseline")
    parser.add_argument("--baseline-dir", type=Path, help="a checkout of the baseline instead of --baseline-ref")
    parser.add_argument("--multi-turn-model", default="checkpoints/sft-sokoban-tiny",
                        help="policy of the multi-turn half (default: algos/sft.py's checkpoint; 'tiny' = untrained)")
    parser.add_argument("--trl-worker", help=argparse.SUPPRESS)
    parser.add_argument("--grpo-worker", help=argparse.SUPPRESS)
    parser.add_argument("grpo_args", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--worker-completion-length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.warmup >= args.iterations:
        parser.error("--iterations must exceed --warmup (warm-up iterations are left out)")
    args.multi_turn_threads = sorted(set(args.multi_turn_threads))
    if args.grpo_worker:
        grpo_worker(args.grpo_worker, args.grpo_args)
        return
    if args.trl_worker:
        result = trl_worker(args.model, args.worker_completion_length, args.iterations, args.threads)
        Path(args.trl_worker).write_text(json.dumps(result))
        return
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"load average {os.getloadavg()[0]:.1f} at start")
    if not args.skip_single_turn:
        single_turn(args)
    if not args.skip_multi_turn:
        multi_turn(args)


if __name__ == "__main__":
    main()
