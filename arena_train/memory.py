"""Per-GPU memory plan of a training run, computed before anything is allocated.

``python -m arena_train.memory --model Qwen3-4B --gpus 8 --sharding fsdp`` builds the model on the meta
device (exact parameter counts, no weights), then adds up what one GPU holds during the update: the policy's
weights, gradients and AdamW state (sharded or not), the frozen reference, saved activations at the configured
micro-batch, the LM-head log-softmax of the response tokens and the rollout engine's share. It says whether the
sum fits, so a run that cannot fit stops before it loads 60 GB of weights. ``--table`` prints the README's grid.

Byte counts per parameter (P = parameters, W = processes sharing the shards):

- full fine-tuning: fp32 master weights (4) + fp32 gradients (4) + AdamW's two fp32 moments (8) = 16 bytes,
  divided by W under FSDP / ZeRO-3; DDP keeps a full replica plus its fp32 gradient buckets (4 more). bf16
  master weights are not offered: at the paper's learning rate (1e-6) most AdamW updates are below bf16's
  resolution (2^-8 relative) and would be lost.
- LoRA: frozen base weights in bf16 (2 bytes, /W when sharded) + 16 bytes per adapter parameter; the reference
  is the base with adapters disabled, so it costs nothing.
- reference model (full fine-tuning): bf16, sharded like the policy.

Activations per token per decoder layer (autograd-saved tensors of a transformers Qwen3 layer with SDPA/flash
attention, no S^2 term): ``6h + 8q + 7kv + 4I`` elements (h hidden, q = heads*head_dim, kv = kv_heads*head_dim,
I = MLP width): each RMSNorm keeps its input, normalised and scaled tensors (3h, 3q, 3kv), RoPE the normed q/k
and their rotated halves, attention q, k, v and its output, o_proj a contiguous copy, the MLP four I-wide
tensors. Gradient checkpointing keeps only each layer's input (h) plus one layer recomputed. The LM head runs on
the response positions only and its log-softmax runs in vocabulary chunks (``arena_train.logprob``): at the peak
of its backward the logits and their gradient (two ``B*T*V`` tensors at the activation width) are alive, plus
three float32 ``B*T*chunk`` temporaries. ``benchmarks/bench_memory_plan.py`` compares the sum with a measured peak.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from typing import Literal

from arena_train.logprob import VOCAB_CHUNK
from arena_train.models import LORA_TARGETS, resolve_policy_path

GIB = 1024**3
Sharding = Literal["ddp", "fsdp", "zero3"]

#: Public Qwen3 shapes (config.json of each release), so plans need no download.
QWEN3_SHAPES: dict[str, dict[str, int | bool]] = {
    "Qwen3-0.6B": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True),
    "Qwen3-1.7B": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=6144, vocab_size=151936, tie_word_embeddings=True),
    "Qwen3-4B": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True),
    "Qwen3-8B": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False),
}


@dataclass(frozen=True)
class Shape:
    """What the plan needs to know about a decoder-only model."""

    params: int
    hidden: int
    layers: int
    q_dim: int
    kv_dim: int
    mlp: int
    vocab: int
    lora_params_per_rank: int  # adapter parameters for rank 1 on LORA_TARGETS (scale by the rank)


def model_shape(config) -> Shape:
    """Exact counts from a transformers config, by building the model on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    lora = sum(m.in_features + m.out_features for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in LORA_TARGETS)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return Shape(params=sum(p.numel() for p in model.parameters()), hidden=config.hidden_size,
                 layers=config.num_hidden_layers, q_dim=config.num_attention_heads * head_dim,
                 kv_dim=config.num_key_value_heads * head_dim, mlp=config.intermediate_size,
                 vocab=config.vocab_size, lora_params_per_rank=lora)


