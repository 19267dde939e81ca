"""Per-iteration metrics: one JSON line each in ``metrics.jsonl``, the same scalars in TensorBoard (and W&B).

Each line is appended by a single ``write`` and fsynced, so a crash leaves at most a torn last line; a resumed
run drops that line with a warning (a damaged line before the last is an error naming it). Every file is written
through ``arena_train.safe_files``: a symbolic link in the run folder is replaced or refused, never followed.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from arena_train.dist import global_mean, global_sum
from arena_train.safe_files import append_line, atomic_write_text


def read_metric_lines(path: Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl``; a torn last line (a crash mid-write) is dropped with a warning."""
    text = path.read_text()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "iteration" not in record:
                raise ValueError("not an iteration record")
        except ValueError as err:
            if number == len(lines) and not text.endswith("\n"):
                print(f"warning: {path}: dropping the torn last line {number} ({line[:60]!r}...)", flush=True)
                break
            raise SystemExit(f"error: {path} line {number} is damaged ({err}); repair or delete that line") from None
        records.append(record)
    return records


def wandb_problem() -> str | None:
    """Why ``--track`` cannot log to Weights & Biases here (one line with the install command), or None; checked
    before the run folder exists, so the rerun after installing it is not refused as a second run."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        return ('error: --track logs to Weights & Biases, which is not installed: pip install -e ".[wandb]" '
                '(or drop --track)')
    return None


class MetricsLogger:
    """Writes ``{"iteration": i, **metrics}`` lines to ``<run_dir>/metrics.jsonl`` and TensorBoard events to
    ``<run_dir>/tb``, and ``record`` (default ``config``) to ``args.json``. A run resumed at ``start_iteration``
    drops the lines logged at or after it. W&B is used when ``wandb_project`` is given (``run_name`` and
    ``config`` describe the run there)."""

    def __init__(self, run_dir: Path, start_iteration: int, wandb_project: str | None = None, run_name: str = "",
                 config: dict[str, Any] | None = None, record: dict[str, Any] | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.path, self.run_dir = run_dir / "metrics.jsonl", run_dir
        self.logged = 0  # lines logged by this process: a start that logged none left nothing worth keeping
        record = config if record is None else record  # a resumed run's record keeps its start values
        if record is not None:  # what the run was started with, beside its metrics
            atomic_write_text(run_dir / "args.json", json.dumps(record, indent=1))
        if self.path.exists():  # a resumed run drops lines logged after its checkpoint
            kept = [r for r in read_metric_lines(self.path) if r["iteration"] < start_iteration]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self.writer = SummaryWriter(str(run_dir / "tb"), purge_step=start_iteration)
        self.wandb = None
        if wandb_project is not None:
            import wandb

            self.wandb = wandb.init(project=wandb_project, name=run_name, config=config, resume="allow")

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        append_line(self.path, (json.dumps({"iteration": iteration, **metrics}) + "\n").encode())
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, iteration)
        if self.wandb is not None:
            self.wandb.log(metrics, step=iteration)
        self.logged += 1

    def close(self, summary: dict[str, Any] | None = None) -> None:
        """Flush the writers; ``summary`` (the finished run's facts) goes to ``summary.json``, which marks the run
        as finished for ``eval.sweep``."""
        if summary is not None:
            atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=1))
        self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def iteration_metrics(accelerator, *, episodes: list, rows: list, stats: dict[str, float],
                      actor_sums: dict[str, list[float]], grad_norms: list[float], skipped: int, update_tokens: int,
                      t_rollout: float, t_update: float, count_keys: tuple[str, ...] = ()) -> dict[str, float]:
    """The ``rollout/*``, ``actor/*`` and ``perf/*`` metrics every script logs (docs/metrics.md), pooled over the
    processes; ``actor_sums`` holds per-micro-batch values, summed for ``count_keys`` and averaged otherwise."""
    out = {
        "rollout/success_rate": global_mean(accelerator, [float(e.won) for e in episodes]),
        "rollout/episode_return": global_mean(accelerator, [e.env_return for e in episodes]),
        "rollout/episode_length": global_mean(accelerator, [float(e.length) for e in episodes]),
        "rollout/valid_format_ratio": global_mean(accelerator, [float(r.format_ok) for r in rows]),
        "rollout/valid_action_ratio": global_mean(accelerator, [float(r.action_is_valid) for r in rows]),
        "rollout/response_length": global_mean(accelerator, [float(len(r.response_ids)) for r in rows]),
        "rollout/num_rows": global_sum(accelerator, len(rows)),
        "rollout/dropped_history": global_sum(accelerator, stats["dropped_history"]),
        "rollout/truncated_prompts": global_sum(accelerator, stats["truncated_prompts"]),
        "rollout/advantage_abs": global_mean(accelerator, [float(np.mean(np.abs(r.advantage))) for r in rows]),
    }
    out.update(stop_metrics(accelerator, stats))
    for key, values in actor_sums.items():
        out[f"actor/{key}"] = (global_sum(accelerator, sum(values)) if key in count_keys
                               else global_mean(accelerator, values))
    out["actor/grad_norm"] = global_mean(accelerator, grad_norms)
    out["actor/skipped_updates"] = float(skipped)
    gen_time = max(t_rollout - stats["time_score"], 1e-9)
    out.update({
        "perf/rollout_tokens_per_s": global_sum(accelerator, stats["gen_tokens"]) / gen_time,
        "perf/update_tokens_per_s": global_sum(accelerator, update_tokens) / max(t_update, 1e-9),
        "perf/time_rollout_s": t_rollout,
        "perf/time_update_s": t_update,
        "perf/time_score_s": stats["time_score"],
    })
    return out


#: Failure-policy counts of a rollout (``arena_train.rollout.collect_rows``), logged as ``rollout/<key>``.
FAILURE_COUNTS = ("env_errors", "retried_groups", "dropped_groups")


def stop_metrics(accelerator, stats: dict[str, float]) -> dict[str, float]:
    """``stop/<reason>`` (fraction of turns), ``stop/episode/<reason>`` (fraction of episodes) and the failure
    counts ``rollout/env_errors``, ``rollout/retried_groups``, ``rollout/dropped_groups`` from the counts
    ``collect_rows`` adds to ``stats``, pooled over the processes in one reduction (nan without turns)."""
    import torch

    from arena_train.rows import EPISODE_STOPS, TURN_STOPS

    keys = ([f"stop/{r}" for r in TURN_STOPS] + [f"stop/episode/{r}" for r in EPISODE_STOPS]
            + list(FAILURE_COUNTS))
    t = torch.tensor([float(stats.get(k, 0.0)) for k in keys], dtype=torch.float64, device=accelerator.device)
    totals = dict(zip(keys, accelerator.reduce(t, reduction="sum").tolist()))
    turns = sum(totals[f"stop/{r}"] for r in TURN_STOPS)
    episodes = sum(totals[f"stop/episode/{r}"] for r in EPISODE_STOPS)
    out = {}
    for r in TURN_STOPS:
        out[f"stop/{r}"] = totals[f"stop/{r}"] / turns if turns else float("nan")
    for r in EPISODE_STOPS:
        out[f"stop/episode/{r}"] = totals[f"stop/episode/{r}"] / episodes if episodes else float("nan")
    for k in FAILURE_COUNTS:
        out[f"rollout/{k}"] = totals[k]
    return out


def pooled_means(accelerator, values: dict[str, list[float]], sums: Collection[str] = ()) -> dict[str, float]:
    """``global_mean`` of every list of ``values`` (``global_sum`` for the keys in ``sums``) in one reduction of
    (sum, count) pairs; every process must pass the same keys in the same order, empty lists included."""
    import torch

    t = torch.tensor([[float(np.sum(v)) if v else 0.0, float(len(v))] for v in values.values()],
                     dtype=torch.float64, device=accelerator.device).reshape(-1, 2)
    totals = accelerator.reduce(t, reduction="sum").tolist()
    return {key: total if key in sums else (total / count if count else float("nan"))
            for key, (total, count) in zip(values, totals)}


def env_metrics(accelerator, names: Sequence[str], *, episodes: list, rows: list) -> dict[str, float]:
    """``env/<name>/...`` for every env of a mixture (``arena_train.mixture``; rows and episodes carry ``env``):
    the per-env counterparts of ``iteration_metrics``' ``rollout/*`` (docs/metrics.md), pooled over the processes.
    An env with no episode this iteration logs nan (``num_rows`` 0)."""
    values: dict[str, list[float]] = {}
    for name in names:
        mine = [e for e in episodes if e.env == name]
        own = [r for r in rows if r.env == name]
        values.update({
            f"env/{name}/success_rate": [float(e.won) for e in mine],
            f"env/{name}/episode_return": [e.env_return for e in mine],
            f"env/{name}/episode_length": [float(e.length) for e in mine],
            f"env/{name}/valid_format_ratio": [float(r.format_ok) for r in own],
            f"env/{name}/valid_action_ratio": [float(r.action_is_valid) for r in own],
            f"env/{name}/response_length": [float(len(r.response_ids)) for r in own],
            f"env/{name}/advantage_abs": [float(np.mean(np.abs(r.advantage))) for r in own],
            f"env/{name}/num_rows": [1.0] * len(own),
        })
    return pooled_means(accelerator, values, sums=[f"env/{name}/num_rows" for name in names])
