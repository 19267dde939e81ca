"""SmolLM2-135M on a CPU: rollout and update tokens/s of the arena_train path against plain transformers doing the
same work, and both against the CPU's measured fp32 matmul rate, in one run.

Work (both sides, float32, the same pinned thread count, the same model object):

- rollout: the first prompts of ``--prompts`` Sokoban-Mini episodes (``info["messages"]`` after reset, encoded
  with ``arena_train.rollout.encode_prompt``), left-padded into one batch, sampled at temperature 1 for
  ``--max-new-tokens``. Ours: ``HFBackend.generate_scored`` (its own decoding loop; it also records each token's
  log-prob and entropy). Plain: ``model.generate(do_sample=True)`` on the same padded batch, the same end ids.
- update: one training step on the rows ours sampled (the same rows for both sides): forward, response log-probs,
  a token-mean policy-gradient loss, backward, grad-norm clip, AdamW step. Ours: ``make_batch(share_prefix=True)``
  + ``sequence_logprobs`` (LM head on the response positions only, chunked log-softmax) + ``agg_loss``. Plain: one
  forward that returns every position's logits, ``log_softmax`` + ``gather`` on the response positions.
- baseline of the machine: ``torch.mm`` of ``--matmul-size``-square fp32 matrices (GFLOP/s = 2 n^3 / s), run as
  a third side of every alternation (the same load as the model runs beside it).

Achieved GFLOP/s counts 2 * params per token forward (generation: prompt + generated tokens; the same nominal
count for both sides, although ours prefills columns shared by the batch once) and 6 * params per trained token
(prompt + response). Every measurement is a median over ``--repeats`` after ``--warmup`` untimed runs; the sides
alternate and their order flips every repeat (the machine is shared: the load average is recorded). Where the time
goes: a prefill / decode split (a 1-token generation timed on its own), a forward / backward / optimizer split, and
``torch.profiler``'s top ops by self CPU time per side (one extra, untimed run each).

Not a test: numbers depend on the machine and its load. Writes ``--out`` (JSON) and prints a table.

    python benchmarks/bench_real_model.py                       # 8 prompts x 32 new tokens, 1 thread, 3 repeats
    python benchmarks/bench_real_model.py --prompts 16 --max-new-tokens 64 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]

LR = 1e-6  # the step's size does not change its cost; weights are restored after every timed step anyway


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), printed beside every time: figures of another CPU do not compare."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load() -> float:
    """1-minute load average: on a shared machine, wall times are only comparable at a similar load."""
    return round(os.getloadavg()[0], 2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model-path", default="smollm2", help="'smollm2' or a model folder")
    parser.add_argument("--env-id", default="ARL/Sokoban-Mini-v0")
    parser.add_argument("--prompts", type=int, default=8, help="episodes whose first prompt forms the batch")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (pin them on a shared machine)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of every measurement first")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the median is reported")
    parser.add_argument("--matmul-size", type=int, default=2048, help="n of the n x n fp32 torch.mm baseline")
    parser.add_argument("--profile-top", type=int, default=8, help="ops per side in the profile (0: no profile)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_real_model.json")
    return parser.parse_args(argv)


# ---- set-up ----------------------------------------------------------------------------------------------------

def load_model(model_path: str):
    """float32 model and tokenizer with the chat format configured as a training run configures it, so both
    sides stop at the same end-of-turn ids."""
    from arena_models import resolve_model_path
    from arena_train import chat
    from arena_train.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(str(resolve_model_path(model_path)), torch.float32)
    chat.configure(tokenizer, model.generation_config)
    model.eval()
    return model, tokenizer


def first_prompts(tokenizer, env_id: str, n: int, max_tokens: int) -> list[list[int]]:
    """Token ids of the first prompt of episodes 0..n-1, as the training rollout encodes them."""
    import wrappers
    from arena_train.rollout import encode_prompt

    prompts = []
    for seed in range(n):
        env = wrappers.make_env(env_id)
        _, info = env.reset(seed=seed)
        prompts.append(encode_prompt(tokenizer, info["messages"], max_tokens)[0])
        env.close()
    return prompts


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of the left-padded batch, as ``HFBackend`` builds it."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):], attn[b, width - len(p):] = torch.tensor(p), 1
    return ids, attn


def param_count(model) -> int:
    """Distinct parameters (SmolLM2 ties its embedding and LM head: counted once, as its FLOPs are)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


# ---- the two sides ---------------------------------------------------------------------------------------------

