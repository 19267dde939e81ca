"""Model and tokenizer loading, and where the behaviour-cloned starting point lives."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

#: Where ``algos/sft.py`` saves its best checkpoint by default, and where the RL scripts' CPU profile starts.
BC_CHECKPOINT = "checkpoints/sft-sokoban-tiny"
#: What a Hugging Face hub id looks like ("org/name"); anything else that does not exist is a missing folder.
_HUB_ID = re.compile(r"^[\w][\w.-]*/[\w][\w.-]*$")
_HELP = "pass a model folder (with config.json), a cached hub id, 'tiny' or 'smollm2'"
#: Seconds the reachability check of an uncached hub id may take (``hub_problem``).
HUB_PROBE_TIMEOUT = 5.0
#: Linear layers LoRA adapts by default (every projection of attention and MLP).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def load_model_and_tokenizer(path: str, dtype: torch.dtype):
    """(causal LM in ``dtype``, tokenizer) from a local folder or hub id; a tokenizer without a pad token pads
    with its end token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model, tokenizer


def model_path_problem(model_path: str) -> str | None:
    """Why ``model_path`` cannot be loaded here (one line that says what to pass instead), or None: a folder
    must hold ``config.json``; a hub id must be cached when the hub is offline (``HF_HUB_OFFLINE=1``)."""
    if model_path in ("tiny", "smollm2") or model_path.startswith("tiny-"):
        return None
    path = Path(model_path).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return None
        return f"error: --model-path {model_path} has no config.json; {_HELP}"
    if path.exists():
        return f"error: --model-path {model_path} is a file, not a model folder; {_HELP}"
    if not _HUB_ID.match(model_path):
        return f"error: --model-path {model_path}: no such folder; {_HELP}"
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(model_path, "config.json"), str):
        return None
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return (f"error: --model-path {model_path} is neither a local folder nor in the Hugging Face cache, and "
                f"the hub is offline (HF_HUB_OFFLINE); {_HELP}")
    return hub_problem(model_path)


def hub_problem(model_path: str, timeout: float = HUB_PROBE_TIMEOUT) -> str | None:
    """Why the uncached hub id ``model_path`` cannot be downloaded (one line), or None. One request for its
    ``config.json`` with a short timeout and no retries: without it an unreachable hub costs about 50 s of
    retries and an 81-line traceback after the run folder was made."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        get_hf_file_metadata(hf_hub_url(model_path, "config.json"), timeout=timeout)
    except GatedRepoError:
        return (f"error: --model-path {model_path} is gated on the Hugging Face hub: accept its terms on the hub and "
                f"log in (hf auth login), or {_HELP}")
    except RepositoryNotFoundError:
        return (f"error: --model-path {model_path}: no such model on the Hugging Face hub (or it is private: log in "
                f"with hf auth login); {_HELP}")
    except EntryNotFoundError:
        return f"error: --model-path {model_path} has no config.json on the Hugging Face hub; {_HELP}"
    except HfHubHTTPError as err:
        return f"error: --model-path {model_path}: the Hugging Face hub answered {err}; {_HELP}"
    except Exception as err:  # noqa: BLE001 - no connection, DNS, timeout, proxy: the transport's own classes
        return (f"error: --model-path {model_path} is not in the Hugging Face cache and the hub cannot be reached "
                f"({type(err).__name__}); download it where the hub is reachable and set HF_HUB_OFFLINE=1 to use "
                f"the cached copy, or {_HELP}")
    return None


def load_policy_and_reference(path: str, dtype: torch.dtype, *, lora_rank: int = 0,
                              gradient_checkpointing: bool = False):
    """(policy, frozen reference or None, tokenizer) of a training run.

    Full fine-tuning: a float32 policy (the optimizer's master weights; bf16 autocast or FSDP2's mixed-precision
    policy computes in ``dtype``) and a reference in ``dtype``. LoRA (``lora_rank`` > 0, peft): a frozen base in
    ``dtype`` with float32 adapters of rank r and alpha 2r on every attention/MLP projection; the reference is
    None, i.e. the same base with the adapters disabled (``arena_train.sharding.AdapterDisabled``), so a 4-8B
    model trains on one GPU. Gradient checkpointing is the non-reentrant kind, which also works with a frozen
    base (no input needs ``requires_grad``).
    """
    if lora_rank < 0:
        raise SystemExit(f"--lora-rank must be >= 0, got {lora_rank}")
    policy, tokenizer = load_model_and_tokenizer(path, dtype if lora_rank else torch.float32)
    if gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not lora_rank:
        reference, _ = load_model_and_tokenizer(path, dtype)
        return policy, reference.requires_grad_(False).eval(), tokenizer
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0, target_modules=list(LORA_TARGETS),
                        task_type="CAUSAL_LM")
    policy = get_peft_model(policy, config, autocast_adapter_dtype=True)  # adapters in float32
    for p in policy.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    return policy, None, tokenizer


def resolve_policy_path(model_path: str) -> str:
    """Resolve 'tiny'/'smollm2' (``arena_models``); a path that cannot load is one ``SystemExit`` line, and a
    missing default BC checkpoint says how to create it."""
    from arena_models import resolve_model_path

    if model_path == BC_CHECKPOINT and not Path(model_path).exists():
        raise SystemExit(f"No behaviour-cloned model at '{model_path}'. Create it first with\n"
                         f"    python algos/sft.py\n(or pass --model-path tiny for an untrained tiny model).")
    problem = model_path_problem(model_path)
    if problem is not None:
        raise SystemExit(problem)
    return resolve_model_path(model_path)
