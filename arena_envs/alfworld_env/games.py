"""ALFWorld game files: the official ``json_2.1.1`` layout and our committed generated sets.

A game is a trial directory holding ``game.tw-pddl`` (JSON: domain, grammar with the task
sentence, problem, ``solvable``, ``walkthrough``) and ``traj_data.json`` (task type and
``pddl_params``; ALFWorld's handcoded expert reads it from next to the game file). The
committed sets store only problem + traj data (gzipped JSON lines); the domain and grammar
come from the installed ``alfworld`` package when a game is written to the cache directory.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

from arena_envs.alfworld_env.generator import TASK_TYPES

DATA_DIR = Path(__file__).parent / "data"
#: Split names -> split folder; the AlfredTWEnv names are aliases. Generated sets: train floor
#: plans for train and valid_seen, held-out floor plans for valid_unseen.
SPLITS = {"train": "train", "valid_seen": "valid_seen", "valid_unseen": "valid_unseen",
          "eval_in_distribution": "valid_seen", "eval_out_of_distribution": "valid_unseen"}


def default_cache_dir() -> Path:
    root = os.environ.get("ARENA_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "arlarena")
    return Path(root) / "alfworld"


def game_logic() -> tuple[str, str]:
    """(domain, grammar template) shipped with the ``alfworld`` wheel."""
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    return Path(ALFRED_PDDL_PATH).read_text(), Path(ALFRED_TWL2_PATH).read_text()


def task_sentence(traj_data: dict) -> str:
    """The goal text ALFWorld puts into the grammar (templated, from the first annotation)."""
    desc = traj_data["turk_annotations"]["anns"][0]["task_desc"]
    return desc[0].lower() + desc[1:].rstrip(".")


def write_trial(trial_dir: Path, problem: str, traj_data: dict, walkthrough: list[str] | None,
                logic: tuple[str, str] | None = None) -> Path:
    """Write a trial directory in the official layout; return the ``game.tw-pddl`` path."""
    domain, grammar = logic or game_logic()
    trial_dir.mkdir(parents=True, exist_ok=True)
    game = {"pddl_domain": domain, "grammar": grammar.replace("UNKNOWN GOAL", task_sentence(traj_data)),
            "pddl_problem": problem, "solvable": walkthrough is not None, "walkthrough": walkthrough or []}
    (trial_dir / "initial_state.pddl").write_text(problem)
    (trial_dir / "traj_data.json").write_text(json.dumps(traj_data, indent=1))
    tmp = trial_dir / "game.tw-pddl.tmp"
    tmp.write_text(json.dumps(game))
    os.replace(tmp, trial_dir / "game.tw-pddl")  # atomic: concurrent workers never read half a file
    return trial_dir / "game.tw-pddl"


def read_committed(split: str) -> list[dict]:
    """Records ``{problem, traj_data, walkthrough}`` of a committed generated split."""
    path = DATA_DIR / f"{split}.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def committed_games(split: str, task_types: list[str], cache_dir: Path | None = None) -> list[str]:
    """Game files of a committed split, written once into the cache (keyed by content hash)."""
    records = [r for r in read_committed(SPLITS[split]) if r["traj_data"]["task_type"] in task_types]
    logic = None
    root = (cache_dir or default_cache_dir()) / "json_generated" / SPLITS[split]
    files = []
    for rec in records:
        td = rec["traj_data"]
        digest = hashlib.sha1(rec["problem"].encode()).hexdigest()[:10]
        trial = root / f"{td['task_type']}-{td['pddl_params']['object_target']}" / f"{td['task_id']}-{digest}"
        path = trial / "game.tw-pddl"
        if not path.exists():
            logic = logic or game_logic()
            write_trial(trial, rec["problem"], td, rec["walkthrough"], logic)
        files.append(str(path))
    return files


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


def official_games(root: Path, split: str, task_types: list[str]) -> list[str]:
    """Solvable games of an official split, selected exactly as ``AlfredTWEnv`` does, sorted."""
    files = []
    for dirpath, _, names in os.walk(root / SPLITS[split]):
        if "traj_data.json" not in names or "game.tw-pddl" not in names:
            continue
        if "movable" in dirpath or "Sliced" in dirpath:
            continue
        with open(os.path.join(dirpath, "traj_data.json")) as f:
            if json.load(f)["task_type"] not in task_types:
                continue
        with open(os.path.join(dirpath, "game.tw-pddl")) as f:
            if not json.load(f).get("solvable", False):
                continue
        files.append(os.path.join(dirpath, "game.tw-pddl"))
    return sorted(files)


def task_type_names(task_types) -> list[str]:
    """Accept ids 1-6 or names; return names."""
    out = []
    for t in task_types:
        name = TASK_TYPES.get(t, t) if isinstance(t, int) else t
        if name not in TASK_TYPES.values():
            raise ValueError(f"unknown ALFWorld task type {t!r}")
        out.append(name)
    return out
