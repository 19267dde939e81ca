"""Generate and validate ALFWorld games: one per slot (split, task type, k) of the generated splits.

    python -m arena_envs.alfworld_env.build --cache --splits train --workers 8   # fill the cache ahead
    python -m arena_envs.alfworld_env.build --committed --per-task 2 --workers 2  # extend data/*.jsonl.gz
    python -m arena_envs.alfworld_env.build --out DIR --splits valid_seen          # official layout under DIR

A slot's game is the first of a fixed seed sequence that ALFWorld's planner solves from the initial
state (never already a goal state) in at most ``max_steps`` and whose plan wins on replay. The
planner runs in a child process stopped after ``PLANNER_TIMEOUT_S``, a guard against pathological
searches (on full scenes plans take 2-40 s on a loaded 2-core machine, 5 s typical).
"""

from __future__ import annotations

import argparse
import gzip
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from arena_envs.alfworld_env.games import DATA_DIR, OFFICIAL_SIZES, GeneratedGames, read_committed
from arena_envs.alfworld_env.slots import COMMITTED_PER_TASK, SPLITS, build_game
from arena_envs.alfworld_env.trial import write_trial


def _slots(split: str, per_task: int | None) -> list[tuple[str, int]]:
    return [(t, k) for t, n in OFFICIAL_SIZES[split].items() for k in range(min(n, per_task or n))]


def _cache_one(split: str, task_type: str, k: int, cache_dir: str | None) -> None:
    games = GeneratedGames(split, [task_type], Path(cache_dir) if cache_dir else None)
    _ = games[k]


def commit_round_robin(splits: list[str], per_task: int, workers: int) -> None:
    """Extend the committed records: slot k of every split and task type before slot k + 1, each record
    appended (a gzip member) as soon as it is validated, so an interrupted run keeps its games."""
    done = {split: {tuple(r["slot"]) for r in read_committed(split)} for split in splits}
    todo = [(split, t, k) for k in range(per_task) for split in splits for t, n in OFFICIAL_SIZES[split].items()
            if k < n and (t, k) not in done[split]]
    with ProcessPoolExecutor(workers) as pool:
        for record, (split, _, _) in zip(pool.map(build_game, *zip(*todo)), todo):
            with gzip.open(DATA_DIR / f"{split}.jsonl.gz", "at", compresslevel=9) as f:
                f.write(json.dumps(record) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--committed", action="store_true", help="extend the committed records in the package")
    mode.add_argument("--cache", action="store_true", help="generate every game of the splits into the cache")
    mode.add_argument("--out", type=Path, help="write games in the official layout under OUT/json_2.1.1")
    ap.add_argument("--splits", nargs="+", default=list(SPLITS), choices=list(SPLITS))
    ap.add_argument("--per-task", type=int, default=None, help="first N slots per task type (default: all)")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)
    if args.committed:
        commit_round_robin(args.splits, args.per_task or COMMITTED_PER_TASK, args.workers)
        return
    with ProcessPoolExecutor(args.workers) as pool:
        for split in args.splits:
            slots = _slots(split, args.per_task)
            if args.cache:
                list(pool.map(_cache_one, [split] * len(slots), *zip(*slots), [args.cache_dir] * len(slots)))
                continue
            for r in pool.map(build_game, [split] * len(slots), *zip(*slots)):
                td = r["traj_data"]
                write_trial(args.out / "json_2.1.1" / split / f"{r['slot'][0]}-{r['slot'][1]:04d}" / td["task_id"],
                            r["problem"], td, r["walkthrough"])


if __name__ == "__main__":
    main()
