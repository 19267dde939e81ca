"""arena_train.cli: CPU defaults on the field lines, ``--profile gpu`` from the script's table, flags win."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest
from conftest import load_script
from hypothesis import given
from hypothesis import strategies as st

from arena_envs import env_recipe
from arena_train.cli import (
    args_problem,
    flat_args,
    parse_args,
    range_problem,
    replace_flat,
    requested_profile,
    split_passthrough,
)
from arena_train.mixture import env_id_problem


@dataclasses.dataclass
class Args:
    profile: Literal["cpu-tiny", "gpu"] = "cpu-tiny"
    num_groups: int = 8
    learning_rate: float = 1e-4
    env_id: str = "ARL/Sokoban-Mini-v0"


GPU = dict(num_groups=16, learning_rate=1e-6)


def test_cpu_defaults_without_a_profile():
    assert parse_args(Args, GPU, []) == Args()


@pytest.mark.parametrize("argv", [["--profile", "gpu"], ["--profile=gpu"]])
def test_gpu_profile_fills_its_fields_only(argv):
    assert parse_args(Args, GPU, argv) == Args(profile="gpu", num_groups=16, learning_rate=1e-6)


@pytest.mark.parametrize("argv", [["--profile", "gpu", "--num-groups", "4"], ["--num-groups", "4", "--profile", "gpu"]])
def test_explicit_flags_win_over_the_profile(argv):
    assert parse_args(Args, GPU, argv) == Args(profile="gpu", num_groups=4, learning_rate=1e-6)


def test_unknown_profile_is_a_usage_error():
    with pytest.raises(SystemExit):
        parse_args(Args, GPU, ["--profile", "tpu"])


@given(st.lists(st.sampled_from(["--profile", "gpu", "cpu-tiny", "--x", "1", "--profile=gpu", "--profile=cpu-tiny"])))
def test_requested_profile_is_the_last_one_given(argv):
    expected = None
    for i, token in enumerate(argv):
        if token == "--profile" and i + 1 < len(argv):
            expected = argv[i + 1]
        elif token.startswith("--profile="):
            expected = token.removeprefix("--profile=")
    assert requested_profile(argv) == expected


def test_grpo_profiles():
    grpo = load_script("grpo")
    cpu = parse_args(grpo.Args, grpo.GPU_PROFILE, [])
    assert (cpu.env_id, cpu.num_groups, cpu.group_size, cpu.learning_rate, cpu.engine.rollout_backend) == (
        ["ARL/Sokoban-Mini-v0"], 8, 8, 1e-4, "hf")
    gpu = parse_args(grpo.Args, grpo.GPU_PROFILE, ["--profile", "gpu", "--loss-agg", "seq-mean-token-mean"])
    assert (gpu.env_id, gpu.num_groups, gpu.learning_rate, gpu.engine.mixed_precision, gpu.loss_agg_mode) == (
        ["ARL/Sokoban-v0"], 16, 1e-6, "bf16", "seq-mean-token-mean")
    for key, value in grpo.GPU_PROFILE.items():  # the table lists only what differs from the CPU defaults
        assert flat_args(cpu)[key] != value and flat_args(gpu)[key] == value  # grouped fields too
    # the paper's prompt layout on GPU, compact for tiny models; both evaluate with ARLArena's validation sampling
    assert (gpu.prompt_style, cpu.prompt_style) == ("arlarena", "compact")
    for args in (cpu, gpu):
        e = args.eval
        assert (e.eval_split, e.eval_greedy, e.eval_temperature, e.eval_top_p, e.eval_top_k) == (
            None, False, 0.6, 0.95, 20)


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("temperature", 0.0, "--temperature must be > 0 (got 0.0)"), ("top_p", 1.5, "--top-p must be in (0, 1]"),
    ("num_groups", 0, "--num-groups must be >= 1"), ("checkpoint_every", -1, "--checkpoint-every must be >= 0"),
    ("learning_rate", float("nan"), "--learning-rate must be > 0"), ("random_action_prob", -0.1, "in [0, 1]")])
def test_range_problem_names_the_flag(field, value, expected):
    args = dataclasses.make_dataclass("A", [(field, type(value), value)])()
    assert expected in range_problem(args)


def test_values_in_range_and_unknown_fields_pass():
    assert range_problem(Args()) is None
    assert range_problem(dataclasses.make_dataclass("A", [("clip_ratio_low", float, -5.0)])()) is None


def test_profile_flag_of_a_script_without_profiles_is_a_usage_error():
    with pytest.raises(SystemExit):
        parse_args(dataclasses.make_dataclass("A", [("seed", int, 1)]), {}, ["--profile", "gpu"])


@pytest.mark.parametrize(("argv", "own", "passed"), [
    (["--seeds", "1", "--rl-args", "--kl-coef", "0", "--cold-start-steps", "5"], ["--seeds", "1"],
     ["--kl-coef", "0", "--cold-start-steps", "5"]),
    (["--rl-args", "--kl-coef 0 --cold-start-steps 5"], [], ["--kl-coef", "0", "--cold-start-steps", "5"]),
    (["--rl-args=--kl-coef=0", "--rl-args", "--run-name 'a b'"], [], ["--kl-coef=0", "--run-name", "a b"]),
    (["--rl-args", "--run-name", "a b"], [], ["--run-name", "a b"]),  # several tokens pass as they are
    (["--seeds", "1"], ["--seeds", "1"], []), (["--rl-args"], [], [])])
def test_split_passthrough(argv, own, passed):
    assert split_passthrough(argv, "--rl-args") == (own, passed)


def test_env_id_problem_knows_every_registered_id():
    import gymnasium as gym

    assert env_id_problem("ARL/Sokoban-v0") is None
    assert env_id_problem("arena_envs:ARL/Sokoban-v0") is None
    if "CliTest/Any-v0" not in gym.registry:  # an id registered by other code is not refused
        gym.register("CliTest/Any-v0", entry_point="arena_envs.sokoban:SokobanEnv")
    assert env_id_problem("CliTest/Any-v0") is None
    assert "registered ids: ARL/Sokoban-v0" in env_id_problem("ARL/Nope-v0")


def test_resume_fallback_needs_resume():
    grpo = load_script("grpo")
    assert "give both" in args_problem(replace_flat(grpo.Args(), resume_fallback=True))
    assert args_problem(replace_flat(grpo.Args(), resume_fallback=True, resume=True)) is None


@pytest.mark.parametrize(("env_id", "turns", "prompt"), [
    ("ARL/ALFWorld-v0", 50, 2048), ("ARL/WebShop-v0", 15, 4096), ("ARL/Sokoban-v0", 15, 2048),
    ("ARL/TIRMath-v0", 5, 2048)])
def test_gpu_profile_takes_turns_and_prompt_length_from_the_env_registration(env_id, turns, prompt):
    grpo = load_script("grpo")
    gpu = parse_args(grpo.Args, grpo.GPU_PROFILE, ["--profile", "gpu", "--env-id", env_id])
    assert (gpu.max_turns, gpu.max_prompt_tokens) == (turns, prompt) == tuple(env_recipe(env_id).values())[::-1]
    flags = parse_args(grpo.Args, grpo.GPU_PROFILE, ["--env-id", env_id, "--max-turns", "3", "--profile", "gpu"])
    assert (flags.max_turns, flags.max_prompt_tokens) == (3, prompt)  # a flag still wins
    assert parse_args(grpo.Args, grpo.GPU_PROFILE, ["--env-id", env_id]).max_turns == 10  # cpu-tiny: unchanged


def test_env_recipe_of_an_unknown_id_is_empty():
    assert env_recipe("ARL/NoSuchEnv-v0") == {}
    with pytest.raises(SystemExit, match="unknown env id"):  # the recipe step leaves the message to the id check
        parse_args(Args, GPU, ["--profile", "gpu", "--env-id", "ARL/NoSuchEnv-v0"])


def test_flat_args_keeps_args_json_keys_and_replace_flat_reaches_every_group():
    """Grouped flags are stored flat in args.json under their old field names; the alarm's as collapse_<field>."""
    grpo = load_script("grpo")
    args = grpo.Args()
    flat = flat_args(args)
    assert {"seed", "eval_every", "micro_batch_size", "output_dir", "on_collapse", "collapse_warmup",
            "clip_ratio_low"} <= set(flat)
    assert not {"run", "engine", "eval", "collapse", "warmup"} & set(flat)
    changed = replace_flat(args, eval_every=3, micro_batch_size=2, collapse_warmup=7, on_collapse="stop", seed=9)
    assert (changed.eval.eval_every, changed.engine.micro_batch_size, changed.collapse.warmup) == (3, 2, 7)
    assert (changed.collapse.on_collapse, changed.seed, args.eval.eval_every) == ("stop", 9, 10)  # a copy
    with pytest.raises(TypeError, match="no_such_field"):
        replace_flat(args, no_such_field=1)


