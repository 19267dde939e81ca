"""Training with sharded weights (FSDP2, DeepSpeed ZeRO-3), and the pieces that keep unsharded runs the same.

A sharded module all-gathers its parameters at every forward pass, a collective every process must join. Three
places of the training loop would otherwise call forward a different number of times per process, and hang:

- generation (ranks stop at different token counts): ``GatheredHFBackend`` generates through an unsharded copy
  on every process, refreshed from the shards after each update, like a vLLM engine;
- scoring and the update (ranks hold different numbers of rows): ``lockstep_passes`` gives every process the
  largest count of forward passes, the extra ones run on real rows with zero weight;
- the weight push and the final save: every process walks the parameters in the same order
  (``full_parameters``), one parameter gathered at a time, so no process ever holds a second full copy.

The reference model is sharded like the policy (``prepare_reference``), or under LoRA is the policy itself with
its adapters disabled (``AdapterDisabled``). ``algos/configs/`` holds the Accelerate files (``docs/scale.md``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from pathlib import Path
from typing import Literal

import torch

from arena_train.weights import full_parameters

Sharding = Literal["none", "fsdp2", "zero3"]
#: What a run under a sharding engine that this module does not support is told to use instead.
CONFIGS_HINT = "use algos/configs/fsdp2.yaml (FSDP2) or algos/configs/zero3.yaml (DeepSpeed ZeRO-3)"


class TiedOutputNote(logging.Filter):
    """Drops Accelerate's "Removed shared tensor {'lm_head.weight'} while saving. This should be OK, but check ..."
    printed at every checkpoint of a model whose output layer is its input embedding (``tie_word_embeddings``:
    Qwen3 0.6B-4B, the tiny models). The checkpoint stores that tensor once and loading ties it again, which a
    resumed run's bit-for-bit equality with the straight run proves (tests/test_resume_recipe.py); a shared tensor
    under any other name is still reported."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()  # Accelerate may prefix it with "[RANK 0] "
        if "Removed shared tensor" not in message:
            return True
        names = re.findall(r"'([^']+)'", message.split("Removed shared tensor", 1)[1].split(" while saving", 1)[0])
        return not names or not all(n == "lm_head.weight" or n.endswith(".lm_head.weight") for n in names)


def make_accelerator(mixed_precision: str):
    """``Accelerator`` for the scripts. On GPUs the launcher's config decides. On a machine without GPUs a
    launch that asks for FSDP (``algos/configs/fsdp2.yaml``) or DeepSpeed (``zero3.yaml``) gets it over gloo;
    the tied output layer's save message is silenced (``TiedOutputNote``).

    Why: Accelerate turns FSDP and DeepSpeed on for accelerator devices only and on CPU silently runs DDP
    instead; torch's FSDP2 and DeepSpeed's CPU accelerator run on CPU, so this is how the test suite checks
    sharded runs through the same Accelerate code paths a GPU node uses. DeepSpeed's micro-batch size is set to
    one row-batch per ``backward`` (the scripts micro-batch themselves and mark the last one, ``micro_batch_sync``).
    """
    from accelerate import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin, PartialState
    from accelerate.utils import DistributedDataParallelKwargs, DistributedType

    saving = logging.getLogger("accelerate.utils.other")  # where Accelerate's save_model reports shared tensors
    if not any(isinstance(f, TiedOutputNote) for f in saving.filters):
        saving.addFilter(TiedOutputNote())
    # DDP without a buffer broadcast at every forward: the models' buffers are constants (rotary frequencies), and
    # a forward-time collective would make every rank's forward count part of the protocol (a hang when they differ)
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision=mixed_precision,
                              kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)])
    state = accelerator.state
    if accelerator.distributed_type == DistributedType.MULTI_CPU:
        if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
            plugin = DeepSpeedPlugin()  # from the launcher's ACCELERATE_DEEPSPEED_* variables
            plugin.set_mixed_precision(mixed_precision)
            plugin.select(_from_accelerator_state=True)
            state.deepspeed_plugins, state._mixed_precision = plugin, "no"  # DeepSpeed's config has the precision
            state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.DEEPSPEED
        elif os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
            plugin = FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* variables
            if mixed_precision != "no":
                plugin.set_mixed_precision(mixed_precision)
            state.fsdp_plugin = plugin
            state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        config = state.deepspeed_plugin.deepspeed_config
        if config.get("train_micro_batch_size_per_gpu", "auto") == "auto":
            config["train_micro_batch_size_per_gpu"] = 1
    return accelerator


