"""A tiny Qwen3-architecture chat model built offline, for tests and CPU demos.

Why: CI and laptops have no hub access, and a 0.2 M-parameter model trains and generates
fast enough on one CPU thread to run the full RL loop in seconds. The tokenizer is a
byte-level BPE (any string round-trips) trained on a small corpus, with ChatML special
tokens and a chat template, so the same prompt/response code path serves real chat models.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast, Qwen3Config

IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
#: Response-format tags get one token each (not special: decoding must keep them).
TAG_TOKENS = ["<think>", "</think>", "<action>", "</action>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: Model sizes (hidden, layers, FFN, heads). head_dim is 32: vLLM's CPU attention rejects 16.
SIZES: dict[str, tuple[int, int, int, int]] = {
    "xs": (64, 2, 256, 2),
    "s": (128, 4, 512, 4),
    "m": (512, 5, 1536, 8),
}

_BASE_CORPUS = [
    "<think>The box must reach the target.</think><action>up</action>",
    "<think></think><action>down</action>", "<think></think><action>left</action>",
    "<think></think><action>right</action>",
    "You are an expert agent. Your task is to solve the puzzle. Reason step by step inside "
    "<think> </think> tags, then give exactly one admissible action inside <action> </action> tags.",
    "Symbols: # wall, _ floor, O target, X box, P player, √ box on target, S player on target.",
    "Current observation:\n# # # # # #\n# _ _ O _ #\n# _ X _ _ #\n# P _ _ _ #\n# # # # # #",
    "Admissible actions: [up, down, left, right]. You have already taken 3 step(s).",
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } ' \" , . : ;",
    "Find the answer and put it in \\boxed{}. Search for a product, click on an item, buy now.",
]


def train_tokenizer(corpus: Iterable[str] = (), vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Byte-level BPE with ChatML special tokens and a chat template, trained in about a second."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = list(_BASE_CORPUS) + [t for t in corpus if t]
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=PAD, chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def tiny_config(tokenizer: PreTrainedTokenizerFast, size: str = "xs") -> Qwen3Config:
    """A Qwen3 config sized by ``size`` (see ``SIZES``), tied embeddings, ids from ``tokenizer``."""
    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of {sorted(SIZES)}")
    hidden, layers, ffn, heads = SIZES[size]
    return Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, head_dim=32, max_position_embeddings=4096,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )


def build_tiny_model(out_dir: str | Path, corpus: Iterable[str] = (), size: str = "xs",
                     vocab_size: int = 1024, seed: int = 0) -> Path:
    """Train a tokenizer on ``corpus`` (plus a small built-in text), initialise a random Qwen3
    model of ``size`` from ``seed`` and save both as a normal Hugging Face folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus, vocab_size)
    config = tiny_config(tokenizer, size)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