def test_a_bad_alarm_flag_names_the_flag(capsys):
    """The alarm's group checks its values as the parser builds it: the parser's error box names the flag."""
    grpo = load_script("grpo")
    with pytest.raises(SystemExit):
        parse_args(grpo.Args, grpo.GPU_PROFILE, ["--collapse-success-drop", "2"])
    assert "--collapse-success-drop must be in (0, 1) (got 2.0)" in capsys.readouterr().err


def test_gpu_profile_without_a_gpu_warns_at_start(monkeypatch, capsys):
    import torch

    grpo = load_script("grpo")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    parse_args(grpo.Args, grpo.GPU_PROFILE, ["--profile", "gpu"])
    assert capsys.readouterr().err.startswith("warning: --profile gpu on a machine without a GPU")
    parse_args(grpo.Args, grpo.GPU_PROFILE, ["--profile", "gpu", "--dry-run"])  # planning a GPU run here
    parse_args(grpo.Args, grpo.GPU_PROFILE, [])
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    parse_args(grpo.Args, grpo.GPU_PROFILE, ["--profile", "gpu"])
    assert capsys.readouterr().err == ""


def test_truncated_sampling_with_vllm_rollouts_is_refused_in_one_line():
    """vLLM's processed log-probs are renormalised over the kept tokens: with --top-p < 1 their ratio to the
    trainer's full-vocabulary log-probs is the kept mass, not a mismatch (the HF backend scores the full softmax)."""
    grpo = load_script("grpo")
    problem = args_problem(replace_flat(grpo.Args(), rollout_backend="vllm", top_p=0.9))
    assert problem is not None and "--top-p 0.9" in problem and "\n" not in problem
    assert "--top-p" not in (args_problem(replace_flat(grpo.Args(), rollout_backend="hf", top_p=0.9)) or "")
