"""One evaluation panel: held-out evaluation is addressed by task seed, so every split of the work plays the same
tasks with the same per-task results. The training scripts' in-run evaluation (``MixtureRollout.evaluate`` on
``held_out_seeds``) is run in 1 process, under ``accelerate launch`` in 2, and in 1 process with env workers, with a
real tiny model decoding greedily and sampling (each episode from its own stream, ``arena_train.streams``) and
with a policy that acts on the observation alone; ``eval.evaluate`` plays the same seeds with the same results
whether its envs step in-process or in worker processes, sampled decoding included."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import needs_accelerate, run_two_processes

import wrappers
from arena_train.rollout import VAL_TEMPERATURE, VAL_TOP_K, VAL_TOP_P, RolloutConfig, collect_rows, held_out_seeds
from arena_train.streams import sampling_seed
from eval.evaluate import Args, evaluate_policy, hf_policy, load_model, main

GRPO = Path(__file__).resolve().parents[1] / "algos" / "grpo.py"
SOKOBAN = "ARL/Sokoban-Mini-v0"
EPISODES = 6
#: A real tiny model decoding greedily and sampling (the validation defaults), and a policy that acts on the
#: observation alone (the expert's move or, by a hash of the prompt, another), whose tasks end differently.
POLICIES = ("model", "sampled", "observation")
#: (processes, env workers) of the in-run panels: each split is compared with one process, envs in-process.
SPLITS = ((1, 0), (2, 0), (1, 2))
RUN_SEED = 7

#: Each process evaluates its share of the panel and writes, per held-out episode, its task seed and results,
#: per prompt (and, sampling, its seed) the tokens the policy answered, and the pooled success rate.
PANEL_SCRIPT = '''
import functools, json, sys, zlib
from pathlib import Path

from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer

import wrappers
from arena_train.backends import HFBackend
from arena_train.mixture import Mixture, MixtureRollout
from arena_train.rollout import VAL_TEMPERATURE, VAL_TOP_K, VAL_TOP_P, RolloutConfig


class ObservationPolicy:
    """The expert's move or, by a hash of the prompt, another: a function of the state, so tasks differ."""

    def __init__(self, rollouts, tokenizer):
        self.rollouts, self.tokenizer = rollouts, tokenizer

    def generate(self, prompts, max_new_tokens, temperature, top_p, greedy, top_k=None, seeds=None):
        held_out = self.rollouts.eval_rollouts[0]
        moves = []
        for episode, prompt in zip(held_out.active(), prompts):
            h = zlib.crc32(bytes(str(prompt), "ascii"))
            expert = held_out.envs[episode].unwrapped.expert_action()
            moves.append(expert if h % 3 else ("up", "down", "left", "right")[h % 4])
        return [self.tokenizer(wrappers.format_response(m), add_special_tokens=False)["input_ids"] for m in moves]


class Recorded:
    """The backend, recording the answer to every prompt (and its seed, when it has one)."""

    def __init__(self, backend):
        self.backend, self.answers = backend, {}

    def generate(self, prompts, *args, seeds=None, **kwargs):
        responses = self.backend.generate(prompts, *args, seeds=seeds, **kwargs)
        keys = [str(p) if seeds is None else f"{s}:{p}" for p, s in zip(prompts, seeds or prompts)]
        self.answers.update({k: list(map(int, r)) for k, r in zip(keys, responses)})
        return responses


