"""What episode records cost a rollout: ``MixtureRollout.collect`` with and without an ``EpisodeRecorder``, on the
cpu-tiny shapes (8 groups x 8 episodes, 10 turns, 12 response tokens, compact prompt) and a tiny random model.

Each round plays the same task seeds with the same sampling seed twice, once with records and once without (the
order alternates), so both play the same tokens; the paired difference is what the records cost. Writing the
iteration's records (``EpisodeRecorder.flush``: JSON, an fsynced file) is timed apart: a run does it in
``Run.log``, after the rollout.

    python benchmarks/bench_episode_records.py --rounds 12     # minutes on one CPU thread
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

import wrappers
from arena_models import build_tiny_model
from arena_train.backends import HFBackend
from arena_train.episodes import EpisodeRecorder
from arena_train.mixture import Mixture, MixtureRollout
from arena_train.models import load_model_and_tokenizer
from arena_train.rollout import RolloutConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--log-episodes", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench_records_"))
    model, tokenizer = load_model_and_tokenizer(
        str(build_tiny_model(work / "tiny", corpus=["Push every box (X) onto a target (O)."])), torch.float32)
    model.eval()
    mixture = Mixture.parse(["ARL/Sokoban-Mini-v0"])
    make_env = functools.partial(wrappers.make_env, history_length=0, format_penalty=0.1, prompt_style="compact")
    rollouts = MixtureRollout(mixture, make_env, 8, 8, 1)
    backend = HFBackend(model, tokenizer)
    config = RolloutConfig(max_turns=10, max_prompt_tokens=512, max_response_tokens=12, temperature=1.0, top_p=1.0)
    times: dict[str, list[float]] = {"off": [], "on": []}
    flush: list[float] = []
    for round_ in range(args.rounds):
        for mode in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
            rollouts.recorder = EpisodeRecorder(args.log_episodes) if mode == "on" else None
            torch.manual_seed(round_)
            start = time.perf_counter()
            rollouts.collect(backend, tokenizer, mixture.task_seeds(1, round_, 8, 0, 1), config, defaultdict(float))
            times[mode].append(time.perf_counter() - start)
            if mode == "on":
                start = time.perf_counter()
                rollouts.recorder.flush(work / "run", round_)
                flush.append(time.perf_counter() - start)
    rollouts.close()
    for mode, ts in times.items():
        print(f"records {mode}: rollout mean {statistics.mean(ts):.3f} s, median {statistics.median(ts):.3f} s "
              f"({len(ts)} rollouts)")
    diff = [a - b for a, b in zip(times["on"], times["off"])]
    print(f"paired difference (on - off): mean {1000 * statistics.mean(diff):+.1f} ms, "
          f"SD {1000 * statistics.stdev(diff):.1f} ms")
    sizes = [p.stat().st_size for p in (work / "run" / "episodes").glob("*.jsonl")]
    print(f"flush of {args.log_episodes} records: median {1000 * statistics.median(flush):.1f} ms; "
          f"{statistics.mean(sizes) / args.log_episodes / 1000:.1f} KB a record")


if __name__ == "__main__":
    main()