def ours_generate(model, tokenizer, prompts: list[list[int]], new_tokens: int, seed: int) -> list[list[int]]:
    """``HFBackend.generate_scored``, as the training scripts' rollout calls it (sampled, per-prompt seeds)."""
    from arena_train.backends import HFBackend

    backend = HFBackend(model, tokenizer)
    responses, logps, _ = backend.generate_scored(prompts, new_tokens, 1.0, 1.0,
                                                  seeds=[seed + k for k in range(len(prompts))])
    ours_generate.logps = logps  # the rows' behaviour log-probs (old_logp of the update)
    return responses


def plain_generate(model, tokenizer, prompts: list[list[int]], new_tokens: int, seed: int) -> list[list[int]]:
    """``model.generate(do_sample=True)`` on the same left-padded batch, temperature 1 without top-k / top-p, the
    same end ids; responses cut after their first end id, as ours are."""
    from arena_train.chat import format_of

    end_ids = format_of(tokenizer).end_ids
    ids, attn = left_pad(prompts, tokenizer.pad_token_id)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=new_tokens, eos_token_id=end_ids,
                             pad_token_id=tokenizer.pad_token_id)
    responses = []
    for seq in out[:, ids.shape[1]:].tolist():
        end = next((k + 1 for k, t in enumerate(seq) if t in end_ids), len(seq))
        responses.append(seq[:end])
    return responses


def make_rows(prompts: list[list[int]], responses: list[list[int]], logps: list[list[float]], seed: int) -> list:
    """Training rows of the sampled responses: one group per prompt, advantages +-1, old log-probs = the
    rollout's (the policy-gradient ratio then starts at 1, as on-policy GRPO's does)."""
    from arena_train.rollout import Row

    rng = np.random.default_rng(seed)
    return [Row(group=k, episode=k, turn=0, prompt_ids=p, response_ids=r, step_reward=0.0, format_penalty=0.0,
                format_ok=True, action_is_valid=True, anchor=None, won=False, advantage=float(rng.choice([-1, 1])),
                old_logp=np.asarray(lp, dtype=np.float32), rollout_logp=np.asarray(lp, dtype=np.float32))
            for k, (p, r, lp) in enumerate(zip(prompts, responses, logps))]


def ours_step(model, optimizer, rows, pad_id: int, times: dict[str, float]) -> None:
    """One update step through ``algos/grpo.py``'s path: ``make_batch`` (shared prefixes), ``sequence_logprobs``,
    ``agg_loss`` token-mean; ``times`` gets the forward / backward / optimizer seconds."""
    from arena_train.batching import make_batch, sequence_logprobs
    from arena_train.losses import agg_loss

    t0 = time.perf_counter()
    batch = make_batch(rows, pad_id, "cpu", share_prefix=True)
    logp, _ = sequence_logprobs(model, batch, 1.0, with_entropy=False)
    ratio = torch.exp(logp - batch["old_logp"])
    loss = agg_loss(-batch["advantages"] * ratio, batch["mask"], "token-mean")
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    times.update(forward=t1 - t0, backward=t2 - t1, optimizer=time.perf_counter() - t2)


def plain_step(model, optimizer, rows, pad_id: int, times: dict[str, float]) -> None:
    """The same step written with plain transformers: the same padded layout (prompt left-padded, response
    right-padded), one forward returning all logits, ``log_softmax`` + ``gather`` of the response tokens."""
    t0 = time.perf_counter()
    P = max(len(r.prompt_ids) for r in rows)
    T = max(len(r.response_ids) for r in rows)
    ids = torch.full((len(rows), P + T), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask, old, adv = torch.zeros(len(rows), T), torch.zeros(len(rows), T), torch.zeros(len(rows), T)
    for b, r in enumerate(rows):
        p, n = len(r.prompt_ids), len(r.response_ids)
        ids[b, P - p:P], ids[b, P:P + n], attn[b, P - p:P + n] = torch.tensor(r.prompt_ids), torch.tensor(
            r.response_ids), 1
        mask[b, :n], old[b, :n], adv[b, :n] = 1.0, torch.as_tensor(r.stored("old_logp")), r.advantage
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=positions).logits  # (B, P+T, V)
    logp = torch.log_softmax(logits[:, P - 1:-1].float(), -1).gather(-1, ids[:, P:, None]).squeeze(-1)
    loss = ((-adv * torch.exp(logp - old)) * mask).sum() / mask.sum()
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    times.update(forward=t1 - t0, backward=t2 - t1, optimizer=time.perf_counter() - t2)


# ---- measuring -------------------------------------------------------------------------------------------------

