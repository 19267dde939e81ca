"""benchmarks/bench_real_model.py: its two sides do the same work (the plain transformers step and the arena_train
step move the weights alike; plain generate stops at the same end ids), and the command writes its record. Nothing
here reads a time: the figures belong to the benchmark's own run, not to a test."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import load_benchmark

BENCH = load_benchmark("bench_real_model")


@pytest.fixture(scope="module")
def setup(tiny_model):
    model, tokenizer = BENCH.load_model(tiny_model)
    prompts = BENCH.first_prompts(tokenizer, "ARL/Sokoban-Mini-v0", 3, 512)
    return model, tokenizer, prompts


def test_both_update_steps_move_the_weights_alike(setup):
    model, tokenizer, prompts = setup
    responses = BENCH.ours_generate(model, tokenizer, prompts, 4, seed=0)
    rows = BENCH.make_rows(prompts, responses, BENCH.ours_generate.logps, seed=0)
    moved = {}
    for name, step in (("ours", BENCH.ours_step), ("plain", BENCH.plain_step)):
        copy_ = copy.deepcopy(model).train()
        times: dict[str, float] = {}
        step(copy_, torch.optim.SGD(copy_.parameters(), lr=1.0), rows, tokenizer.pad_token_id, times)
        assert set(times) == {"forward", "backward", "optimizer"}
        moved[name] = {k: v - model.state_dict()[k] for k, v in copy_.state_dict().items()}
    assert any(d.abs().max() > 0 for d in moved["ours"].values())
    for key, delta in moved["ours"].items():
        torch.testing.assert_close(delta, moved["plain"][key], atol=2e-5, rtol=1e-3)


def test_plain_generate_samples_and_stops_at_the_end_ids(setup):
    from arena_train.chat import format_of

    model, tokenizer, prompts = setup
    end_ids = format_of(tokenizer).end_ids
    for response in BENCH.plain_generate(model, tokenizer, prompts, 5, seed=0):
        assert 1 <= len(response) <= 5
        assert not any(t in end_ids for t in response[:-1])


def test_the_command_writes_its_record(setup, tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out, threads = tmp_path / "record.json", torch.get_num_threads()
    BENCH.main(["--model-path", tiny_model, "--prompts", "2", "--max-new-tokens", "2", "--warmup", "0",
                "--repeats", "1", "--matmul-size", "64", "--profile-top", "2", "--out", str(out)])
    torch.set_num_threads(threads)
    record = json.loads(out.read_text())
    assert record["torch_threads"] == 1 and record["cpu"] and record["params"] > 0
    for phase in ("rollout", "update"):
        assert record[phase]["ratio_ours_over_plain_tokens_per_s"] > 0
        for side in ("ours", "plain"):
            assert len(record[phase][side]["profile_top_ops"]) == 2
    assert record["update"]["trained_tokens"] == sum(record["prompt_tokens"]) + record["update"]["response_tokens"]
    assert "ours/plain tokens/s" in capsys.readouterr().out
