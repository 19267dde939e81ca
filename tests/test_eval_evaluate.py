"""Evaluation on a tiny random model and the expert / random baselines (kept to a few seconds)."""

from __future__ import annotations

import json
import math
from itertools import combinations

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arena_envs.base import TextEnv
from arena_train.stats import mean_ci, pass_at_k, proportion_ci, t_quantile
from eval.evaluate import Args, evaluate_policy, hf_policy, load_model, main

SOKOBAN = "ARL/Sokoban-v0"
SEEDS = list(range(1_000_000_000, 1_000_000_012))


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from arena_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", size="xs")


def finite_estimates(result):
    for key in ("success", "score", "episode_return", "length", "valid_format", "valid_action"):
        est = getattr(result, key)
        assert math.isfinite(est.mean) and est.low <= est.mean <= est.high, key
    for key in ("success", "valid_format", "valid_action"):
        assert 0 <= getattr(result, key).mean <= 1


def test_expert_beats_random_on_the_same_seeds():
    expert = evaluate_policy(SOKOBAN, "expert", SEEDS, progress=False)
    random = evaluate_policy(SOKOBAN, "random", SEEDS, samples=2, k_values=(1, 2), progress=False)
    for r in (expert, random):
        finite_estimates(r)
    assert expert.success.mean == 1.0 and expert.success.n == len(SEEDS)
    assert expert.success.mean >= random.success.mean and expert.score.mean >= random.score.mean
    assert expert.valid_format.mean == 1.0 and random.valid_action.mean == 1.0
    assert random.num_seeds == len(SEEDS) and random.samples_per_seed == 2
    assert random.pass_at_k[1] == pytest.approx(random.success.mean)
    assert random.pass_at_k[2] >= random.pass_at_k[1]
    again = evaluate_policy(SOKOBAN, "random", SEEDS, samples=2, k_values=(1, 2), progress=False)
    assert again.success == random.success and again.length == random.length  # same seeds, same numbers


def test_tiny_model_through_the_importable_api(tiny_model_dir):
    model, tokenizer = load_model(str(tiny_model_dir), "cpu")
    model.train()
    calls = []
    policy = hf_policy(model, tokenizer, greedy=True, max_new_tokens=8)

    def counted(batch):
        calls.append(len(batch))
        return policy(batch)

    result = evaluate_policy(SOKOBAN, counted, SEEDS[:3], max_turns=2, prompt_style="compact", progress=False)
    finite_estimates(result)
    assert calls and calls[0] == 3 and len(calls) <= 2  # one batched call per turn over active episodes
    assert result.length.mean <= 2 and result.pass_at_k == {1: result.success.mean}
    assert model.training  # the policy leaves the model's mode as it found it


def test_cli_writes_json_and_table(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    args = Args(env_id=SOKOBAN, model=str(tiny_model_dir), num_seeds=2, decoding=["greedy", "sampled"], samples=2,
                k=[1, 2], max_turns=2, max_new_tokens=8, prompt_style="compact", progress=False, out=out)
    assert main(args) == 0
    record = json.loads(out.read_text())
    results = {r["name"]: r for r in record["results"]}
    assert list(results) == ["greedy", "sampled", "expert", "random"]
    assert results["sampled"]["samples_per_seed"] == 2 and set(results["sampled"]["pass_at_k"]) == {"1", "2"}
    assert results["expert"]["success"]["mean"] >= results["random"]["success"]["mean"]
    assert all(math.isfinite(r["score"]["mean"]) for r in results.values())
    table = out.with_suffix(".md").read_text()
    assert "| greedy |" in table and "pass@2 %" in table and "| greedy |" in capsys.readouterr().out


def test_several_envs_give_a_table_per_env(tmp_path, capsys):
    out = tmp_path / "eval.json"
    envs = ["ARL/Sokoban-Mini-v0", "ARL/WebShop-v0"]
    assert main(Args(env_id=envs, num_seeds=2, baselines=["expert"], progress=False, out=out)) == 0
    record = json.loads(out.read_text())
    assert record["env_id"] == envs and [r["env_id"] for r in record["results"]] == envs
    markdown = out.with_suffix(".md").read_text()
    assert "## ARL/Sokoban-Mini-v0 (test split)" in markdown and "## ARL/WebShop-v0 (test split)" in markdown
    printed = capsys.readouterr().out
    assert printed.index("ARL/Sokoban-Mini-v0 (test split)") < printed.index("ARL/WebShop-v0 (test split)")


class OpenEnv(TextEnv):
    """A one-step env with an open action set (admissible_actions is None), like TIR-Math."""

    def _reset(self, options):
        return "say hi", {}

    def _step(self, action):
        won = action.strip() == "hi"
        return "", float(won), True, False, {"won": won, "action_is_valid": bool(action.strip())}

    def task_description(self):
        return "say hi"

    def expert_action(self):
        return "hi"


def test_random_baseline_is_na_without_admissible_actions(capsys):
    if "EvalTest/Open-v0" not in gym.registry:
        gym.register("EvalTest/Open-v0", entry_point=OpenEnv, max_episode_steps=3)
    random = evaluate_policy("EvalTest/Open-v0", "random", [0, 1], progress=False)
    assert not random.available and "n/a" in random.note
    expert = evaluate_policy("EvalTest/Open-v0", "expert", [0, 1], progress=False)
    assert expert.success.mean == 1.0
    assert main(Args(env_id="EvalTest/Open-v0", num_seeds=2, progress=False)) == 0
    assert "open action set" in capsys.readouterr().out


@pytest.mark.parametrize("args", [Args(env_id="ARL/Nope-v0", baselines=["expert"], progress=False),
                                  Args(env_kwargs="[1]", progress=False),
                                  Args(model="/nonexistent/model", num_seeds=1, progress=False)])
def test_bad_input_is_a_clear_error(args, capsys):
    assert main(args) == 2
    assert "error:" in capsys.readouterr().err


# --- statistics ------------------------------------------------------------------------
@pytest.mark.parametrize("df,expected", [(1, 12.7062), (2, 4.3027), (3, 3.1824), (5, 2.5706), (10, 2.2281),
                                         (30, 2.0423)])
def test_t_quantile_matches_tables(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, rel=2e-3)
    assert t_quantile(0.025, df) == pytest.approx(-expected, rel=2e-3)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 500).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_wilson_interval_is_inside_unit_and_contains_the_rate(nc):
    n, c = nc
    est = proportion_ci(c, n)
    assert 0 <= est.low <= est.mean == c / n <= est.high <= 1
    assert proportion_ci(c * 4, n * 4).high - proportion_ci(c * 4, n * 4).low < est.high - est.low


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=50))
def test_mean_interval_contains_the_mean(xs):
    est = mean_ci(xs)
    assert est.n == len(xs) and est.low <= est.mean <= est.high
    assert est.mean == pytest.approx(sum(xs) / len(xs), abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_enumeration(nck):
    n, c, k = nck
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(combinations(range(n), k))
    brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_training_defaults_are_the_scripts_args_defaults():
    """eval.evaluate reads grpo.py's defaults from its source: they must be what the script's Args holds."""
    from conftest import load_script

    from arena_train.cli import flat_args
    from eval.evaluate import RUN_SETTINGS, training_defaults

    expected, read = flat_args(load_script("grpo").Args()), training_defaults()
    for key, _ in RUN_SETTINGS.values():
        assert read[key] == expected[key], key
