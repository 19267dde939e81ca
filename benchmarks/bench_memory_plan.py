"""Checks ``arena_train.memory``'s plan against a measured peak, on CPU.

For each model size, a fresh process builds the policy and a frozen reference in float32, takes one AdamW step
on a micro-batch through the training scripts' log-prob pass (``arena_train.batching.sequence_logprobs``: LM head
on the response positions only, vocabulary-chunked log-softmax), and records its peak resident memory above what
it held after imports (``ru_maxrss``). The plan is computed with the CPU's settings (fp32 everywhere, no rollout
share, no CUDA overhead) and the ratio measured / planned is printed. Baseline: the process's own resident memory
after ``import torch, transformers``.

    python benchmarks/bench_memory_plan.py [--sizes m small] [--micro-batch 8] [--seq-len 512]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

#: (hidden, layers, MLP, heads, kv heads); head_dim 32, vocab 32k: the shape family of Qwen3, scaled down.
SIZES = {"m": (256, 4, 768, 8, 4), "small": (512, 8, 1536, 16, 8), "base": (768, 12, 2304, 24, 8)}

CHILD = r"""
import json, resource, sys, torch
from transformers import Qwen3Config, AutoModelForCausalLM
from arena_train.batching import sequence_logprobs
hidden, layers, mlp, heads, kv, B, L, T = json.loads(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cfg = Qwen3Config(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=mlp, num_attention_heads=heads,
                  num_key_value_heads=kv, head_dim=32, vocab_size=32000, tie_word_embeddings=True,
                  attn_implementation="sdpa")
policy, ref = AutoModelForCausalLM.from_config(cfg), AutoModelForCausalLM.from_config(cfg)
ref.requires_grad_(False)
opt = torch.optim.AdamW(policy.parameters(), lr=1e-5)
ids = torch.randint(0, 32000, (B, L))
batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=torch.arange(L).expand(B, L),
             response_ids=ids[:, -T:], mask=torch.ones(B, T))
for _ in range(2):  # the second step has AdamW's moments allocated
    with torch.no_grad():  # the reference is scored before the update, as in the scripts
        sequence_logprobs(ref, batch, 1.0, with_entropy=False)
    logp, entropy = sequence_logprobs(policy, batch, 1.0)  # the training scripts' log-prob pass
    (-logp.mean() - 0.001 * entropy.mean()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"measured": (peak - before) * 1024, "params": sum(p.numel() for p in policy.parameters())}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["m", "small"], choices=sorted(SIZES))
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--response-len", type=int, default=128)
    args = parser.parse_args()
    from transformers import Qwen3Config

    from arena_train.memory import GIB, model_shape, plan_memory

    print(f"micro-batch {args.micro_batch} x {args.seq_len} tokens ({args.response_len} response), fp32, 1 thread")
    print(f"{'size':<7}{'params':>10}{'planned MiB':>13}{'measured MiB':>14}{'ratio':>8}")
    for size in args.sizes:
        hidden, layers, mlp, heads, kv = SIZES[size]
        spec = json.dumps([hidden, layers, mlp, heads, kv, args.micro_batch, args.seq_len, args.response_len])
        out = subprocess.run([sys.executable, "-c", CHILD, spec], capture_output=True, text=True, check=True)
        measured = json.loads(out.stdout.strip().splitlines()[-1])["measured"]
        shape = model_shape(Qwen3Config(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=mlp,
                                        num_attention_heads=heads, num_key_value_heads=kv, head_dim=32,
                                        vocab_size=32000, tie_word_embeddings=True))
        plan = plan_memory(shape, gpus=1, micro_batch_size=args.micro_batch, seq_len=args.seq_len,
                           response_len=args.response_len, gradient_checkpointing=False, act_bytes=4,
                           param_bytes=4, frozen_bytes=4, rollout_share=0.0, gpu_memory_gib=1e6, overhead_gib=0.0)
        mib = GIB / 1024
        print(f"{size:<7}{shape.params / 1e6:>9.1f}M{plan.total / mib:>13.0f}{measured / mib:>14.0f}"
              f"{measured / plan.total:>8.2f}")


if __name__ == "__main__":
    main()
