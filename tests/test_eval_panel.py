"""One evaluation panel: held-out evaluation is addressed by task seed, so every split of the work plays the same
tasks with the same per-task results. The training scripts' in-run evaluation (``MixtureRollout.evaluate`` on
``held_out_seeds``) is run in 1 process and under ``accelerate launch`` in 2, with a real tiny model decoding
greedily and with a policy that acts on the observation alone; ``eval.evaluate`` plays the same seeds with the same
results whether its envs step in-process or in worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import needs_accelerate, run_two_processes

from arena_train.rollout import held_out_seeds
from eval.evaluate import Args, main

SOKOBAN = "ARL/Sokoban-Mini-v0"
EPISODES = 6
#: A real tiny model decoding greedily, and a policy that acts on the observation alone (the expert's move or,
#: by a hash of the prompt, another), whose tasks end differently.
POLICIES = ("model", "observation")

#: Each process evaluates its share of the panel and writes, per held-out episode, its task seed and results,
#: per prompt the tokens the policy answered, and the pooled success rate.
PANEL_SCRIPT = '''
import json, sys, zlib
from pathlib import Path

from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer

import wrappers
from arena_train.backends import HFBackend
from arena_train.mixture import Mixture, MixtureRollout
from arena_train.rollout import RolloutConfig

model_path, out, episodes = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
accelerator = Accelerator(cpu=True)
rank, world = accelerator.process_index, accelerator.num_processes
tokenizer = AutoTokenizer.from_pretrained(model_path)


class ObservationPolicy:
    """The expert's move or, by a hash of the prompt, another: a function of the state, so tasks differ."""

    def generate(self, prompts, max_new_tokens, temperature, top_p, greedy, top_k=None):
        held_out = rollouts.eval_rollouts[0]
        moves = []
        for episode, prompt in zip(held_out.active(), prompts):
            h = zlib.crc32(bytes(str(prompt), "ascii"))
            expert = held_out.envs[episode].unwrapped.expert_action()
            moves.append(expert if h % 3 else ("up", "down", "left", "right")[h % 4])
        return [tokenizer(wrappers.format_response(m), add_special_tokens=False)["input_ids"] for m in moves]


class Recorded:
    """The backend, recording the answer to every prompt."""

    def __init__(self, backend):
        self.backend, self.answers = backend, {}

    def generate(self, prompts, *args, **kwargs):
        responses = self.backend.generate(prompts, *args, **kwargs)
        self.answers.update({str(p): list(map(int, r)) for p, r in zip(prompts, responses)})
        return responses


rollouts = MixtureRollout(Mixture.parse(["ARL/Sokoban-Mini-v0"]), lambda env_id, split: wrappers.make_env(
    env_id, history_length=2, prompt_style="compact", split=split), 1, 1, episodes // world)
record = {}
for policy, backend, turns in (("model", HFBackend(AutoModelForCausalLM.from_pretrained(model_path), tokenizer), 4),
                               ("observation", ObservationPolicy(), 8)):
    backend = Recorded(backend)
    config = RolloutConfig(max_turns=turns, max_prompt_tokens=512, max_response_tokens=8)
    metrics = rollouts.evaluate(accelerator, backend, tokenizer, config, episodes, rank, world, greedy=True)
    results = [[e.task_seed, e.won, e.length, e.env_return, e.episode_return, e.num_valid_format,
                e.num_valid_action] for e in rollouts.eval_rollouts[0].episodes()]
    record[policy] = {"metrics": metrics, "results": results, "answers": backend.answers}
(out / f"rank{rank}.json").write_text(json.dumps(record))
accelerator.wait_for_everyone()
accelerator.end_training()  # tears the process group down: exiting with live gloo threads can abort
'''


@pytest.fixture(scope="module")
def panels(tiny_model, tmp_path_factory) -> dict[int, dict[str, dict]]:
    """Per number of processes (1, 2) and policy: per task seed its results, the answer to every prompt and the
    pooled success rate."""
    out = {}
    for processes in (1, 2):
        folder = tmp_path_factory.mktemp(f"panel{processes}")
        args = [tiny_model, str(folder), str(EPISODES)]
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
        out[processes] = {}
        for policy in POLICIES:
            mine = [r[policy] for r in ranks]
            assert all(r["metrics"] == mine[0]["metrics"] for r in mine)  # pooled: every process logs the same
            results = [x for r in mine for x in r["results"]]
            by_seed = {x[0]: x[1:] for x in results}
            assert len(by_seed) == len(results)  # no task played twice
            out[processes][policy] = {"metrics": mine[0]["metrics"], "by_seed": by_seed,
                                      "answers": {p: a for r in mine for p, a in r["answers"].items()}}
    return out


@pytest.mark.slow
@needs_accelerate
@pytest.mark.parametrize("policy", POLICIES)
def test_in_run_evaluation_plays_one_panel_over_1_and_2_processes(policy, panels):
    one, two = panels[1][policy], panels[2][policy]
    assert sorted(one["by_seed"]) == sorted(two["by_seed"]) == held_out_seeds(EPISODES, 0, 1)
    assert two["by_seed"] == one["by_seed"]  # the same results, task by task, bit for bit
    assert two["metrics"] == one["metrics"]
    shared = set(one["answers"]) & set(two["answers"])
    assert shared and all(one["answers"][p] == two["answers"][p] for p in shared)  # the same answer per prompt
    if policy == "observation":  # the check has teeth: tasks differ in outcome
        assert len({tuple(r) for r in one["by_seed"].values()}) > 1


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
