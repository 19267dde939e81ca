"""Mixtures of envs (arena_train.mixture): allocation, groups that never span envs, per-env metrics and their
pooling, the resume check, one id exactly as before, and end-to-end runs of algos/grpo.py (CPU, tiny model)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import load_script

import wrappers
from arena_train.logger import env_metrics, pooled_means
from arena_train.mixture import EnvRow, Mixture, MixtureRollout, check_resume, env_name, mixture_problem, resume_problem
from arena_train.rollout import RolloutConfig, collect_rows, held_out_seeds, task_seeds

ROOT = Path(__file__).resolve().parents[1]
GRPO = ROOT / "algos" / "grpo.py"
SOKOBAN, WEBSHOP = "ARL/Sokoban-Mini-v0", "ARL/WebShop-v0"
CONFIG = RolloutConfig(max_turns=3, max_prompt_tokens=512, max_response_tokens=8)
#: Non-timing metrics of a single-id run recorded from algos/grpo.py before mixtures (``python
#: tests/test_arena_train_mixture.py --record`` rewrites it; only a change of the rollout itself should need that).
#: Recorded on one CPU: another CPU's kernels sum in another order, so float figures are compared within
#: ``recorded_tolerance``.
REFERENCE = ROOT / "tests" / "data" / "grpo_single_id_metrics.jsonl"
SMALL = ["--run-name", "r", "--num-iterations", "2", "--num-groups", "2", "--group-size", "2", "--max-turns", "3",
         "--max-response-tokens", "8", "--mini-batch-size", "8", "--micro-batch-size", "8", "--eval-every", "2",
         "--eval-episodes", "2", "--checkpoint-every", "1", "--torch-threads", "1", "--seed", "3",
         "--temperature", "1.0"]


class FakeBackend:
    """Seeded responses: a valid or malformed turn of each env, so returns differ within groups."""

    def __init__(self, tokenizer, seed: int = 0):
        texts = [wrappers.format_response(a) for a in ("up", "down", "left", "right", "search[red shirt]")]
        self.choices = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in [*texts, "no tags"]]
        self.rng = np.random.default_rng(seed)

    def generate(self, prompts, max_new_tokens, temperature, top_p, greedy, top_k=None):
        return [list(self.choices[self.rng.integers(len(self.choices))]) for _ in prompts]


class OneProcess:
    """An accelerator of one process (reductions are the identity), recording every reduction."""

    device = torch.device("cpu")
    is_main_process, num_processes = True, 1

    def __init__(self, add=None):
        self.seen, self.add = [], iter(add or [])

    def reduce(self, t, reduction="sum"):
        self.seen.append(t.clone())
        return t + next(self.add, torch.zeros_like(t))


def make_env(env_id: str, split: str):
    return wrappers.make_env(env_id, history_length=0, prompt_style="compact", split=split)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


# --- parsing and allocation -----------------------------------------------------------------------------
@pytest.mark.parametrize("ids, weights, message", [
    ([SOKOBAN, WEBSHOP], [1.0], "--env-weights has 1 values for 2"),
    ([SOKOBAN, WEBSHOP], [1.0, -1.0], "finite and >= 0"),
    ([SOKOBAN, WEBSHOP], [1.0, float("nan")], "finite and >= 0"),
    ([SOKOBAN, WEBSHOP], [0.0, 0.0], "must not all be 0"),
    ([SOKOBAN, SOKOBAN], None, "lists ARL/Sokoban-Mini-v0 twice"),
    (["ARL/Sokoban-Mini-v0", "Other/Sokoban-Mini-v1"], None, "share the metric name 'Sokoban-Mini'"),
    ([SOKOBAN, "ARL/Nope-v0"], None, "unknown env id 'ARL/Nope-v0'"),
    ([], None, "at least one env id"),
])
def test_bad_mixtures_are_one_line_errors(ids, weights, message):
    problem = mixture_problem(ids, weights)
    assert problem is not None and problem.startswith("error: ") and message in problem and "\n" not in problem
    with pytest.raises(SystemExit, match="error: "):
        Mixture.parse(ids, weights)


def test_parse_normalises_weights_and_names_envs():
    mixture = Mixture.parse([SOKOBAN, WEBSHOP], [1, 3])
    assert mixture.weights == (0.25, 0.75) and mixture.names == ("Sokoban-Mini", "WebShop")
    assert Mixture.parse(SOKOBAN) == Mixture.parse([SOKOBAN]) == Mixture((SOKOBAN,), (1.0,))
    assert Mixture.parse([SOKOBAN]).label == "ARL_Sokoban-Mini-v0"  # the run name of one id, as before
    assert env_name("module.path:ARL/Foo-v12") == "Foo"


def test_allocation_is_deterministic_and_exact_in_expectation():
    mixture = Mixture.parse([SOKOBAN, WEBSHOP, "ARL/Sokoban-v0"], [0.6, 0.35, 0.05])
    counts = []
    for iteration in range(4000):
        envs = mixture.allocate(8, seed=5, iteration=iteration)
        assert envs == mixture.allocate(8, seed=5, iteration=iteration) and envs == sorted(envs) and len(envs) == 8
        c = np.bincount(envs, minlength=3)
        assert np.all(np.abs(c - 8 * np.array(mixture.weights)) < 1)  # never a whole group off its share
        counts.append(c)
    mean = np.mean(counts, axis=0)
    assert mean == pytest.approx([4.8, 2.8, 0.4], abs=0.05)  # the smallest share gets groups over time


def test_zero_weight_env_is_never_drawn():
    mixture = Mixture.parse([SOKOBAN, WEBSHOP, "ARL/Sokoban-v0"], [1, 0, 2])
    assert all(1 not in mixture.allocate(n, 1, it) for n in (1, 2, 3, 7, 16) for it in range(300))


def test_task_seeds_split_over_processes_and_match_one_id():
    mixture = Mixture.parse([SOKOBAN, WEBSHOP], [0.3, 0.7])
    one = Mixture.parse([SOKOBAN])
    for it in range(20):
        assert [s for _, s in one.task_seeds(1, it, 6, 0, 1)] == task_seeds(1, it, 6, 0, 1)
        assert {e for e, _ in one.task_seeds(1, it, 6, 0, 1)} == {0}
        whole = mixture.task_seeds(1, it, 6, 0, 1)
        shares = [mixture.task_seeds(1, it, 6, rank, 2) for rank in range(2)]
        assert sorted(shares[0] + shares[1]) == sorted(whole)
        assert [s for _, s in shares[1]] == task_seeds(1, it, 6, 1, 2)


def test_budgets_follow_each_recipe_only_at_the_largest_recipe_value():
    mixture = Mixture.parse([SOKOBAN, WEBSHOP])  # recipes: 10 turns / 2048 tokens, 15 turns / 4096 tokens
    gpu = RolloutConfig(max_turns=15, max_prompt_tokens=4096, max_response_tokens=8)
    assert [(c.max_turns, c.max_prompt_tokens) for c in (mixture.rollout_config(k, gpu) for k in (0, 1))] == [
        (10, 2048), (15, 4096)]
    flagged = RolloutConfig(max_turns=5, max_prompt_tokens=512, max_response_tokens=8)
    assert all(mixture.rollout_config(k, flagged) == flagged for k in (0, 1))
    assert Mixture.parse([SOKOBAN]).rollout_config(0, flagged) == flagged


def test_gpu_profile_sizes_the_run_for_the_largest_recipe():
    from arena_train.cli import parse_args

    grpo = load_script("grpo")
    args = parse_args(grpo.Args, grpo.GPU_PROFILE, ["--profile", "gpu", "--env-id", SOKOBAN, WEBSHOP])
    assert (args.max_turns, args.max_prompt_tokens) == (15, 4096)
    args = parse_args(grpo.Args, grpo.GPU_PROFILE, ["--profile", "gpu", "--env-id", SOKOBAN, WEBSHOP,
                                                    "--max-turns", "4"])
    assert args.max_turns == 4
    with pytest.raises(SystemExit, match="--env-weights has 3 values"):
        parse_args(grpo.Args, grpo.GPU_PROFILE, ["--env-id", SOKOBAN, WEBSHOP, "--env-weights", "1", "1", "1"])


# --- collection: groups never span envs ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def mixed(tokenizer):
    """Rows and episodes of three iterations of a two-env mixture (4 groups of 3 per iteration)."""
    mixture = Mixture.parse([SOKOBAN, WEBSHOP], [0.5, 0.5])
    rollout = MixtureRollout(mixture, make_env, num_groups=4, group_size=3, eval_episodes=2)
    backend = FakeBackend(tokenizer)
    batches = [rollout.collect(backend, tokenizer, mixture.task_seeds(1, it, 4, 0, 1), CONFIG, defaultdict(float))
               for it in range(1, 4)]
    return mixture, rollout, backend, batches


def test_ids_are_unique_and_a_group_has_one_env_and_one_task(mixed):
    mixture, _, _, batches = mixed
    for rows, episodes in batches:
        assert all(isinstance(r, EnvRow) for r in rows) and {e.env for e in episodes} <= set(mixture.names)
        env_of_group, env_of_episode = defaultdict(set), defaultdict(set)
        for r in rows:
            env_of_group[r.group].add(r.env)
            env_of_episode[r.episode].add(r.env)
        assert all(len(v) == 1 for v in (*env_of_group.values(), *env_of_episode.values()))
        assert len(episodes) == 12 and len({e.episode for e in episodes}) == 12
        assert all(0 <= e.episode < 12 for e in episodes)  # below id_offset + groups x group size
        seeds_of_group = defaultdict(set)
        for e in episodes:
            seeds_of_group[e.group].add((e.env, e.task_seed))
        assert len(seeds_of_group) == 4 and all(len(v) == 1 for v in seeds_of_group.values())
        assert Counter(r.env for r in rows)  # rows of both envs over the iterations
    assert {r.env for rows, _ in batches for r in rows} == set(mixture.names)


def test_grpo_and_gigpo_groups_never_cross_envs(mixed):
    from arena_train.rewards import segment_scores

    grpo, gigpo = load_script("grpo"), load_script("gigpo")
    for rows, _ in mixed[3]:
        seg = segment_scores(rows, "sparse")
        rng = np.random.default_rng(0)
        scores = seg.score + rng.normal(size=len(seg.score))  # distinct scores: any cross-env pooling would show
        together = grpo.compute_advantages(scores, seg.group, seg.episode)
        envs = np.array([rows[k].env for k in seg.row])
        for name in set(envs):
            alone = grpo.compute_advantages(scores[envs == name], seg.group[envs == name], seg.episode[envs == name])
            np.testing.assert_array_equal(together[envs == name], alone)
        anchors = ["same state"] * len(rows)  # one anchor everywhere: only the group id can keep envs apart
        steps = gigpo.step_groups(np.array([r.group for r in rows]), anchors)
        for s in set(steps.tolist()):
            assert len({r.env for r, t in zip(rows, steps) if t == s}) == 1


def test_dynamic_sampling_keeps_whole_single_env_groups(tokenizer):
    dapo = load_script("dapo")
    mixture = Mixture.parse([SOKOBAN, WEBSHOP])
    rollout = MixtureRollout(mixture, make_env, num_groups=4, group_size=2, eval_episodes=1)
    backend = FakeBackend(tokenizer, seed=3)
    rows, episodes, stats = dapo.dynamic_sample(
        lambda attempt: rollout.collect(backend, tokenizer, mixture.task_seeds(1, 2, 4, 0, 1, attempt), CONFIG,
                                        defaultdict(float), id_offset=attempt * 4 * 2), 4, 3)
    assert len({e.episode for e in episodes}) == len(episodes)  # ids unique over the attempts
    by_group = defaultdict(list)
    for r in rows:
        by_group[r.group].append(r)
    assert len(by_group) == stats["kept_groups"] == 4
    sizes = {e.group: 0 for e in episodes}
    for e in episodes:
        sizes[e.group] += 1
    for group, members in by_group.items():
        assert len({r.env for r in members}) == 1 and len({r.episode for r in members}) == sizes[group] == 2


def test_one_id_collects_and_evaluates_exactly_as_before(tokenizer):
    ours = MixtureRollout(Mixture.parse([SOKOBAN]), make_env, num_groups=3, group_size=2, eval_episodes=2)
    before = wrappers.GroupRollout(lambda: make_env(SOKOBAN, "train"), 3, 2)
    before_eval = wrappers.GroupRollout(lambda: make_env(SOKOBAN, "test"), 2, 1)
    a, b = FakeBackend(tokenizer, seed=9), FakeBackend(tokenizer, seed=9)
    for it in (1, 2):
        seeds = task_seeds(1, it, 3, 0, 1)
        new_rows, new_eps = ours.collect(a, tokenizer, Mixture.parse(SOKOBAN).task_seeds(1, it, 3, 0, 1), CONFIG,
                                         defaultdict(float), id_offset=6)
        old_rows, old_eps = collect_rows(b, tokenizer, before, seeds, CONFIG, defaultdict(float), id_offset=6)
        assert [{**vars(r), "env": None} for r in new_rows] == [{**vars(r), "env": None} for r in old_rows]
        assert [(e.won, e.env_return, e.length, e.task_seed) for e in new_eps] == [
            (e.won, e.env_return, e.length, e.task_seed) for e in old_eps]
    accelerator = OneProcess()
    out = ours.evaluate(accelerator, a, tokenizer, CONFIG, 2, 0, 1)
    _, held_out = collect_rows(b, tokenizer, before_eval, held_out_seeds(2, 0, 1), CONFIG, defaultdict(float))
    assert out["eval/success_rate"] == float(np.mean([e.won for e in held_out]))
    assert out["eval/failed_episodes"] == 0 and not any(k.startswith("eval/Sokoban") for k in out)


# --- per-env metrics and their pooling -------------------------------------------------------------------
KEYS = ("success_rate", "episode_return", "episode_length", "valid_format_ratio", "valid_action_ratio",
        "response_length", "advantage_abs", "num_rows")


def test_env_metrics_names_values_and_pooling_over_processes(mixed):
    mixture, _, _, batches = mixed
    rows, episodes = batches[0]
    for k, r in enumerate(rows):
        r.advantage = float(k % 5) - 2.0
    whole = env_metrics(OneProcess(), mixture.names, episodes=episodes, rows=rows)
    assert list(whole) == [f"env/{n}/{key}" for n in mixture.names for key in KEYS]
    for name in mixture.names:
        mine = [r for r in rows if r.env == name]
        assert whole[f"env/{name}/num_rows"] == len(mine)
        assert whole[f"env/{name}/advantage_abs"] == pytest.approx(np.mean([abs(r.advantage) for r in mine]))
        assert whole[f"env/{name}/success_rate"] == pytest.approx(np.mean([e.won for e in episodes if e.env == name]))
    # two processes, the second one without any row or episode of the first env: same calls, pooled values
    first = mixture.names[0]
    split_rows = ([r for r in rows if r.env == first or r.episode % 2], [r for r in rows if r.env != first
                                                                          and not r.episode % 2])
    split_eps = ([e for e in episodes if e.env == first or e.episode % 2], [e for e in episodes if e.env != first
                                                                            and not e.episode % 2])
    other = OneProcess()
    env_metrics(other, mixture.names, episodes=split_eps[1], rows=split_rows[1])
    main = OneProcess(add=other.seen)
    pooled = env_metrics(main, mixture.names, episodes=split_eps[0], rows=split_rows[0])
    assert [t.shape for t in main.seen] == [t.shape for t in other.seen] and len(main.seen) == 1
    assert pooled == pytest.approx(whole)


def test_pooled_means_of_nothing_is_nan_and_sums_count():
    out = pooled_means(OneProcess(), {"a": [], "b": [1.0, 3.0], "n": [1.0, 1.0]}, sums=["n"])
    assert np.isnan(out["a"]) and out["b"] == 2.0 and out["n"] == 2.0


def test_mixture_evaluation_reports_every_env(mixed, tokenizer):
    mixture, rollout, backend, _ = mixed
    out = rollout.evaluate(OneProcess(), backend, tokenizer, CONFIG, 2, 0, 1)
    rates = [k for k in out if k.endswith("success_rate")]
    assert rates == ["eval/success_rate", "eval/Sokoban-Mini/success_rate", "eval/WebShop/success_rate"]
    assert out["eval/success_rate"] == pytest.approx(np.mean([out[k] for k in rates[1:]]))
    assert out["eval/failed_episodes"] == 0 and out["eval/stop/episode/env_error"] == 0
    assert [[e.task_seed for e in r.episodes()] for r in rollout.eval_rollouts] == [held_out_seeds(2, 0, 1)] * 2


# --- resume -------------------------------------------------------------------------------------------
def test_resume_refuses_a_changed_mixture(tmp_path):
    (tmp_path / "args.json").write_text(json.dumps({"env_id": [SOKOBAN, WEBSHOP], "env_weights": [1, 1]}))
    assert resume_problem(tmp_path, Mixture.parse([SOKOBAN, WEBSHOP], [0.5, 0.5])) is None  # same shares
    problem = resume_problem(tmp_path, Mixture.parse([SOKOBAN, WEBSHOP], [0.2, 0.8]))
    assert problem == (f"error: cannot resume {tmp_path}: its --env-weights are 0.5 0.5 (normalised), not 0.2 0.8; "
                       f"pass the run's own --env-id and --env-weights to continue it, or --overwrite (or another "
                       f"--run-name) to train the new mixture from the start")
    problem = resume_problem(tmp_path, Mixture.parse([WEBSHOP, SOKOBAN]))
    assert f"it trains on --env-id {SOKOBAN} {WEBSHOP}, not {WEBSHOP} {SOKOBAN}" in problem
    with pytest.raises(SystemExit, match="cannot resume"):
        check_resume(OneProcess(), tmp_path, Mixture.parse([SOKOBAN]))
    (tmp_path / "args.json").write_text(json.dumps({"env_id": SOKOBAN}))  # a run from before mixtures
    assert resume_problem(tmp_path, Mixture.parse([SOKOBAN])) is None
    assert "not ARL/Sokoban-Mini-v0 ARL/WebShop-v0" in resume_problem(tmp_path, Mixture.parse([SOKOBAN, WEBSHOP]))
    assert resume_problem(tmp_path / "missing", Mixture.parse([SOKOBAN])) is None


# --- end to end: algos/grpo.py --------------------------------------------------------------------------
def run_grpo(out: Path, model: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, str(GRPO), "--model-path", model, "--output-dir", str(out), *SMALL, *extra],
                          env=env, capture_output=True, text=True, timeout=300)


def metric_lines(out: Path) -> list[dict]:
    """The training iterations' lines (iteration 0 holds the start's held-out evaluation only)."""
    lines = [json.loads(line) for line in (out / "r" / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if line["iteration"] >= 1]


#: float32 spacing of a log-prob: |log p| < 8 here (near-uniform over 520 tokens: log 520 = 6.25), ulp = 2^-21.
LOGP_ULP = 2.0 ** -21
#: How far float order moves a token's log-prob l = logit - logsumexp(logits): each logit is a float32 sum over
#: the hidden size (64, in each of 2 layers) of O(0.1) terms, the logsumexp a sum of 520 O(1) terms. A reordered
#: float32 sum of n terms moves by about sqrt(n) * u of their total (u = 2^-24 = 6e-8): 2 * 8 * 6e-8 * ~1 for
#: the logit, sqrt(520) * 6e-8 = 1.4e-6 for the log of the sum: about 2e-6, 4 ulps; take 8. A token mean of
#: per-token values (entropy, approx_kl, kl_ref) moves no more than its worst token. Measured here under forced
#: kernels (ATEN_CPU_CAPABILITY=default or avx2, MKL_CBWR=COMPATIBLE, MKL_ENABLE_INSTRUCTIONS=SSE4_2): <= 1 ulp.
LOGP_ATOL = 8 * LOGP_ULP
#: Figures that do not depend on float order, compared exactly: counts and fractions of sampled tokens,
#: episodes, rewards and clip events. A sampled token (inverse-CDF sampling) changes only when its uniform draw
#: falls within the CDF's rounding (~1e-6) of a boundary: ~1e-6 per token, ~1e-4 for the run's few hundred.
EXACT_PREFIXES = ("iteration", "rollout/", "actor/clipfrac", "actor/masked_seqs", "actor/skipped_updates", "eval/")


def recorded_tolerance(key: str, line: dict) -> float:
    """Absolute tolerance of the recorded figure ``key`` of ``line`` on another CPU (0: exact)."""
    if key in ("rollout/advantage_abs", "actor/pg_loss"):
        # Every group's returns are equal here, so an advantage is (x - mean) / (std + 1e-6) with x - mean the
        # rounding of the float64 mean of 12 equal values: at most 12 ulps of 0.3 (2^-54 each) / 1e-6.
        # pg_loss = mean of -A * ratio, ratio = 1 + O(1e-3): as small.
        return 12 * 2.0 ** -54 / 1e-6
    if key == "actor/grad_norm":
        # Advantages are 0: the gradient is the KL term's, proportional to d = l - l_ref per token, |d| about
        # sqrt(2 kl_ref) (k3 = d^2 / 2); d moves by up to 2 LOGP_ATOL, so the norm by that fraction of itself.
        return 2 * LOGP_ATOL / math.sqrt(2 * line["actor/kl_ref"]) * line[key]
    return 0.0 if key.startswith(EXACT_PREFIXES) else LOGP_ATOL


def test_one_id_run_logs_what_it_logged_before_mixtures(tiny_model, tmp_path):
    """The reference predates the episode streams too: --no-episode-streams samples as the versions before them."""
    proc = run_grpo(tmp_path, tiny_model, "--no-episode-streams")
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = [json.loads(line) for line in REFERENCE.read_text().splitlines()]
    got = metric_lines(tmp_path)
    assert len(got) == len(reference)
    for mine, before in zip(got, reference):
        assert set(before) <= set(mine)
        for key, value in before.items():
            assert mine[key] == pytest.approx(value, rel=0, abs=recorded_tolerance(key, before)), key
        assert not any(k.startswith("env/") or (k.count("/") > 1 and not k.startswith(("stop/", "eval/stop/")))
                       for k in mine)


def test_two_env_run_logs_every_env_and_refuses_another_mixture_on_resume(tiny_model, tmp_path):
    proc = run_grpo(tmp_path, tiny_model, "--env-id", SOKOBAN, WEBSHOP, "--env-weights", "0.5", "0.5",
                    "--num-groups", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = metric_lines(tmp_path)
    for line in lines:
        for name in ("Sokoban-Mini", "WebShop"):
            assert all(f"env/{name}/{key}" in line for key in KEYS)
        assert sum(line[f"env/{n}/num_rows"] for n in ("Sokoban-Mini", "WebShop")) == line["rollout/num_rows"]
        for name in ("Sokoban-Mini", "WebShop"):  # each env's importance ratios against its own old policy
            assert 0.0 <= line[f"env/{name}/ratio_out_frac"] <= 1.0 and math.isfinite(line[f"env/{name}/approx_kl"])
    assert {"eval/success_rate", "eval/Sokoban-Mini/success_rate", "eval/WebShop/success_rate"} <= set(lines[-1])
    assert json.loads((tmp_path / "r" / "args.json").read_text())["env_id"] == [SOKOBAN, WEBSHOP]
    proc = run_grpo(tmp_path, tiny_model, "--env-id", SOKOBAN, WEBSHOP, "--env-weights", "0.2", "0.8",
                    "--num-groups", "4", "--resume", "--num-iterations", "3")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: cannot resume {tmp_path / 'r'}: its --env-weights")
    assert len(metric_lines(tmp_path)) == 2  # the run is untouched


def record_reference(model: str, folder: Path) -> None:
    """Rewrite REFERENCE from a run of algos/grpo.py (timings left out)."""
    proc = run_grpo(folder, model, "--no-episode-streams")
    assert proc.returncode == 0, proc.stderr[-3000:]
    REFERENCE.write_text("".join(json.dumps({k: v for k, v in line.items() if not k.startswith("perf/")}) + "\n"
                                 for line in metric_lines(folder)))


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    import tempfile

    from arena_models import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:  # the tiny_model fixture's model
        record_reference(str(build_tiny_model(Path(tmp) / "tiny", corpus=["Push every box (X) onto a target (O)."])),
                         Path(tmp) / "run")