def named_shape(name: str) -> Shape:
    """Shape of a public Qwen3 size by name (``Qwen3-4B``) or of a local/hub config path."""
    from transformers import AutoConfig, Qwen3Config

    if name in QWEN3_SHAPES:
        return model_shape(Qwen3Config(**QWEN3_SHAPES[name]))
    return model_shape(AutoConfig.from_pretrained(name))


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes one GPU holds at the peak of the update, by component."""

    components: dict[str, float]
    capacity: float

    @property
    def total(self) -> float:
        return sum(self.components.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def format(self) -> str:
        rows = [f"{name:<34}{value / GIB:>9.2f} GiB" for name, value in self.components.items()]
        verdict = "fits" if self.fits else "does NOT fit"
        rows.append(f"{'total':<34}{self.total / GIB:>9.2f} GiB of {self.capacity / GIB:.1f} GiB: {verdict}")
        return "\n".join(rows)


def plan_memory(shape: Shape, *, gpus: int = 1, sharding: Sharding = "fsdp", lora_rank: int = 0,
                micro_batch_size: int = 8, seq_len: int = 4608, response_len: int = 512,
                gradient_checkpointing: bool = True, act_bytes: int = 2, param_bytes: int = 4,
                frozen_bytes: int = 2, rollout_share: float = 0.35, gpu_memory_gib: float = 80.0,
                overhead_gib: float = 1.5) -> MemoryPlan:
    """Per-GPU bytes of one training process (see the module docstring for every assumption).

    ``param_bytes`` is the trainable weights' storage (4 = fp32 master weights); ``frozen_bytes`` that of
    frozen copies (2 = bf16); ``act_bytes`` that of activations (2 under bf16 autocast, 4 in fp32);
    ``rollout_share`` the fraction of the GPU given to the vLLM engine (0 with the transformers backend).
    """
    shard = gpus if sharding in ("fsdp", "zero3") else 1
    P = shape.params
    c: dict[str, float] = {}
    if lora_rank > 0:
        adapters = shape.lora_params_per_rank * lora_rank
        c["policy weights (frozen base)"] = frozen_bytes * P / shard
        c["LoRA adapters + grads + AdamW"] = (param_bytes * 2 + 8) * adapters
        c["reference (adapters disabled)"] = 0.0
    else:
        c["policy weights"] = param_bytes * P / shard
        c["gradients"] = param_bytes * P / shard + (4 * P if sharding == "ddp" and gpus > 1 else 0)
        c["AdamW moments (fp32)"] = 8 * P / shard
        c["reference model"] = frozen_bytes * P / shard
    if shard > 1:  # one layer gathered in full (plus the next one prefetched)
        per_layer = (P - shape.vocab * shape.hidden) / max(shape.layers, 1)
        c["gathered layers (2)"] = 2 * frozen_bytes * per_layer
    tokens = micro_batch_size * seq_len
    full_layer = 6 * shape.hidden + 8 * shape.q_dim + 7 * shape.kv_dim + 4 * shape.mlp
    if gradient_checkpointing:
        act = tokens * act_bytes * (shape.hidden * shape.layers + full_layer)
    else:
        act = tokens * act_bytes * full_layer * shape.layers
    c["activations"] = act
    head_tokens = micro_batch_size * response_len
    c["LM-head logits + grad (chunked)"] = head_tokens * (2 * act_bytes * shape.vocab
                                                                 + 3 * 4 * min(VOCAB_CHUNK, shape.vocab))
    c["rollout engine share"] = rollout_share * gpu_memory_gib * GIB
    c["CUDA context + fragmentation"] = overhead_gib * GIB
    return MemoryPlan(components=c, capacity=gpu_memory_gib * GIB)


def rollout_engine_note(shape: Shape, plan_share_gib: float, frozen_bytes: int = 2) -> str | None:
    """A warning when the engine's share cannot even hold its own copy of the weights."""
    weights = frozen_bytes * shape.params / GIB
    if plan_share_gib and weights > 0.8 * plan_share_gib:
        return (f"the rollout engine's {plan_share_gib:.1f} GiB holds {weights:.1f} GiB of weights, leaving "
                f"little KV cache: raise --vllm-gpu-memory-utilization or use LoRA/more GPUs")
    return None