MATMUL_CALLS = 3  # torch.mm calls per matmul run (2048^3: about a second in all on one loaded core)


def matmul_side(n: int) -> Callable[[], None]:
    """A run of ``MATMUL_CALLS`` fp32 ``torch.mm`` of two n x n matrices at the current thread count: what this
    CPU gives a large dense matmul, the ceiling the model's achieved rate is read against. It runs as a third side
    of every alternation, so that it sees the same load as the model runs beside it (a rate measured once, at
    another moment of a shared machine, can lie below what the model then achieves)."""
    a, b = torch.randn(n, n), torch.randn(n, n)

    def run() -> None:
        for _ in range(MATMUL_CALLS):
            torch.mm(a, b)
    return run


def matmul_gflops(n: int, seconds: list[float]) -> float:
    return statistics.median(2 * n ** 3 * MATMUL_CALLS / s / 1e9 for s in seconds)


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def profile_top(fn: Callable[[], object], top: int) -> list[dict]:
    """The ``top`` ops by self CPU time of one run of ``fn``, with their share of the profiled total."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    return [{"op": e.key, "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 1), "calls": e.count,
             "share": round(e.self_cpu_time_total / total, 3)} for e in events[:top]]


def alternate(sides: dict[str, Callable[[], object]], warmup: int, repeats: int) -> dict[str, list[float]]:
    """Seconds per run of each side: ``warmup`` untimed rounds, then ``repeats`` rounds whose side order flips
    every round (a load change on the shared machine then hits both sides alike)."""
    names = list(sides)
    for _ in range(warmup):
        for name in names:
            sides[name]()
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for k in range(repeats):
        for name in names if k % 2 == 0 else names[::-1]:
            seconds[name].append(timed(sides[name])[0])
    return seconds


def summary(seconds: list[float], tokens: int, flops_per_run: float) -> dict:
    median = statistics.median(seconds)
    return {"seconds": [round(s, 3) for s in seconds], "median_s": round(median, 3),
            "tokens_per_s": round(tokens / median, 1), "gflops": round(flops_per_run / median / 1e9, 2)}


def measure_rollout(model, tokenizer, prompts, args, n_params: int) -> tuple[dict, list]:
    """Both generators timed alternately, then their 1-token (prefill) runs; returns the results and ours' rows
    for the update (sampled in the warm-up, the same for both update sides)."""
    new = args.max_new_tokens
    outputs: dict[str, list[list[int]]] = {}

    def side(fn, name, n_new):
        def run():
            outputs[name] = fn(model, tokenizer, prompts, n_new, args.seed)
        return run

    full = alternate({"ours": side(ours_generate, "ours", new), "plain": side(plain_generate, "plain", new),
                      "matmul": matmul_side(args.matmul_size)}, args.warmup, args.repeats)
    rows = make_rows(prompts, outputs["ours"], ours_generate.logps, args.seed)
    lengths = {name: [len(r) for r in outputs[name]] for name in ("ours", "plain")}
    prefill = alternate({"ours": side(ours_generate, "ours1", 1), "plain": side(plain_generate, "plain1", 1)},
                        0, args.repeats)  # warm already: the same prompts were just prefilled
    prompt_tokens = sum(len(p) for p in prompts)
    result = {}
    for name in ("ours", "plain"):
        generated = sum(lengths[name])
        result[name] = {**summary(full[name], generated, 2 * n_params * (prompt_tokens + generated)),
                        "generated_tokens": generated, "decode_steps": max(lengths[name]),
                        "stopped_at_end_id": sum(n < new for n in lengths[name]),
                        "prefill_median_s": round(statistics.median(prefill[name]), 3)}
        steps = max(result[name]["decode_steps"] - 1, 1)
        result[name]["decode_ms_per_step"] = round(
            (result[name]["median_s"] - result[name]["prefill_median_s"]) / steps * 1e3, 1)
    result["ratio_ours_over_plain_tokens_per_s"] = round(
        result["ours"]["tokens_per_s"] / result["plain"]["tokens_per_s"], 3)
    result["matmul_gflops"] = round(matmul_gflops(args.matmul_size, full["matmul"]), 1)
    if args.profile_top:
        for name, fn in (("ours", ours_generate), ("plain", plain_generate)):
            result[name]["profile_top_ops"] = profile_top(
                lambda fn=fn: fn(model, tokenizer, prompts, new, args.seed), args.profile_top)
    return result, rows


def measure_update(model, rows, pad_id: int, args, n_params: int) -> dict:
    """Both training steps timed alternately on the same rows from the same weights (restored after every step,
    untimed), each with its own AdamW (its state allocated in the warm-up)."""
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=LR) for name in ("ours", "plain")}
    splits: dict[str, list[dict[str, float]]] = {"ours": [], "plain": []}

    def side(step, name):
        def run():
            model.train()
            times: dict[str, float] = {}
            step(model, optimizers[name], rows, pad_id, times)
            splits[name].append(times)
            model.eval()
            with torch.no_grad():
                model.load_state_dict(initial)
        return run

    sides = {"ours": side(ours_step, "ours"), "plain": side(plain_step, "plain")}
    seconds = alternate({**sides, "matmul": matmul_side(args.matmul_size)}, args.warmup, args.repeats)
    # the timed runs include the weight restore: the step's own time is the sum of its split
    tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    result = {"rows": len(rows), "trained_tokens": tokens, "response_tokens": sum(len(r.response_ids) for r in rows)}
    for name in ("ours", "plain"):
        timed_splits = splits[name][args.warmup:]
        step_s = [sum(t.values()) for t in timed_splits]
        result[name] = {**summary(step_s, tokens, 6 * n_params * tokens),
                        "with_weight_restore_median_s": round(statistics.median(seconds[name]), 3),
                        "split_median_s": {k: round(statistics.median(t[k] for t in timed_splits), 3)
                                           for k in ("forward", "backward", "optimizer")}}
    result["ratio_ours_over_plain_tokens_per_s"] = round(
        result["ours"]["tokens_per_s"] / result["plain"]["tokens_per_s"], 3)
    result["matmul_gflops"] = round(matmul_gflops(args.matmul_size, seconds["matmul"]), 1)
    if args.profile_top:
        for name in ("ours", "plain"):
            result[name]["profile_top_ops"] = profile_top(sides[name], args.profile_top)
    return result


# ---- report ----------------------------------------------------------------------------------------------------

def table(record: dict) -> str:
    """The short table printed at the end (one line per phase and side)."""
    lines = [f"{record['model']} ({record['params'] / 1e6:.1f} M params), {record['cpu']}, "
             f"{record['torch_threads']} thread(s), load {record['load_average']['start']} -> "
             f"{record['load_average']['end']}; fp32 matmul {record['matmul_gflops']:.1f} GFLOP/s (median, "
             f"interleaved with the runs)",
             f"{'phase':<8} {'side':<6} {'median s':>9} {'tokens/s':>9} {'GFLOP/s':>8} {'of matmul':>10}  split"]
    for phase in ("rollout", "update"):
        mm = record[phase]["matmul_gflops"]
        for side in ("ours", "plain"):
            r = record[phase][side]
            split = (f"prefill {r['prefill_median_s']} s, decode {r['decode_ms_per_step']} ms/step"
                     if phase == "rollout" else
                     ", ".join(f"{k} {v} s" for k, v in r["split_median_s"].items()))
            lines.append(f"{phase:<8} {side:<6} {r['median_s']:>9.3f} {r['tokens_per_s']:>9.1f} {r['gflops']:>8.2f} "
                         f"{r['gflops'] / mm:>9.1%}  {split}")
        lines.append(f"{phase:<8} ours/plain tokens/s: {record[phase]['ratio_ours_over_plain_tokens_per_s']:.2f}x"
                     f" (matmul beside it {mm:.1f} GFLOP/s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start_load, t_start = load(), time.perf_counter()
    model, tokenizer = load_model(args.model_path)
    n_params = param_count(model)
    prompts = first_prompts(tokenizer, args.env_id, args.prompts, args.max_prompt_tokens)
    rollout, rows = measure_rollout(model, tokenizer, prompts, args, n_params)
    update = measure_update(model, rows, tokenizer.pad_token_id, args, n_params)
    record = {
        "command": " ".join(["python", "benchmarks/bench_real_model.py", *(sys.argv[1:] if argv is None else argv)]),
        "cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "load_average": {"start": start_load, "end": load()}, "model": args.model_path, "params": n_params,
        "env_id": args.env_id, "prompts": args.prompts, "prompt_tokens": [len(p) for p in prompts],
        "max_new_tokens": args.max_new_tokens, "warmup": args.warmup, "repeats": args.repeats,
        "matmul_size": args.matmul_size,
        "matmul_gflops": round(statistics.median([rollout["matmul_gflops"], update["matmul_gflops"]]), 1),
        "rollout": rollout, "update": update, "wall_s": round(time.perf_counter() - t_start, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(table(record))
    print(f"\nwrote {args.out}")
    return record


if __name__ == "__main__":
    main()