def sharding_of(accelerator) -> Sharding:
    """'fsdp2', 'zero3' or 'none' (one process, DDP, ZeRO-1/2: every process holds full weights).

    FSDP1 is refused: its flat parameters need another gather path, and FSDP2 is its replacement."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type == DistributedType.FSDP:
        if not accelerator.is_fsdp2:
            raise SystemExit(f"FSDP version 1 is not supported: {CONFIGS_HINT}")
        return "fsdp2"
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        return "zero3" if accelerator.state.deepspeed_plugin.zero_stage == 3 else "none"
    return "none"


def require_supported(accelerator, lora_rank: int) -> Sharding:
    """The run's sharding, after refusing combinations that would fail later: LoRA keeps a frozen bf16 base
    next to fp32 adapters, which one FSDP2/ZeRO-3 unit cannot flatten into a single dtype."""
    sharding = sharding_of(accelerator)
    if lora_rank > 0 and sharding != "none":
        raise SystemExit(f"--lora-rank runs on one GPU or under DDP (algos/configs/ddp.yaml), not under {sharding}: "
                         "LoRA already makes the trainable state small; shard full fine-tuning instead")
    return sharding


def is_sharded(model) -> bool:
    """Whether ``model``'s parameters are shards (FSDP2 DTensors or DeepSpeed ZeRO-3 partitions)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) or hasattr(p, "ds_id") for p in model.parameters())


def lockstep_passes(count: int, sharded: bool) -> int:
    """The largest ``count`` over all processes when the models are sharded (else ``count``): every process must
    run as many sharded forward passes as the busiest one."""
    import torch.distributed as dist

    if not sharded or not dist.is_initialized() or dist.get_world_size() == 1:
        return count
    t = torch.tensor([count], dtype=torch.long)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


@contextlib.contextmanager
def micro_batch_sync(accelerator, models, last: bool):
    """One micro-batch of a mini-batch: the last one synchronises gradients (DDP's all-reduce, FSDP2's
    reduce-scatter) of every trained model in ``models`` (one or a list: PPO's critic too), the others accumulate
    locally. Accelerate's DeepSpeed engine steps the optimizer inside ``backward`` (clipping with the config's
    ``gradient_clipping``) unless told that the accumulation goes on, so there only the last micro-batch ends it."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        accelerator.gradient_state._set_sync_gradients(last)
        try:
            yield
        finally:
            accelerator.gradient_state._set_sync_gradients(True)
    elif last:
        yield
    else:
        with contextlib.ExitStack() as stack:
            for model in models if isinstance(models, (list, tuple)) else [models]:
                stack.enter_context(accelerator.no_sync(model))
            yield


def prepare_reference(accelerator, ref_model, policy):
    """The reference model placed like the policy: FSDP2 shards each decoder layer and the root (no optimizer,
    no gradients); ZeRO-3 wraps it in an inference engine with the run's DeepSpeed config; otherwise it moves
    to the device. ``ref_model=None`` (LoRA) gives the policy with its adapters disabled."""
    if ref_model is None:
        return AdapterDisabled(accelerator.unwrap_model(policy))
    ref_model.requires_grad_(False).eval()
    sharding = sharding_of(accelerator)
    if sharding == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        ref_model.to(accelerator.device)
        for layer in _decoder_layers(ref_model):
            fully_shard(layer)
        fully_shard(ref_model)
        return ref_model
    if sharding == "zero3":
        import deepspeed

        config = {k: v for k, v in accelerator.state.deepspeed_plugin.deepspeed_config.items()
                  if k in ("zero_optimization", "bf16", "fp16", "train_micro_batch_size_per_gpu")}
        config["zero_optimization"] = {"stage": 3, "stage3_param_persistence_threshold": 0}
        config.setdefault("train_micro_batch_size_per_gpu", 1)
        engine, *_ = deepspeed.initialize(model=ref_model, config=config)
        engine.eval()  # DeepSpeedEngine.eval returns None
        return engine
    return ref_model.to(accelerator.device)


def _decoder_layers(model) -> list[torch.nn.Module]:
    """The repeated blocks named by transformers' ``_no_split_modules`` (Qwen3DecoderLayer, ...)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


class AdapterDisabled(torch.nn.Module):
    """The LoRA policy with its adapters switched off for the call: the frozen base, i.e. the reference model,
    at no memory cost."""

    def __init__(self, peft_model):
        super().__init__()
        self.peft_model = peft_model

    def forward(self, **kwargs):
        with self.peft_model.disable_adapter():
            return self.peft_model(**kwargs)


