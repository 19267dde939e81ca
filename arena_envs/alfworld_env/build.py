"""Generate and validate ALFWorld game sets (the committed ones, or larger ones on disk).

    python -m arena_envs.alfworld_env.build --committed            # rewrites data/*.jsonl.gz
    python -m arena_envs.alfworld_env.build --out DIR --per-task 50  # official layout under DIR/json_2.1.1

Every game is kept only if ALFWorld's planner finds a plan from the initial state (which is
never already a goal state) and replaying that plan in the engine wins within ``max_steps``.
The planner runs in a child process stopped after ``PLANNER_TIMEOUT_S`` (a guard against
pathological searches; with the generator's capped distractors plans take 0.01-5 s).
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

import numpy as np

from arena_envs.alfworld_env.engine import make_engine, planner_plan
from arena_envs.alfworld_env.games import DATA_DIR, game_logic, write_trial
from arena_envs.alfworld_env.generator import TASK_TYPES, floor_plans, generate

#: split -> (floor plans, seed offset); valid_seen reuses train floor plans with other seeds.
SPLITS = {"train": ("train", 0), "valid_seen": ("train", 1_000_000), "valid_unseen": ("unseen", 2_000_000)}
COMMITTED_PER_TASK = {"train": 12, "valid_seen": 3, "valid_unseen": 6}
PLANNER_TIMEOUT_S = 60.0


def validate(game_file: str, engine, max_steps: int = 50) -> list[str] | None:
    """The planner's plan if it is non-empty, at most ``max_steps`` long and wins on replay."""
    engine.load(game_file)
    state = engine.reset()
    if state["won"]:
        return None
    plan = planner_plan(engine)
    if not plan or len(plan) > max_steps:
        return None
    for command in plan:
        if command not in state["admissible_commands"]:
            return None
        state, _, done = engine.step(command)
    return plan if state["won"] else None


def _validate_child(game_file: str, queue) -> None:
    queue.put(validate(game_file, make_engine(expert=False)))


def validate_bounded(game_file: str, timeout_s: float = PLANNER_TIMEOUT_S) -> list[str] | None:
    """``validate`` in a child process; ``None`` if it does not finish within ``timeout_s``."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_validate_child, args=(game_file, queue), daemon=True)
    proc.start()
    try:
        return queue.get(timeout=timeout_s)
    except Exception:  # queue.Empty: the planner is still searching
        return None
    finally:
        proc.kill()
        proc.join()


def build_split(split: str, per_task: int, task_types=None, log=print):
    """Yield (problem, traj_data, walkthrough) for ``per_task`` validated games per task type."""
    scenes_name, offset = SPLITS[split]
    scenes = floor_plans(scenes_name)
    logic = game_logic()
    with tempfile.TemporaryDirectory() as tmp:
        for ti, task_type in enumerate(task_types or TASK_TYPES.values()):
            kept, seed = 0, offset
            while kept < per_task:
                seed += 1
                scene = scenes[np.random.default_rng([ti, seed]).integers(len(scenes))]
                game = generate(scene, task_type, seed)
                if game is None:
                    continue
                problem, traj_data = game
                t0 = time.time()
                path = write_trial(Path(tmp) / f"{task_type}_{seed}", problem, traj_data, None, logic)
                plan = validate_bounded(str(path))
                log(f"{split} {task_type} seed={seed} FloorPlan{scene}: "
                    f"{'ok' if plan else 'rejected'} ({len(plan or [])} steps, {time.time() - t0:.1f}s)")
                if plan:
                    kept += 1
                    yield problem, traj_data, plan


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--committed", action="store_true", help="rewrite the committed sets in the package")
    ap.add_argument("--out", type=Path, help="write games in the official layout under OUT/json_2.1.1")
    ap.add_argument("--splits", nargs="+", default=list(SPLITS))
    ap.add_argument("--per-task", type=int, default=None)
    args = ap.parse_args(argv)
    if not args.committed and args.out is None:
        ap.error("give --committed or --out")
    for split in args.splits:
        n = args.per_task or COMMITTED_PER_TASK[split]
        games = build_split(split, n)
        if args.committed:
            with gzip.open(DATA_DIR / f"{split}.jsonl.gz", "wt", compresslevel=9) as f:
                for problem, traj_data, plan in games:
                    f.write(json.dumps({"problem": problem, "traj_data": traj_data, "walkthrough": plan}) + "\n")
        else:
            logic = game_logic()
            for problem, traj_data, plan in games:
                task_dir = f"{traj_data['task_type']}-{traj_data['pddl_params']['object_target']}-" \
                           f"{traj_data['pddl_params']['parent_target'] or 'None'}-{traj_data['scene']['scene_num']}"
                write_trial(args.out / "json_2.1.1" / split / task_dir / traj_data["task_id"], problem, traj_data,
                            plan, logic)


if __name__ == "__main__":
    main()
