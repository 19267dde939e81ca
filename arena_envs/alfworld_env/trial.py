"""The trial-directory format of ALFWorld games (``game.tw-pddl``, ``traj_data.json``, ``initial_state.pddl``).

The lowest layer of the generated games: :mod:`games` (the splits) and :mod:`slots` (building one
slot's game) both write trials through it, and it imports neither.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


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
    _write_atomic(trial_dir / "initial_state.pddl", problem)
    _write_atomic(trial_dir / "traj_data.json", json.dumps(traj_data, indent=1))
    _write_atomic(trial_dir / "game.tw-pddl", json.dumps(game))  # last: its presence marks a complete trial
    return trial_dir / "game.tw-pddl"


def _write_atomic(path: Path, text: str) -> None:
    """Concurrent workers writing the same game never read half a file, nor collide on one temporary name."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
