"""Episode records: what one episode looked like, turn by turn, as one JSON line (docs/metrics.md "Episode records").

A record holds the env id and split, the task seed, the episode's group and its index within the group
(``sample``), the iteration, and per turn the text the model saw that was new this turn, its response, the parsed
action, whether format and action were valid, the env reward, the turn's stop reason and, for training episodes,
the advantage the update gave the turn; then the episode's return, ``won`` and its stop reason.

Text is bounded per turn (``TURN_TEXT_CHARS`` per field, the cut marked) and per file (``FILE_BYTES``: the last
episodes lose their texts, then their turns, marked ``"cut"``; no episode is ever left out, so a held-out file
holds every outcome of its evaluation); a file is written whole, atomically, never through a symbolic link
(``arena_train.safe_files``), so a reader never sees half of one.

How the records are made without a second pass over the rollout: ``TurnTap`` stands in for a
``wrappers.GroupRollout`` and keeps a reference to every ``Turn`` its ``step`` returns (the texts already exist;
nothing is decoded or copied), and the rows ``collect_rows`` returns give each turn's stop reason and, once the
script has filled them, its advantage. Sampling never sees the tap: the rows a run trains on stay the same.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from arena_train.safe_files import atomic_write_text

#: Version of the record layout (a reader checks it).
SCHEMA = 1
#: Characters kept of each text field of a turn (a message, the response); the rest is cut and the cut marked.
TURN_TEXT_CHARS = 4000
#: Bytes of one episodes file the texts may fill: past them the last episodes are cut (``encode_records``).
FILE_BYTES = 4_000_000
#: The run folder's subfolder of episode files: ``train_<iteration>.jsonl`` and ``eval_<iteration>.jsonl``.
EPISODES_DIR = "episodes"


def clip_text(text: str | None, limit: int = TURN_TEXT_CHARS) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with the number of characters left out."""
    text = "" if text is None else str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit} more characters cut]"


def new_messages(messages: Sequence[dict[str, str]], previous: Sequence[dict[str, str]] | None
                 ) -> list[dict[str, str]]:
    """The messages of this turn's prompt that the model had not seen in the previous turn's prompt: all of them on
    the first turn, then those that differ from the message at the same place before (the unchanged system
    prompt is not repeated every turn); each content bounded by ``clip_text``."""
    previous = previous or []
    return [{"role": str(m.get("role", "")), "content": clip_text(m.get("content", ""))}
            for k, m in enumerate(messages) if k >= len(previous) or previous[k] != m]


class TurnTap:
    """A ``wrappers.GroupRollout`` that also keeps the ``Turn`` objects its ``step`` returns (``turns``, by
    episode index; a replayed group's episodes keep their last attempt only). Everything else is the rollout's."""

    def __init__(self, rollout):
        self._rollout = rollout
        self.turns: dict[int, list[Any]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rollout, name)

    def reset(self, task_seeds: Sequence[int], groups: Sequence[int] | None = None) -> None:
        self._rollout.reset(task_seeds, groups)
        replayed = None if groups is None else set(groups)
        for episode in list(self.turns):
            if replayed is None or self._rollout.group_of(episode) in replayed:
                del self.turns[episode]

    def step(self, responses, max_turns: int | None = None) -> list[Any]:
        turns = self._rollout.step(responses, max_turns=max_turns)
        for turn in turns:
            self.turns.setdefault(turn.episode, []).append(turn)
        return turns


def _advantage(value: Any) -> float | None:
    """A row's (or a turn span's) advantage as one float: the mean over its tokens for a per-token array."""
    if value is None:
        return None
    mean = float(np.mean(value)) if isinstance(value, np.ndarray) else float(value)
    return mean if math.isfinite(mean) else None


def turn_rows(rows: Iterable[Any], id_offset: int) -> dict[tuple[int, int], tuple[Any, int | None]]:
    """(episode index without ``id_offset``, turn) -> (row, turn span index or None) for the rows of one
    ``collect_rows`` call: a "step" row is one turn, a "trajectory" row holds every turn of its episode."""
    found: dict[tuple[int, int], tuple[Any, int | None]] = {}
    for row in rows:
        episode = row.episode - id_offset
        if row.turns:
            for k in range(len(row.turns)):
                found[(episode, k)] = (row, k)
        else:
            found[(episode, row.turn)] = (row, None)
    return found


