"""Lockstep against overlapped turns (``--overlap-turns``): one training rollout (``collect_rows`` with episode
streams) of TextWorld (and ALFWorld with ``--envs``) with the tiny model, in 1 and 2 env workers, timed per side.

The tiny model's responses are not commands an engine would run (the env answers them without a step), so each
response is replaced by a plausible command (``bench_env_workers.COMMANDS``) chosen by its stream seed after the
model generated it: generation costs what the model costs, and every turn steps the engine.

Lockstep generates for every active episode, then steps every env, so its wall time is about generation + env
time. Overlapped, two cohorts alternate (one generates while the other's envs step), so at best the wall time is
max(generation, env time). Reported per run: wall time, the trainer's generation time (inside ``generate``), the
time it waited for the envs (inside ``GroupRollout.step``: envs stepping that generation did not hide) and the
resets; the env time is the lockstep run's wait (its envs step while nothing else runs), and each side's idle
share is 1 - its busy time / the turns' wall time. The rows of both modes are checked to have the same tokens.

    python benchmarks/bench_overlap.py --envs ARL/TextWorld-v0 --workers 1 2
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from bench_env_workers import COMMANDS, cpu_name  # benchmarks/ is the script's folder

import wrappers
from arena_train.rollout import RolloutConfig, collect_rows
from arena_train.streams import training_seed


class Timed:
    """A ``GroupRollout`` whose ``reset`` and ``step`` (the wait for the envs' results) are timed."""

    def __init__(self, rollout):
        self._rollout, self.seconds = rollout, defaultdict(float)

    def __getattr__(self, name):
        return getattr(self._rollout, name)

    def reset(self, *args, **kwargs):
        start = time.perf_counter()
        self._rollout.reset(*args, **kwargs)
        self.seconds["reset"] += time.perf_counter() - start

    def step(self, *args, **kwargs):
        start = time.perf_counter()
        turns = self._rollout.step(*args, **kwargs)
        self.seconds["env_wait"] += time.perf_counter() - start
        return turns


class CommandBackend:
    """The model generates (timed into ``seconds["generate"]``); each response is then replaced by the command
    ``commands[seed % len(commands)]`` of its stream seed, its scores cut or padded to the command's length."""

    def __init__(self, backend, tokenizer, commands: list[str], seconds):
        self.backend, self.seconds = backend, seconds
        self.commands = [tokenizer(wrappers.format_response(c), add_special_tokens=False)["input_ids"]
                         for c in commands]

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def generate_scored(self, prompts, *args, seeds, **kwargs):
        start = time.perf_counter()
        _, logps, entropies = self.backend.generate_scored(prompts, *args, seeds=seeds, **kwargs)
        self.seconds["generate"] += time.perf_counter() - start
        out = [list(self.commands[s % len(self.commands)]) for s in seeds]
        return out, [_fit(v, len(o)) for v, o in zip(logps, out)], [_fit(v, len(o)) for v, o in zip(entropies, out)]


def _fit(values: list[float], n: int) -> list[float]:
    """``values`` cut or zero-padded to ``n``."""
    return (values + [0.0] * n)[:n]


def cache_games(env_id: str, seeds: list[int], cache: str) -> None:
    """Reset one env in this process on ``seeds``, so that their games are generated into ``cache`` before any
    worker needs them: game generation (seconds per ALFWorld game) is not what the benchmark times."""
    env = wrappers.make_env(env_id, prompt_style="arlarena", split="train", cache_dir=cache)
    for seed in seeds:
        env.reset(seed=seed)
    env.close()


def rollout_once(backend, tokenizer, env_id: str, workers: int, overlap: bool, args, cache: str) -> dict:
    make = functools.partial(wrappers.make_env, env_id, history_length=2, prompt_style="arlarena", split="train",
                             cache_dir=cache)
    rollout = wrappers.GroupRollout(make, args.groups, args.group_size, workers=workers, env_id=env_id)
    config = RolloutConfig(max_turns=args.max_turns, max_prompt_tokens=2048,
                           max_response_tokens=args.max_response_tokens, temperature=1.0)
    seeds = list(range(args.groups))
    try:
        timed = Timed(rollout)
        backend = CommandBackend(backend, tokenizer, COMMANDS[env_id], timed.seconds)
        warmup = dataclasses.replace(config, max_turns=1)  # makes the envs, loads the games, runs the model once
        collect_rows(backend, tokenizer, rollout, seeds, warmup, defaultdict(float), sampling_seed=training_seed(0, 1))
        timed.seconds.clear()
        start = time.perf_counter()
        stats: dict[str, float] = defaultdict(float)
        rows, _ = collect_rows(backend, tokenizer, timed, seeds, config, stats, sampling_seed=training_seed(0, 1),
                               overlap=overlap)
        wall = time.perf_counter() - start
        if stats["env_errors"]:
            raise SystemExit(f"{env_id}: {stats['env_errors']:g} env errors, the timing would not be a rollout's")
    finally:
        rollout.close()
    s = timed.seconds
    return {"env": env_id, "workers": workers, "mode": "overlap" if overlap else "lockstep", "wall_s": wall,
            "reset_s": s["reset"], "turns_s": wall - s["reset"], "generate_s": s["generate"],
            "env_wait_s": s["env_wait"], "rows": len(rows), "valid_actions": sum(r.action_is_valid for r in rows),
            "tokens": [(r.episode, r.turn, r.response_ids) for r in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["ARL/TextWorld-v0"])
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-response-tokens", type=int, default=32)
    parser.add_argument("--model", default=None, help="model path (default: a fresh tiny model)")
    parser.add_argument("--out", default=None, help="JSON file for the results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arena_train.backends import HFBackend

    tmp = Path(tempfile.mkdtemp())
    if args.model is None:
        from arena_models import build_tiny_model

        args.model = str(build_tiny_model(tmp / "tiny"))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    backend = HFBackend(AutoModelForCausalLM.from_pretrained(args.model), tokenizer)
    print(f"CPU: {cpu_name()}; {args.groups} groups x {args.group_size}, {args.max_turns} turns, "
          f"{args.max_response_tokens} new tokens per turn, 1 torch thread")
    results = []
    for env_id in args.envs:
        cache_games(env_id, list(range(args.groups)), str(tmp / "games"))
        for workers in args.workers:
            pair = [rollout_once(backend, tokenizer, env_id, workers, overlap, args, str(tmp / "games"))
                    for overlap in (False, True)]
            assert pair[0].pop("tokens") == pair[1].pop("tokens"), "overlapped rows differ from lockstep's"
            env_s = pair[0]["env_wait_s"]  # lockstep: the envs step while nothing else runs
            for r in pair:
                turns = r["turns_s"]
                r["env_s"] = env_s
                r["gen_idle_share"] = 1 - r["generate_s"] / turns
                r["env_idle_share"] = 1 - env_s / turns
                r["vs_max"] = turns / max(r["generate_s"], env_s)
                results.append(r)
                print(f"{env_id} {workers} worker(s) {r['mode']:8s}: turns {turns:6.1f} s (reset {r['reset_s']:.1f} s)"
                      f", generate {r['generate_s']:5.1f} s, env {env_s:5.1f} s, waited for envs "
                      f"{r['env_wait_s']:5.1f} s, {r['rows']} rows; model idle {r['gen_idle_share']:.0%}, envs idle "
                      f"{r['env_idle_share']:.0%}; turns / max(gen, env) {r['vs_max']:.2f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"cpu": cpu_name(), "args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
