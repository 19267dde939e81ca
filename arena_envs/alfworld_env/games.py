"""ALFWorld game files: the official ``json_2.1.1`` layout and our generated splits.

A game is a trial directory holding ``game.tw-pddl`` (JSON: domain, grammar with the task
sentence, problem, ``solvable``, ``walkthrough``) and ``traj_data.json`` (task type and
``pddl_params``; ALFWorld's handcoded expert reads it from next to the game file). The
committed records store only problem + traj data (gzipped JSON lines); the domain and grammar
come from the installed ``alfworld`` package when a game is written to the cache directory.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Sequence
from pathlib import Path

from arena_envs.alfworld_env.generator import TASK_TYPES
from arena_envs.alfworld_env.trial import write_trial

DATA_DIR = Path(__file__).parent / "data"
#: Split names -> split folder; the AlfredTWEnv names are aliases. Generated splits: train floor
#: plans for train and valid_seen (other seeds), held-out floor plans for valid_unseen.
SPLITS = {"train": "train", "valid_seen": "valid_seen", "valid_unseen": "valid_unseen",
          "eval_in_distribution": "valid_seen", "eval_out_of_distribution": "valid_unseen"}


def default_cache_dir() -> Path:
    root = os.environ.get("ARENA_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "arlarena")
    return Path(root) / "alfworld"


#: Games per task type of the official ``json_2.1.1`` splits (ALFWorld, Shridhar et al. 2021, table 1:
#: 3,553 / 140 / 134); the generated splits have exactly these sizes.
OFFICIAL_SIZES = {
    "train": dict(zip(TASK_TYPES.values(), (790, 308, 650, 459, 533, 813))),
    "valid_seen": dict(zip(TASK_TYPES.values(), (35, 13, 27, 16, 25, 24))),
    "valid_unseen": dict(zip(TASK_TYPES.values(), (24, 18, 31, 23, 21, 17))),
}
#: Cache folder of the generated games (bump when the generator changes what a slot holds).
GENERATED_DIR = "generated-v2"


def read_committed(split: str) -> list[dict]:
    """Records ``{slot: [task type, k], problem, traj_data, walkthrough}`` committed for a generated split."""
    path = DATA_DIR / f"{split}.jsonl.gz"
    if not path.exists():
        return []
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


class GeneratedGames(Sequence):
    """The generated games of a split, sized like the official split; game ``i`` is a slot (task type, k).

    A slot's game is deterministic (``slots.build_game``: the first generated game that ALFWorld's planner
    solves). It is written to the cache on first use: from the committed records when the package ships
    it (all of ``valid_seen`` / ``valid_unseen``, the first game per task type of ``train``), otherwise generated and
    validated then (seconds per game; ``python -m arena_envs.alfworld_env.build --cache`` fills a cache ahead).
    """

    def __init__(self, split: str, task_types: list[str], cache_dir: Path | None = None, per_task: int | None = None):
        self.split = SPLITS[split]
        sizes = {t: n if per_task is None else min(n, per_task) for t, n in OFFICIAL_SIZES[self.split].items()}
        self.slots = [(t, k) for t in task_types for k in range(sizes[t])]
        self.root = (cache_dir or default_cache_dir()) / GENERATED_DIR / self.split
        self._committed: dict[tuple[str, int], dict] | None = None

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        task_type, k = self.slots[index]
        path = self.root / task_type / f"{k:04d}" / "game.tw-pddl"
        if not path.exists():
            rec = self.committed().get((task_type, k))
            if rec is None:
                from arena_envs.alfworld_env.slots import build_game

                rec = build_game(self.split, task_type, k)
            write_trial(path.parent, rec["problem"], rec["traj_data"], rec["walkthrough"])
        return str(path)

    def task_type(self, index: int) -> str:
        return self.slots[index][0]

    def committed(self) -> dict[tuple[str, int], dict]:
        if self._committed is None:
            self._committed = {tuple(r["slot"]): r for r in read_committed(self.split)}
        return self._committed


def find_data_root(data_path: str | os.PathLike | None) -> Path | None:
    """The official ``json_2.1.1`` folder from ``data_path`` or ``$ALFWORLD_DATA``, if present."""
    candidates = [data_path] if data_path is not None else [os.environ.get("ALFWORLD_DATA")]
    for cand in candidates:
        if not cand:
            continue
        p = Path(os.path.expandvars(str(cand))).expanduser()
        for root in (p, p / "json_2.1.1"):
            if any((root / s).is_dir() for s in ("train", "valid_seen", "valid_unseen")):
                return root
    if data_path is not None:
        raise FileNotFoundError(f"no ALFWorld split folders (train/valid_seen/valid_unseen) under {data_path}")
    return None


def official_games(root: Path, split: str, task_types: list[str], per_task: int | None = None) -> list[str]:
    """Solvable games of an official split, selected exactly as ``AlfredTWEnv`` does, sorted (the first
    ``per_task`` of each task type if given)."""
    files = []
    for dirpath, _, names in os.walk(root / SPLITS[split]):
        if "traj_data.json" not in names or "game.tw-pddl" not in names:
            continue
        if "movable" in dirpath or "Sliced" in dirpath:
            continue
        with open(os.path.join(dirpath, "traj_data.json")) as f:
            task_type = json.load(f)["task_type"]
        if task_type not in task_types:
            continue
        with open(os.path.join(dirpath, "game.tw-pddl")) as f:
            if not json.load(f).get("solvable", False):
                continue
        files.append((task_type, os.path.join(dirpath, "game.tw-pddl")))
    taken: dict[str, int] = {}
    out = []
    for task_type, path in sorted(files, key=lambda item: item[1]):
        if per_task is None or taken.get(task_type, 0) < per_task:
            taken[task_type] = taken.get(task_type, 0) + 1
            out.append(path)
    return out


def task_type_names(task_types) -> list[str]:
    """Accept ids 1-6 or names; return names."""
    out = []
    for t in task_types:
        name = TASK_TYPES.get(t, t) if isinstance(t, int) else t
        if name not in TASK_TYPES.values():
            raise ValueError(f"unknown ALFWorld task type {t!r}")
        out.append(name)
    return out
