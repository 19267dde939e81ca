"""arena_train.sharding: full parameters (plain, LoRA-merged, FSDP2-gathered), the LoRA reference, and two FSDP2
processes that generate different numbers of tokens and score different numbers of rows without hanging."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import ACCELERATE, free_port, needs_accelerate

from arena_train.models import load_policy_and_reference
from arena_train.sharding import AdapterDisabled, full_parameters, is_sharded, lockstep_passes

CONFIGS = Path(__file__).resolve().parents[1] / "algos" / "configs"


def test_full_parameters_of_a_plain_model_are_its_state_dict_tied_head_included(tiny_model):
    policy, reference, _ = load_policy_and_reference(tiny_model, torch.float32)
    state = policy.state_dict()
    gathered = dict(full_parameters(policy))
    assert "lm_head.weight" in gathered and sorted(gathered) == sorted(state)
    assert all(torch.equal(gathered[k], state[k]) for k in state)
    assert not is_sharded(policy) and not reference.training and not any(p.requires_grad
                                                                           for p in reference.parameters())
    assert lockstep_passes(3, sharded=True) == 3  # one process: nothing to agree on


@pytest.fixture()
def lora_policy(tiny_model):
    policy, reference, tokenizer = load_policy_and_reference(tiny_model, torch.float32, lora_rank=4,
                                                             gradient_checkpointing=True)
    assert reference is None
    torch.manual_seed(0)
    for name, p in policy.named_parameters():
        if "lora_B" in name:  # peft starts B at 0 (no change); a trained adapter is not
            torch.nn.init.normal_(p, std=0.05)
    return policy, tokenizer


def test_lora_parameters_are_merged_under_the_base_names(lora_policy):
    policy, _ = lora_policy
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert all(p.dtype == torch.float32 for n, p in policy.named_parameters() if p.requires_grad)
    gathered = dict(full_parameters(policy))
    merged = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert sorted(gathered) == sorted(merged)
    assert max((gathered[k] - merged[k]).abs().max().item() for k in merged) < 1e-6
    assert (gathered["model.layers.0.self_attn.q_proj.weight"]
            - policy.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight).abs().max() > 1e-3


def test_the_lora_reference_is_the_base_model(lora_policy, tiny_model):
    policy, _ = lora_policy
    base, _, _ = load_policy_and_reference(tiny_model, torch.float32)
    ids = torch.tensor([[1, 5, 7, 9, 11]])
    with torch.no_grad():
        ref_logits = AdapterDisabled(policy)(input_ids=ids).logits
        assert torch.allclose(ref_logits, base(input_ids=ids).logits, atol=1e-6)
        assert not torch.allclose(policy(input_ids=ids).logits, ref_logits, atol=1e-3)  # adapters back on


WORKER = textwrap.dedent("""
    import json, sys
    import torch
    from arena_train.backends import HFBackend
    from arena_train.batching import make_batch, score_rows, sequence_logprobs
    from arena_train.models import load_model_and_tokenizer, load_policy_and_reference
    from arena_train.rollout import Row
    from arena_train.sharding import (full_parameters, hf_backend, is_sharded, make_accelerator, prepare_reference,
                                      sharding_of)

    acc = make_accelerator("no")
    rank, path = acc.process_index, sys.argv[1]
    policy, reference, tokenizer = load_policy_and_reference(path, torch.float32)
    expected = {k: v.clone() for k, v in policy.state_dict().items()}
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    policy, optimizer = acc.prepare(policy, optimizer)
    reference = prepare_reference(acc, reference, policy)
    out = {"sharding": sharding_of(acc), "sharded": [is_sharded(policy), is_sharded(reference)]}
    gathered = dict(full_parameters(policy))
    out["same_names"] = sorted(gathered) == sorted(expected)
    out["gather_error"] = max((gathered[k] - expected[k]).abs().max().item() for k in expected)

    # ranks generate different numbers of tokens: a sharded module would wait in an all-gather forever
    backend = hf_backend(acc, policy, tokenizer, torch.float32)
    prompts = [[1, 5, 7], [1, 9]]
    mine = backend.generate(prompts, 2 + 6 * rank, 1.0, 1.0, greedy=True)
    plain, _ = load_model_and_tokenizer(path, torch.float32)
    out["generate_matches_unsharded"] = mine == HFBackend(plain, tokenizer).generate(prompts, 2 + 6 * rank, 1.0,
                                                                                     1.0, greedy=True)

    # ranks score different numbers of rows, one per pass
    rows = [Row(group=0, episode=i, turn=0, prompt_ids=[1, 5, 7 + i], response_ids=[9, 11], step_reward=0.0,
                format_penalty=0.0, format_ok=True, action_is_valid=True, anchor=None, won=False)
            for i in range(1 + 3 * rank)]
    score_rows(policy, reference, rows, micro_batch_size=1, temperature=1.0, pad_id=0, device=acc.device,
               stats={"time_score": 0.0})
    out["scored"] = all(r.old_logp is not None for r in rows)
    out["ref_gap_before_update"] = max(float(abs(r.old_logp - r.ref_logp).max()) for r in rows)

    # one update, then the push: the unsharded copy follows the shards
    batch = make_batch(rows[:1], 0, acc.device)
    logp, _ = sequence_logprobs(policy, batch, 1.0)
    acc.backward(-logp.mean())
    optimizer.step()
    out["push"] = sorted(backend.push(policy))
    after = dict(full_parameters(policy))
    copy = dict(backend.copy.named_parameters(remove_duplicate=False))
    out["copy_error"] = max((copy[k] - after[k]).abs().max().item() for k in after)
    out["moved"] = max((after[k] - expected[k]).abs().max().item() for k in expected)
    if acc.is_main_process:
        open(sys.argv[2], "w").write(json.dumps(out))
    acc.wait_for_everyone()
    acc.end_training()