def main(model_path, out, episodes, workers, seed):
    accelerator = Accelerator(cpu=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    make_env = functools.partial(wrappers.make_env, history_length=2, prompt_style="compact")  # pickles
    rollouts = MixtureRollout(Mixture.parse(["ARL/Sokoban-Mini-v0"]), make_env, 1, 1, episodes // world,
                              env_workers=workers)
    model = HFBackend(AutoModelForCausalLM.from_pretrained(model_path), tokenizer)
    sampling = dict(temperature=VAL_TEMPERATURE, top_p=VAL_TOP_P, top_k=VAL_TOP_K)
    record = {}
    for policy, backend, turns, greedy in (("model", model, 4, True), ("sampled", model, 4, False),
                                           ("observation", ObservationPolicy(rollouts, tokenizer), 8, True)):
        backend = Recorded(backend)
        config = RolloutConfig(max_turns=turns, max_prompt_tokens=512, max_response_tokens=8, **sampling)
        metrics = rollouts.evaluate(accelerator, backend, tokenizer, config, episodes, rank, world, greedy=greedy,
                                    seed=seed)
        results = [[e.task_seed, e.won, e.length, e.env_return, e.episode_return, e.num_valid_format,
                    e.num_valid_action] for e in rollouts.eval_rollouts[0].episodes()]
        record[policy] = {"metrics": metrics, "results": results, "answers": backend.answers}
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    rollouts.close()
    accelerator.wait_for_everyone()
    accelerator.end_training()  # tears the process group down: exiting with live gloo threads can abort


if __name__ == "__main__":  # env workers start from a fresh interpreter that imports this file
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
'''


@pytest.fixture(scope="module")
def panels(tiny_model, tmp_path_factory) -> dict[tuple[int, int], dict[str, dict]]:
    """Per split (processes, env workers) and policy: per task seed its results, the answer to every prompt and the
    pooled success rate."""
    out = {}
    for processes, workers in SPLITS:
        folder = tmp_path_factory.mktemp(f"panel{processes}-{workers}")
        args = [tiny_model, str(folder), str(EPISODES), str(workers), str(RUN_SEED)]
        if processes == 1:
            script = folder / "script.py"
            script.write_text(PANEL_SCRIPT)
            env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
            proc = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True,
                                  timeout=300)
        else:
            proc = run_two_processes(PANEL_SCRIPT, folder, *args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(processes)]
        out[processes, workers] = {}
        for policy in POLICIES:
            mine = [r[policy] for r in ranks]
            assert all(r["metrics"] == mine[0]["metrics"] for r in mine)  # pooled: every process logs the same
            results = [x for r in mine for x in r["results"]]
            by_seed = {x[0]: x[1:] for x in results}
            assert len(by_seed) == len(results)  # no task played twice
            out[processes, workers][policy] = {"metrics": mine[0]["metrics"], "by_seed": by_seed,
                                      "answers": {p: a for r in mine for p, a in r["answers"].items()}}
    return out


@pytest.mark.slow
@needs_accelerate
@pytest.mark.parametrize("split", SPLITS[1:], ids=["2-processes", "env-workers"])
@pytest.mark.parametrize("policy", POLICIES)
def test_in_run_evaluation_plays_one_panel_over_processes_and_env_workers(policy, split, panels):
    one, other = panels[1, 0][policy], panels[split][policy]
    assert sorted(one["by_seed"]) == sorted(other["by_seed"]) == held_out_seeds(EPISODES, 0, 1)
    assert other["by_seed"] == one["by_seed"]  # the same results, task by task, bit for bit
    assert other["metrics"] == one["metrics"]
    assert other["answers"] == one["answers"]  # the same answer per prompt (sampling: and per seed)
    if policy == "observation":  # the check has teeth: tasks differ in outcome
        assert len({tuple(r) for r in one["by_seed"].values()}) > 1


@pytest.mark.slow
@needs_accelerate
def test_the_sampled_panel_samples(panels):
    """The sampled panel's checks have teeth: most of its answers are not the greedy answers to the same prompts."""
    greedy, sampled = panels[1, 0]["model"]["answers"], panels[1, 0]["sampled"]["answers"]
    differ = [greedy[p] != a for k, a in sampled.items() if (p := k.split(":", 1)[1]) in greedy]
    assert differ and sum(differ) > len(differ) // 2


@pytest.mark.parametrize("env_workers", [0, 2])
def test_standalone_evaluation_plays_the_in_run_panel(env_workers, tmp_path):
    """The same seeds, and the same results whether the envs step in this process or in 2 workers."""
    records = []
    for workers in (0, env_workers):
        out = tmp_path / f"eval{workers}.json"
        assert main(Args(env_id=SOKOBAN, num_seeds=EPISODES, baselines=["expert", "random"], samples=2,
                         env_workers=workers, progress=False, out=out)) == 0
        records.append(json.loads(out.read_text()))
    assert records[0]["seeds"] == records[1]["seeds"] == held_out_seeds(EPISODES, 0, 1)
    for a, b in zip(records[0]["results"], records[1]["results"]):
        assert {**a, "seconds": 0} == {**b, "seconds": 0}  # wall time apart, bit for bit



@pytest.fixture(scope="module")
def model(tiny_model):
    return load_model(tiny_model, "cpu")


def test_standalone_sampled_evaluation_gives_each_episode_its_stream(model):
    """``eval.evaluate``'s sampled decoding (the validation defaults, 2 samples per seed): the same answer to every
    (task, sample, turn) and the same results with envs in-process, whole batches and one chunk as with 2 env
    workers, batches of 3 prompts and chunks of 2 tasks."""
    records = []
    for workers, batch_size, max_parallel in ((0, 64, 256), (2, 3, 4)):
        policy = hf_policy(*model, greedy=False, temperature=VAL_TEMPERATURE, top_p=VAL_TOP_P, top_k=VAL_TOP_K,
                           max_new_tokens=8, batch_size=batch_size, seed=RUN_SEED)
        answers: dict[int, str] = {}

        def recorded(batch, seeds=None, policy=policy, answers=answers):
            texts = policy(batch, seeds=seeds)
            answers.update(zip(seeds, texts))
            return texts

        recorded.sampling_seed, recorded.stop_counts = policy.sampling_seed, policy.stop_counts
        result = evaluate_policy(SOKOBAN, recorded, held_out_seeds(EPISODES, 0, 1), samples=2, max_turns=4,
                                 prompt_style="compact", max_parallel=max_parallel, progress=False,
                                 env_workers=workers)
        records.append(({**result.as_dict(), "seconds": 0}, answers))
    assert records[0] == records[1]  # wall time apart, bit for bit
    answers = records[0][1]
    assert len(answers) >= 2 * EPISODES and len(set(answers.values())) > len(answers) // 2  # sampled, per episode

class SeedEcho:
    """A backend whose response is a function of the request's seed alone (a stand-in for per-row sampling),
    recording the seed of every (task seed, turn) request."""

    def __init__(self, tokenizer):
        texts = [wrappers.format_response(a) for a in ("up", "down", "left", "right")] + ["no tags"]
        self.choices = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        self.calls: list[list[int] | None] = []

    def generate(self, prompts, max_new_tokens, temperature, top_p, greedy, top_k=None, seeds=None):
        self.calls.append(seeds)
        return [list(self.choices[(s or 0) % len(self.choices)]) for s in (seeds or [0] * len(prompts))]


@pytest.mark.parametrize("layout", ["step", "trajectory"])
def test_each_held_out_episode_samples_from_its_own_stream(tiny_model, layout):
    """``collect_rows(..., sampling_seed=S)`` passes the backend, per episode and turn, ``sampling_seed(S, task
    seed, index in group, turn)``: the same seeds and results whether the tasks are played together or one
    rollout each; greedy decoding, and sampling without ``sampling_seed`` (training), pass no seeds."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    make = functools.partial(wrappers.make_env, SOKOBAN, history_length=0 if layout == "trajectory" else 2,
                             prompt_style="compact")
    config = RolloutConfig(max_turns=4, max_prompt_tokens=512, max_response_tokens=8, row_layout=layout)
    seeds = held_out_seeds(4, 0, 1)

    def play(task_seeds, group_size=2, **kwargs):
        backend = SeedEcho(tokenizer)
        rollout = wrappers.GroupRollout(make, len(task_seeds), group_size)
        _, episodes = collect_rows(backend, tokenizer, rollout, task_seeds, config, defaultdict(float), **kwargs)
        results = {(e.task_seed, e.episode % group_size): (e.won, e.length, e.env_return, e.num_valid_action)
                   for e in episodes}
        return backend.calls, results

    calls, together = play(seeds, sampling_seed=RUN_SEED)
    apart = {}
    for task in seeds[::-1]:
        apart.update(play([task], sampling_seed=RUN_SEED)[1])
    assert apart == together
    assert len({r for r in together.values()}) > 1  # the seeds steer the episodes apart
    # turn t asks for the episodes still active, each with the seed of (RUN_SEED, task seed, sample, t)
    first = [sampling_seed(RUN_SEED, task, sample, 0) for task in seeds for sample in (0, 1)]
    assert calls[0] == first and len(set(first)) == len(first)
    for t, call in enumerate(calls):
        assert set(call) <= {sampling_seed(RUN_SEED, task, sample, t) for task in seeds for sample in (0, 1)}
    assert all(c is None for c in play(seeds, greedy=True, sampling_seed=RUN_SEED)[0] + play(seeds)[0])


@pytest.mark.slow
def test_a_sampled_evaluation_leaves_the_training_that_follows_it_unchanged(tiny_model, tmp_path):
    """``grpo.py`` evaluating (sampled) after iteration 1 logs for iteration 2 what a run without evaluation logs:
    the evaluation's streams are its own, the training rollouts' stream (seed + rank) is not drawn from."""
    logs = []
    for every in (1, 0):
        cmd = [sys.executable, str(GRPO), "--model-path", tiny_model, "--output-dir", str(tmp_path / str(every)),
               "--run-name", "r", "--num-iterations", "2", "--num-groups", "2", "--group-size", "2", "--max-turns",
               "3", "--max-response-tokens", "8", "--mini-batch-size", "8", "--micro-batch-size", "8",
               "--eval-every", str(every), "--eval-episodes", "2", "--checkpoint-every", "0", "--torch-threads", "1",
               "--temperature", "1.0"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        logs.append([json.loads(line) for line in (tmp_path / str(every) / "r" / "metrics.jsonl").read_text()
                     .splitlines()])
    assert logs[0][0]["iteration"] == 0 and "eval/success_rate" in logs[0][0]  # the start's evaluation
    assert "eval/success_rate" not in logs[1][0]
    assert [{k: v for k, v in m.items() if not k.startswith(("perf/", "eval/"))} for m in logs[0][1:]] == [
        {k: v for k, v in m.items() if not k.startswith("perf/")} for m in logs[1]]