def readme_table(gpu_memory_gib: float = 80.0, **kwargs) -> str:
    """The README grid: Qwen3 sizes x {1, 8} GPUs x {full, LoRA r=64}, GiB per GPU and whether it fits."""
    lines = ["| model | params | GPUs | full fine-tuning (GiB/GPU) | LoRA r=64 (GiB/GPU) |", "|---|---|---|---|---|"]
    for name in QWEN3_SHAPES:
        shape = named_shape(name)
        for gpus in (1, 8):
            cells = []
            for rank in (0, 64):
                plan = plan_memory(shape, gpus=gpus, lora_rank=rank, gpu_memory_gib=gpu_memory_gib, **kwargs)
                cells.append(f"{plan.total / GIB:.1f} {'fits' if plan.fits else '**no**'}")
            lines.append(f"| {name} | {shape.params / 1e9:.2f} B | {gpus} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m arena_train.memory", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="Qwen3-4B", help=f"{', '.join(QWEN3_SHAPES)} or a config folder")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--sharding", choices=["ddp", "fsdp", "zero3"], default="fsdp")
    parser.add_argument("--lora-rank", type=int, default=0, help="0 = full fine-tuning")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--max-prompt-tokens", type=int, default=4096)
    parser.add_argument("--max-response-tokens", type=int, default=512)
    parser.add_argument("--no-gradient-checkpointing", action="store_true")
    parser.add_argument("--rollout-share", type=float, default=0.35, help="vLLM's GPU fraction (0 = hf backend)")
    parser.add_argument("--gpu-memory-gib", type=float, default=80.0)
    parser.add_argument("--table", action="store_true", help="print the README grid and exit")
    args = parser.parse_args(argv)
    if args.table:
        print(readme_table(args.gpu_memory_gib, micro_batch_size=args.micro_batch_size,
                           seq_len=args.max_prompt_tokens + args.max_response_tokens,
                           response_len=args.max_response_tokens, rollout_share=args.rollout_share))
        return 0
    if args.gpus < 1 or args.micro_batch_size < 1 or not 0 <= args.rollout_share < 1:
        parser.error("--gpus and --micro-batch-size must be >= 1, --rollout-share in [0, 1)")
    shape = named_shape(args.model)
    plan = plan_memory(shape, gpus=args.gpus, sharding=args.sharding, lora_rank=args.lora_rank,
                       micro_batch_size=args.micro_batch_size,
                       seq_len=args.max_prompt_tokens + args.max_response_tokens,
                       response_len=args.max_response_tokens,
                       gradient_checkpointing=not args.no_gradient_checkpointing,
                       rollout_share=args.rollout_share, gpu_memory_gib=args.gpu_memory_gib)
    print(f"{args.model}: {shape.params / 1e9:.2f} B parameters, {args.gpus} GPU(s), {args.sharding}, "
          f"{'LoRA r=' + str(args.lora_rank) if args.lora_rank else 'full fine-tuning'}, micro-batch "
          f"{args.micro_batch_size} x {args.max_prompt_tokens + args.max_response_tokens} tokens")
    return report(shape, plan, args.rollout_share * args.gpu_memory_gib)


def report(shape: Shape, plan: MemoryPlan, share_gib: float) -> int:
    """Print the plan, the engine note and what to change when it does not fit; -> exit code (0 = fits)."""
    print(plan.format())
    note = rollout_engine_note(shape, share_gib)
    if note:
        print("note:", note)
    if not plan.fits:
        over = math.ceil((plan.total - plan.capacity) / GIB)
        print(f"short by {over} GiB: try --lora-rank 64, more GPUs with fsdp, a smaller --micro-batch-size, "
              "or gradient checkpointing")
    return 0 if plan.fits else 1


