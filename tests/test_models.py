"""arena_models: the offline tiny recipe and the SmolLM2 conversion."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from arena_models import build_tiny_model, resolve_model_path, train_tokenizer
from tests.real_templates import require_smollm2


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), corpus=["Push every box (X) onto a target (O)."])


def test_tokenizer_round_trips_any_text_and_keeps_tags():
    tok = train_tokenizer(["hello world"], vocab_size=300)
    for text in ["<think>ok</think><action>up</action>", "ünïcode √ 🙂 \t\n", ""]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    ids = tok.encode("<think></think><action>left</action>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "<think></think><action>left</action>"
    assert len(tok.encode("<action>", add_special_tokens=False)) == 1


def test_tiny_model_is_a_normal_hf_folder_with_chat_template(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.config.model_type == "qwen3" and model.config.tie_word_embeddings
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id != tok.eos_token_id
    ids = torch.tensor([tok.encode(text)])
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] <= ids.shape[1] + 4


def test_tiny_build_is_deterministic(tmp_path):
    a = build_tiny_model(tmp_path / "a", seed=3)
    b = build_tiny_model(tmp_path / "b", seed=3)
    ma, mb = AutoModelForCausalLM.from_pretrained(a), AutoModelForCausalLM.from_pretrained(b)
    for (na, pa), (_, pb) in zip(ma.named_parameters(), mb.named_parameters()):
        assert torch.equal(pa, pb), na


def test_resolve_model_path(tmp_path, monkeypatch):
    monkeypatch.setenv("ARENA_CACHE", str(tmp_path))
    path = resolve_model_path("tiny")
    assert (tmp_path / "tiny-xs" / "config.json").exists() and path == str(tmp_path / "tiny-xs")
    assert resolve_model_path("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"
    with pytest.raises(ValueError):
        resolve_model_path("tiny-huge")


def test_smollm2_conversion():
    require_smollm2()
    path = resolve_model_path("smollm2")  # the shared cache: the conversion takes about a minute once
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1]:])