def turn_advantage(row: Any, span: int | None) -> float | None:
    """The advantage the update gave one turn: the row's, or the mean over the turn's span of a trajectory row."""
    if span is None:
        return _advantage(row.advantage)
    s = row.turns[span]
    value = row.advantage
    return _advantage(value[s.start:s.end] if isinstance(value, np.ndarray) and s.end > s.start else value)


def episode_record(*, env_id: str, split: str, source: str, stats: Any, group_size: int, turns: Sequence[Any],
                   rows: dict[tuple[int, int], tuple[Any, int | None]] | None = None, group: int | None = None,
                   episode: int | None = None, iteration: int | None = None) -> dict[str, Any]:
    """One episode's record from its ``wrappers.EpisodeStats`` (``stats``), its ``Turn`` objects and (optional)
    ``turn_rows`` for the turn stop reasons; advantages are filled later (``fill_advantages``). ``group`` /
    ``episode``: the ids the run's rows carry (default: the rollout's own)."""
    index = stats.episode
    out_turns, previous = [], None
    for turn in turns:
        row = (rows or {}).get((index, turn.turn))
        out_turns.append({
            "turn": turn.turn,
            "seen": new_messages(turn.messages, previous),
            "response": clip_text(turn.response),
            "action": None if turn.action is None else clip_text(turn.action),
            "format_ok": bool(turn.format_ok),
            "action_valid": bool(turn.action_is_valid),
            "reward": float(turn.env_reward),
            "format_penalty": float(turn.format_penalty),
            "stop": "env_error" if turn.env_error else (row[0].stop if row is not None else None),
            "advantage": None,
        })
        previous = turn.messages
    return {
        "schema": SCHEMA, "source": source, "iteration": iteration, "env_id": env_id, "split": split,
        "task_seed": int(stats.task_seed), "group": int(stats.group if group is None else group),
        "sample": int(index % group_size), "episode": int(index if episode is None else episode),
        "turns": out_turns, "return": float(stats.env_return), "episode_return": float(stats.episode_return),
        "length": int(stats.length), "won": bool(stats.won), "stop": stats.stop or None,
    }