""")


@pytest.mark.slow
@needs_accelerate
def test_fsdp2_processes_gather_generate_and_score_in_lockstep(tmp_path, tiny_model):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cmd = [str(ACCELERATE), "launch", "--config_file", str(CONFIGS / "fsdp2.yaml"), "--num_processes", "2",
           "--mixed_precision", "no", "--main_process_port", str(free_port()), str(script), tiny_model,
           str(tmp_path / "out.json")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["sharding"] == "fsdp2" and out["sharded"] == [True, True]
    assert out["same_names"] and out["gather_error"] == 0.0
    assert out["generate_matches_unsharded"] and out["scored"]
    assert out["ref_gap_before_update"] < 1e-5  # the sharded reference is the starting policy
    assert out["push"] == ["rollout/push_time_s"] and out["copy_error"] == 0.0 and out["moved"] > 1e-4


def test_micro_batch_sync_keeps_every_trained_model_local_until_the_last_micro_batch():
    """PPO's critic is trained beside the policy: its gradients must not be all-reduced on every micro-batch."""
    import contextlib
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from arena_train.sharding import micro_batch_sync

    entered = []

    @contextlib.contextmanager
    def no_sync(model):
        entered.append(model)
        yield

    accelerator = SimpleNamespace(distributed_type=DistributedType.MULTI_CPU, no_sync=no_sync)
    policy, critic = object(), object()
    with micro_batch_sync(accelerator, [policy, critic], last=False):
        pass
    assert entered == [policy, critic]
    entered.clear()
    with micro_batch_sync(accelerator, [policy, critic], last=True):  # the last one synchronises both
        pass
    assert entered == []
    from arena_train.update import MicroBatch  # what the scripts call: every trained model, one pass each

    for last, expected in ((False, [policy, critic]), (True, [])):
        entered.clear()
        with MicroBatch([], [], {}, last=last, weight=0.0, accelerator=accelerator).sync([policy, critic]):
            pass
        assert entered == expected
    for name in ("grpo", "ppo"):  # the scripts hand every trained model to it
        script = Path(__file__).resolve().parents[1] / "algos" / f"{name}.py"
        assert "micro.sync([policy, *extra_models])" in script.read_text()
    assert "extra_models = [critic]" in (Path(__file__).resolve().parents[1] / "algos" / "ppo.py").read_text()
