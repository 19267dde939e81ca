"""Reading a training run: ``metrics.jsonl`` plus whatever records who/what/where it was.

A run directory holds ``metrics.jsonl`` (one flat JSON object per iteration, names in
the README's metrics section), the script's argument record (``config.json``; older
or foreign runs may have ``args.json``) and, when started by ``eval.sweep``,
``sweep_run.json`` with the method / env / seed labels of the grid point. Labels are
taken from the most specific of these sources, so hand-started runs group too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

METRICS_FILE = "metrics.jsonl"
CONFIG_FILES = ("config.json", "args.json")
SWEEP_META_FILE = "sweep_run.json"

_METHOD_KEYS = ("method", "exp_name")
_ENV_KEYS = ("env_id", "env")


class RunLogError(ValueError):
    """A run directory that cannot be read (missing, or no metrics at all)."""


def _as_float(value: Any) -> float | None:
    """JSON value → float; ``None``/non-numeric → None, "nan"/"inf" strings → non-finite float."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass
class RunLog:
    """The parsed metrics of one run (rows in file order) and its labels."""

    run_dir: Path
    rows: list[dict[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    skipped_lines: int = 0

    @classmethod
    def load(cls, run_dir: str | Path) -> "RunLog":
        run_dir = Path(run_dir)
        path = run_dir / METRICS_FILE
        if not path.is_file():
            raise RunLogError(f"{run_dir}: no {METRICS_FILE} (is this a run directory?)")
        rows: list[dict[str, Any]] = []
        skipped = 0
        for line in path.read_text(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)  # accepts NaN / Infinity, as json.dumps writes them
            except ValueError:
                skipped += 1  # e.g. a line truncated by a crash mid-write
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                skipped += 1
        config = next((c for name in CONFIG_FILES if (c := _read_json(run_dir / name))), {})
        return cls(run_dir, rows, config, _read_json(run_dir / SWEEP_META_FILE), skipped)

    # --- labels ---------------------------------------------------------------------
    def _label(self, meta_key: str, config_keys: tuple[str, ...]) -> Any:
        if self.meta.get(meta_key) is not None:
            return self.meta[meta_key]
        return next((self.config[k] for k in config_keys if self.config.get(k) is not None), None)

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def method(self) -> str:
        return str(self._label("method", _METHOD_KEYS) or self.name.split("__")[0])

    @property
    def env(self) -> str:
        """The env id; a mixture run's ids joined by '+' (``--env-id`` is a list of one id or more)."""
        return "+".join(self.env_ids) or "unknown"

    @property
    def env_ids(self) -> list[str]:
        """The run's env ids: one, or every env of a mixture (``arena_train.mixture``)."""
        label = self._label("env", _ENV_KEYS)
        return [str(e) for e in label] if isinstance(label, list) else [str(label)] if label else []

    @property
    def seed(self) -> int | None:
        seed = self._label("seed", ("seed",))
        return int(seed) if isinstance(seed, (int, float)) and math.isfinite(seed) else None

    # --- series ---------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return any(_as_float(row.get(key)) is not None for row in self.rows)

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(iterations, values) of the rows that logged ``key``, sorted by iteration.

        NaN/inf are kept as logged (they are evidence). A resumed run re-logs the
        iterations after its checkpoint: the last line for an iteration wins.
        """
        by_iteration: dict[float, float] = {}
        for index, row in enumerate(self.rows):
            value = _as_float(row.get(key))
            if value is None:
                continue
            iteration = _as_float(row.get("iteration"))
            by_iteration[index if iteration is None or not math.isfinite(iteration) else iteration] = value
        its = sorted(by_iteration)
        return np.asarray(its, dtype=float), np.asarray([by_iteration[i] for i in its], dtype=float)
