"""Full weights of a model whose parameters may be shards (FSDP2, DeepSpeed ZeRO-3) or carry LoRA adapters, one
parameter at a time: what a rollout engine loads after an update (``arena_train.backends``) and what the final save
writes (``arena_train.sharding``). Below both, so neither imports the other for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def _gathered(params: list[torch.nn.Parameter]):
    """DeepSpeed ZeRO-3 partitions gathered in full for the block (read-only), or nothing to do."""
    if params and hasattr(params[0], "ds_id"):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            yield
    else:
        yield



def full_parameters(model) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for every parameter of ``model`` under its checkpoint name, tied names included.

    FSDP2: one ``full_tensor()`` all-gather per parameter; ZeRO-3: one gather per module's own parameters;
    unsharded: the parameters themselves. Every process must consume the whole iterator in order (each step is
    a collective). A PEFT LoRA model yields its merged weights (base + scale * B @ A) under the base names, so a
    rollout engine that knows only the base architecture can load them.
    """
    from torch.distributed.tensor import DTensor

    inner = getattr(model, "module", model)  # DeepSpeed engine / DDP wrapper
    lora_layers = {}
    if hasattr(inner, "get_base_model") and hasattr(inner, "peft_config"):
        inner = inner.get_base_model()
        lora_layers = {name: m for name, m in inner.named_modules() if hasattr(m, "get_delta_weight")}
    for module_name, module in inner.named_modules(remove_duplicate=False):
        own = list(module.named_parameters(recurse=False, remove_duplicate=False))
        if not own or ".lora_" in f".{module_name}":
            continue
        with _gathered([p for _, p in own]):
            for short, p in own:
                tensor = p.full_tensor() if isinstance(p, DTensor) else p
                name = f"{module_name}.{short}" if module_name else short
                if name.endswith(".base_layer.weight"):
                    owner = name[: -len(".base_layer.weight")]
                    layer = lora_layers[owner]
                    tensor = tensor + sum(layer.get_delta_weight(a) for a in layer.active_adapters
                                          if a in layer.lora_A).to(tensor.dtype)
                    name = f"{owner}.weight"
                elif ".base_layer." in name:
                    name = name.replace(".base_layer.", ".")
                yield name, tensor.detach().clone() if hasattr(p, "ds_id") else tensor.detach()