def without_texts(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its turns' texts (what the model saw, its response) dropped, ``cut`` "texts"; the actions,
    flags, rewards and the outcome stay."""
    turns = [{**turn, "seen": [], "response": ""} for turn in record.get("turns", [])]
    return {**record, "turns": turns, "cut": "texts"}


def without_turns(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` without its turns, ``cut`` "turns": the episode's ids, length, return and outcome only."""
    return {**record, "turns": [], "cut": "turns"}


def _line(record: dict[str, Any]) -> str:
    return json.dumps(finite(record), ensure_ascii=False, allow_nan=False) + "\n"


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float as None (JSON's null): a record is written whatever an env
    returned, instead of the run dying in ``json.dumps`` before its checkpoint."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def encode_records(records: Iterable[dict[str, Any]], max_bytes: int = FILE_BYTES) -> tuple[str, int]:
    """JSON lines of every record of ``records`` -> (text, records cut). Over ``max_bytes`` in all, the last
    records lose their turn texts (``without_texts``), then their turns (``without_turns``), until the file fits or
    every record is cut: an episode is never left out, so whatever reads the file (the run's verdict) counts every
    episode played."""
    records = list(records)
    lines = [_line(r) for r in records]
    size = sum(len(line.encode()) for line in lines)
    cut = 0
    for shrink in (without_texts, without_turns):
        for k in reversed(range(len(records))):
            if size <= max_bytes:
                return "".join(lines), cut
            records[k] = shrink(records[k])
            line = _line(records[k])
            size += len(line.encode()) - len(lines[k].encode())
            lines[k] = line
            cut += shrink is without_texts
    return "".join(lines), cut


def write_episodes(path: Path, records: Sequence[dict[str, Any]], max_bytes: int = FILE_BYTES,
                   inside: Path | None = None) -> int:
    """Write ``records`` to ``path`` atomically (``arena_train.safe_files``: nothing is written through a link;
    ``inside``: the folder the file must stay in) -> how many were written: all of them, the last ones cut over
    ``max_bytes`` (``encode_records``, with a warning)."""
    text, cut = encode_records(records, max_bytes)
    atomic_write_text(path, text, inside)
    if cut:
        print(f"warning: {path}: the texts of {cut} of {len(records)} episodes were cut (over {max_bytes} bytes); "
              f"every episode's outcome is kept", flush=True)
    return len(records)


def read_episodes(path: Path) -> list[dict[str, Any]]:
    """The records of one episodes file, or of every ``*.jsonl`` in a folder (sorted by name); a record of another
    schema version is an error naming the file."""
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    records = []
    for file in files:
        for number, line in enumerate(file.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            if record.get("schema") != SCHEMA:
                raise SystemExit(f"error: {file} line {number} is not an episode record of schema {SCHEMA}")
            records.append(record)
    return records


def episode_file(run_dir: Path, source: str, iteration: int) -> Path:
    """``<run>/episodes/<source>_<iteration, 6 digits>.jsonl``."""
    return run_dir / EPISODES_DIR / f"{source}_{iteration:06d}.jsonl"


def file_iteration(path: Path) -> int | None:
    """The iteration in an episode file's name, or None for another file."""
    stem = path.stem.rpartition("_")[2]
    return int(stem) if stem.isdigit() else None


class EpisodeRecorder:
    """This process's episode records between two ``flush`` calls: the first ``train_episodes`` training episodes
    of an iteration (``MixtureRollout.collect``; their advantages are read at ``flush``, after the update filled
    them) and every held-out episode (``MixtureRollout.evaluate``)."""

    def __init__(self, train_episodes: int):
        self.train_episodes = max(int(train_episodes), 0)
        self._train: list[tuple[dict[str, Any], list[tuple[Any, int | None] | None]]] = []
        self._eval: list[dict[str, Any]] = []

    @property
    def train_wanted(self) -> int:
        """Training episodes still to record this iteration."""
        return self.train_episodes - len(self._train)

    def add_train(self, *, env_id: str, split: str, tap: TurnTap, episodes: Sequence[Any], rows: Sequence[Any],
                  id_offset: int, group_size: int) -> None:
        """Record the first ``train_wanted`` of ``episodes`` (``collect_rows``' episodes of ``tap``'s rollout,
        ids without the offset), keeping references to their rows for the advantages."""
        by_turn = turn_rows(rows, id_offset)
        for stats in list(episodes)[:max(self.train_wanted, 0)]:
            turns = tap.turns.get(stats.episode, [])
            record = episode_record(env_id=env_id, split=split, source="train", stats=stats, group_size=group_size,
                                    turns=turns, rows=by_turn, group=stats.group + id_offset,
                                    episode=stats.episode + id_offset)
            self._train.append((record, [by_turn.get((stats.episode, t.turn)) for t in turns]))

    def add_eval(self, records: Iterable[dict[str, Any]]) -> None:
        self._eval.extend(records)

    def take(self, iteration: int) -> dict[str, list[dict[str, Any]]]:
        """The records since the last call, by source ("train", "eval"), stamped with ``iteration``; training turns
        get their advantages now."""
        train = []
        for record, rows in self._train:
            for turn, found in zip(record["turns"], rows):
                turn["advantage"] = None if found is None else turn_advantage(*found)
            train.append(record)
        out = {"train": train, "eval": self._eval}
        for records in out.values():
            for record in records:
                record["iteration"] = iteration
        self._train, self._eval = [], []
        return out

    def flush(self, run_dir: Path, iteration: int) -> None:
        """Write the records since the last flush to ``episode_file(run_dir, source, iteration)``."""
        for source, records in self.take(iteration).items():
            if records:
                write_episodes(episode_file(run_dir, source, iteration), records, inside=run_dir)