class GatheredHFBackend:
    """transformers ``generate`` on an unsharded copy of the policy in ``dtype``, one per process; ``push``
    refreshes the copy from the (possibly sharded) policy, one parameter at a time. Costs one model per process,
    like a rollout engine, and no collective during generation. ``score_rollouts``: the copy's log-probs may stand
    in for the trainer's scoring pass (a float32 copy of a float32 policy without autocast: the same weights, as
    ``HFBackend``); a bfloat16 copy of a float32 policy is a bf16 rollout engine, whose log-probs never do."""

    def __init__(self, policy, tokenizer, dtype: torch.dtype, device, init_context=contextlib.nullcontext,
                 score_rollouts: bool = False, **hf_kwargs):
        from transformers import AutoModelForCausalLM

        from arena_train.backends import HFBackend

        config = getattr(policy, "module", policy).config
        cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=cuda), init_context():  # the init must not shift the sampling seeds
            copy = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval().requires_grad_(False)
        self.copy, self._params = copy, dict(copy.named_parameters(remove_duplicate=False))
        self.score_rollouts = score_rollouts
        self.hf = HFBackend(copy, tokenizer, **hf_kwargs)
        self.push(policy)

    def generate(self, *args, **kwargs) -> list[list[int]]:
        return self.hf.generate(*args, **kwargs)

    def generate_scored(self, *args, **kwargs) -> tuple[list[list[int]], list[list[float]], list[list[float]]]:
        return self.hf.generate_scored(*args, **kwargs)

    @property
    def last_stop_reasons(self) -> list[str]:
        return self.hf.last_stop_reasons

    @torch.no_grad()
    def push(self, model) -> dict[str, float]:
        start = time.perf_counter()
        for name, tensor in full_parameters(model):
            self._params[name].copy_(tensor)
        return {"rollout/push_time_s": time.perf_counter() - start}

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def close(self) -> None:
        pass


def hf_backend(accelerator, policy, tokenizer, dtype: torch.dtype, mixed_precision: str = "no",
               precision: str = "trainer"):
    """The transformers rollout backend: the policy itself when every process holds full weights, else a
    ``GatheredHFBackend`` (a sharded policy would hang in ``generate``); in float32 without autocast either one's
    log-probs stand in for the policy's scoring pass. ``precision`` 'bf16': always a ``GatheredHFBackend`` in
    bfloat16, a rollout engine whose precision differs from a float32 trainer's."""
    from arena_train.backends import HFBackend

    sharding = sharding_of(accelerator)
    if precision not in ("trainer", "bf16"):
        raise ValueError(f"rollout precision must be 'trainer' or 'bf16', got {precision!r}")
    exact = precision == "trainer" and dtype == torch.float32 and mixed_precision == "no"  # may stand in
    if precision == "bf16":
        dtype = torch.bfloat16
    elif sharding == "none":
        return HFBackend(accelerator.unwrap_model(policy), tokenizer, score_rollouts=exact)
    init_context = contextlib.nullcontext
    if sharding == "zero3":  # transformers builds every model partitioned while the ZeRO-3 config is set
        plugin = accelerator.state.deepspeed_plugin

        @contextlib.contextmanager
        def init_context():
            from transformers.integrations import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()
            try:
                yield
            finally:
                plugin.set_deepspeed_weakref()
    return GatheredHFBackend(accelerator.unwrap_model(policy), tokenizer, dtype, accelerator.device, init_context,
                             score_rollouts=exact)


def save_final_model(accelerator, policy, tokenizer, folder: Path) -> Path:
    """A normal HF folder (weights, config, tokenizer) that ``from_pretrained`` loads without this project.

    Call it on every process: sharded weights are gathered with collectives; only the main process writes.
    A LoRA policy is saved merged (base + adapters), so the folder needs no peft."""
    unwrapped = accelerator.unwrap_model(policy)
    if hasattr(unwrapped, "merge_and_unload"):  # LoRA runs are unsharded; merging ends the policy's training
        if accelerator.is_main_process:
            unwrapped.merge_and_unload().save_pretrained(folder)
    elif sharding_of(accelerator) == "fsdp2":  # gathered one parameter at a time, kept by the main process only
        saved = {name for name, _ in unwrapped.named_parameters()}  # one name per tied tensor, as save_pretrained
        state = {name: t.cpu().clone() for name, t in full_parameters(unwrapped)
                 if accelerator.is_main_process and name in saved}
        if accelerator.is_main_process:
            unwrapped.save_pretrained(folder, state_dict=state)
    else:
        state = accelerator.get_state_dict(policy)
        if accelerator.is_main_process:
            unwrapped.save_pretrained(folder, state_dict=state)
    if accelerator.is_main_process:
        tokenizer.save_pretrained(folder)
    accelerator.wait_for_everyone()
    return folder


def make_rollout_backend(name: str, accelerator, policy, tokenizer, model_path: str, dtype: torch.dtype, *, seed: int,
                         max_model_len: int, max_num_seqs: int, mixed_precision: str, gpu_memory_utilization: float,
                         precision: str = "trainer"):
    """The rollout engine ``name`` ('auto', 'hf', 'vllm'): an in-process vLLM engine per process (weights pushed
    after each update), or transformers ``generate`` (``hf_backend``: through an unsharded copy when sharded).
    ``precision`` 'bf16' runs the engine in bfloat16 ('trainer': in the trainer's own precision)."""
    from arena_train.backends import VLLMBackend, rollout_backend_name

    if rollout_backend_name(name) == "vllm":
        return VLLMBackend(model_path, tokenizer, seed=seed, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                           mixed_precision=mixed_precision, gpu_memory_utilization=gpu_memory_utilization,
                           external_launcher=accelerator.num_processes > 1, precision=precision)
    return hf_backend(accelerator, policy, tokenizer, dtype, mixed_precision, precision)