def launch_layout() -> tuple[int, Sharding]:
    """(processes, sharding) of the ``accelerate launch`` this process belongs to, from the variables the launcher
    sets (1 process, 'ddp' outside a launch), so a dry run needs no process group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        return world, "fsdp"
    if (os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
            and os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3"):
        return world, "zero3"
    return world, "ddp"


#: Environment variables that ``accelerate launch`` (every launcher kind) and ``torchrun`` set in their processes.
LAUNCHER_VARIABLES = ("ACCELERATE_MIXED_PRECISION", "TORCHELASTIC_RUN_ID")


def dry_run_exit_code(code: int) -> int:
    """The exit status of ``--dry-run`` for ``print_run_plan``'s verdict ``code`` (1 = does not fit).

    Under a launcher (``accelerate launch``, ``torchrun``) a child's status 1 becomes the launcher's own
    traceback (``CalledProcessError``) printed after the plan, which reads as a crash; there the plan's last line
    says plainly that it does not fit and the status is 0. Run without a launcher, the status stays 1 for scripts
    that check it."""
    if not code or not any(name in os.environ for name in LAUNCHER_VARIABLES):
        return code
    if os.environ.get("RANK", "0") == "0":
        print("does not fit (see above); exit status 0 under a launcher, which would print its own traceback for "
              "1: python <script> --dry-run exits 1 when the plan does not fit", flush=True)
    return 0


def print_run_plan(model_path: str, *, micro_batch_size: int, lora_rank: int, max_prompt_tokens: int,
                   max_response_tokens: int, gradient_checkpointing: bool, rollout_backend: str,
                   vllm_share: float, mixed_precision: str = "bf16") -> int:
    """A training script's ``--dry-run``: the plan of this run on this launch (processes and sharding from the
    launcher, capacity of GPU 0, or 80 GiB without one); printed by the main process; -> exit code (0 = fits).
    ``rollout_backend`` 'auto' counts vLLM's share, as on the GPU node it is meant for.

    The transformers backend under sharding generates through an unsharded bf16 copy, counted instead of the
    vLLM share."""
    import torch

    world, sharding = launch_layout()
    on_gpu = torch.cuda.is_available()
    capacity = torch.cuda.get_device_properties(0).total_memory / GIB if on_gpu else 80.0
    name = model_path.removeprefix("Qwen/")
    if name not in QWEN3_SHAPES:  # a folder, 'tiny', a cached hub id: its config.json (a bad path: one line)
        name = resolve_policy_path(model_path)
    shape = named_shape(name)
    low = mixed_precision in ("bf16", "fp16")
    vllm = rollout_backend == "vllm" or (rollout_backend == "auto" and not on_gpu)  # auto: vLLM on the GPU node
    if rollout_backend == "auto" and on_gpu:
        from arena_train.backends import rollout_backend_name

        vllm = rollout_backend_name("auto") == "vllm"
    rollout_backend = "vllm" if vllm else "hf"
    share = vllm_share if vllm else 0.0
    plan = plan_memory(shape, gpus=world, sharding=sharding, lora_rank=lora_rank, micro_batch_size=micro_batch_size,
                       seq_len=max_prompt_tokens + max_response_tokens, response_len=max_response_tokens,
                       gradient_checkpointing=gradient_checkpointing, act_bytes=2 if low else 4,
                       frozen_bytes=2 if low else 4, rollout_share=share, gpu_memory_gib=capacity)
    if not vllm and sharding != "ddp" and world > 1:
        copy = (2 if low else 4) * shape.params
        plan = MemoryPlan({**plan.components, "unsharded rollout copy (transformers)": copy}, plan.capacity)
    if os.environ.get("RANK", "0") != "0":
        return 0 if plan.fits else 1
    print(f"dry run: {model_path} ({shape.params / 1e9:.2f} B parameters), {world} process(es), {sharding}, "
          f"{'LoRA r=' + str(lora_rank) if lora_rank else 'full fine-tuning'}, micro-batch {micro_batch_size} x "
          f"{max_prompt_tokens + max_response_tokens} tokens, {rollout_backend} rollouts, "
          f"{capacity:.1f} GiB per {'GPU' if on_gpu else 'GPU (assumed: no GPU here)'}")
    return report(shape, plan, share * capacity)


if __name__ == "__main__":
    raise SystemExit(main())
