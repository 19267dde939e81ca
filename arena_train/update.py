"""The bookkeeping of a training script's update, so that its loop shows only the method's steps.

A script iterates ``Update.minibatches`` (one optimizer step each) and, inside, a ``MiniBatch``'s micro-batches
(one forward/backward each); it writes ``zero_grad``, the forward, its loss, ``backward``, the clip and ``step``
itself. This module does the rest, identically for every method:

- lockstep micro-batches: every process makes the same number of forward/backward calls, a padding pass reruns a
  real batch at weight 0 (``arena_train.batching.lockstep_micro_batches``);
- the loss's denominators over the whole mini-batch on all processes (``MiniBatch.counts``, ``loss_counts``), so
  a micro-batch's loss is its share of one big batch's loss;
- the rollout/trainer correction and its mismatch statistics (``arena_train.rollout_is``);
- the non-finite check over all processes before a step (a bad batch is skipped, never stepped);
- accounting for the iteration's metrics: loss terms as shares of their mini-batch's value, per-micro-batch
  statistics, counts, gradient norms, skipped steps, tokens and each env's importance ratios in a mixture.

A method declares its own numbers in its blocks, without editing this module: a loss term or a count in the
micro-batch's ``metrics`` as ``loss_term(value)`` / ``count(value)`` (the shared names in ``LOSS_METRICS`` and
``COUNT_METRICS`` are so by default; any other key is a per-micro-batch statistic, averaged), and any other
number of the iteration with ``update.statistic(key, value, reduce=...)``, reduced over the processes and logged
under ``key``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterator, Literal, Sequence

import numpy as np
import torch

from arena_train.batching import fill_old_logp, lockstep_micro_batches, loss_counts, make_batch
from arena_train.cli import EngineArgs
from arena_train.logger import env_metrics, iteration_metrics
from arena_train.mixture import EnvRatios
from arena_train.rollout import Row
from arena_train.rollout_is import pooled_mismatch, rollout_correction
from arena_train.sharding import micro_batch_sync

#: Per-micro-batch metrics that are counts (summed over the iteration), not averages.
COUNT_METRICS = ("masked_seqs",)
#: Per-micro-batch metrics that are terms of the loss: each is the micro-batch's share of its mini-batch's value.
LOSS_METRICS = ("pg_loss", "kl_ref", "entropy", "value_loss")


@dataclass(frozen=True)
class Declared:
    """A micro-batch metric with its kind declared where the loss is built (``loss_term``, ``count``)."""

    value: torch.Tensor | float
    kind: Literal["loss_term", "count"]


def loss_term(value: torch.Tensor | float) -> Declared:
    """Mark a micro-batch metric as a term of the loss (aggregated with the mini-batch's ``counts``, so each
    micro-batch's value is its share): logged as the mini-batch's value, the shares summed, averaged over the
    iteration's mini-batches (as ``LOSS_METRICS``)."""
    return Declared(value, "loss_term")


def count(value: torch.Tensor | float) -> Declared:
    """Mark a micro-batch metric as a count: summed over the iteration's micro-batches and processes (as
    ``COUNT_METRICS``)."""
    return Declared(value, "count")


@dataclass
class MicroBatch:
    """One forward/backward pass. ``rows`` is empty on a padding pass, which runs a real batch (``batch_rows``)
    at ``weight`` 0 so that every process makes the same calls; otherwise ``weight`` is the world size (DDP
    averages gradients over processes, and the losses are shares of the global sum)."""

    rows: list[Row]
    batch_rows: list[Row]
    batch: dict[str, torch.Tensor]
    last: bool
    weight: float
    accelerator: object

    def sync(self, models: Sequence[torch.nn.Module]):
        """Context of this pass: the last micro-batch of a mini-batch synchronises the gradients of ``models``."""
        return micro_batch_sync(self.accelerator, list(models), last=self.last)

    def fill_old_logp(self, logp: torch.Tensor) -> None:
        """The first mini-batch's rows were not scored before the update: their old log-probs are this forward's."""
        fill_old_logp(self.batch, logp, self.rows)


class MiniBatch:
    """One optimizer step's rows on this process; iterating it builds its micro-batches' padded batches."""

    def __init__(self, update: Update, rows: list[Row]):
        self.update, self.rows = update, rows
        u = update
        self._micro_rows, self._share = lockstep_micro_batches(u.accelerator, rows, u.micro_batch_size,
                                                               u.micro_batch_tokens)
        self.counts = loss_counts(u.accelerator, rows, u.max_len)  # one normaliser per optimizer step
        self._non_finite = 0.0
        self._loss_terms: dict[str, float] = defaultdict(float)

    def __iter__(self) -> Iterator[MicroBatch]:
        u, n = self.update, len(self._micro_rows)
        for k, (rows, share) in enumerate(zip(self._micro_rows, self._share)):
            batch_rows = rows or self._micro_rows[0] or u.rows[:1]  # padding: a real batch, weight 0
            yield MicroBatch(rows, batch_rows, make_batch(batch_rows, u.pad_id, u.device, share_prefix=share),
                             last=k == n - 1, weight=float(u.world) if rows else 0.0, accelerator=u.accelerator)

    def loss_counts(self, dropped: set[int]) -> dict[str, float]:
        """``counts`` with the rows whose ``id`` is in ``dropped`` left out of the loss (sequence masking)."""
        return loss_counts(self.update.accelerator, self.rows, self.update.max_len, dropped)

    def rollout_weights(self, micro: MicroBatch) -> torch.Tensor | None:
        """Per-token weights (B, T) of the policy loss for the rollout/trainer mismatch (None: no correction);
        the mismatch statistics of a real micro-batch go into ``rollout_is/*``."""
        u = self.update
        weights, stats = rollout_correction(micro.batch, micro.batch["mask"], u.rollout_is, u.rollout_is_cap,
                                            u.other_engine)
        for key, value in stats.items() if micro.rows else ():
            u.mismatch[key].append(value)
        return weights

    def record(self, micro: MicroBatch, loss: torch.Tensor, metrics: dict[str, torch.Tensor],
               logp: torch.Tensor) -> None:
        """After a micro-batch's backward: its loss's finiteness, tokens, metrics and each env's ratios."""
        u = self.update
        self._non_finite += float(not torch.isfinite(loss).item())
        if micro.rows:
            u.tokens += int(micro.batch["attention_mask"].sum())
            if u.env_ratios is not None:  # each env's importance ratios apart (env/<name>/*)
                band = u.clip or (math.inf, math.inf)  # no clip band: approx_kl only
                u.env_ratios.add(micro.rows, logp, micro.batch["old_logp"], micro.batch["mask"], *band)
        for key, value in metrics.items():
            kind = "loss_term" if key in LOSS_METRICS else None
            if isinstance(value, Declared):
                value, kind = value.value, value.kind
                if kind == "count":
                    u.counted.add(key)
            if kind == "loss_term":  # every process logs every term, 0 for its padding
                self._loss_terms[key] += float(value) if micro.rows else 0.0
            elif micro.rows:
                u.sums[key].append(float(value))

    def step_ok(self, grad_norm: float) -> bool:
        """End of the mini-batch, after clipping: whether the optimizer may step. False when a loss on any process
        or the gradient norm is not finite (the caller then drops the gradient: a bad batch must not poison the
        weights); the step is counted either way."""
        u = self.update
        for key, value in self._loss_terms.items():  # this process's share of the mini-batch's loss
            u.sums[key].append(value * u.world)
        non_finite = u.accelerator.reduce(torch.tensor(self._non_finite, device=u.device), reduction="sum").item()
        if non_finite > 0 or not math.isfinite(grad_norm):
            u.skipped += 1
            return False
        u.grad_norms.append(grad_norm)
        return True


class Update:
    """The update of every iteration of a run: its batching settings and one iteration's accounting.

    ``engine`` (``arena_train.cli.EngineArgs``) gives the micro-batch caps (``--micro-batch-size``,
    ``--micro-batch-tokens``) and the rollout/trainer correction (``--rollout-is``, ``--rollout-is-cap``);
    ``max_len`` is Dr.GRPO's constant length (the most policy tokens a row can hold); ``other_engine`` whether
    the rollout's log-probs come from another engine or precision (measured even without a correction);
    ``env_names`` the mixture's envs (several: ``env/<name>/*`` ratios). ``clip`` (eps_low, eps_high) is the band
    of ``env/<name>/ratio_out_frac``: a method that clips sets it where it builds its loss (``update.clip = ...``),
    so that the loop outside the blocks needs no clip field; without it, no ``ratio_out_frac`` is logged."""

    def __init__(self, accelerator, engine: EngineArgs, *, pad_id: int, max_len: int, other_engine: bool,
                 env_names: Sequence[str]):
        self.accelerator, self.device, self.world = accelerator, accelerator.device, accelerator.num_processes
        self.micro_batch_size, self.micro_batch_tokens = engine.micro_batch_size, engine.micro_batch_tokens
        self.pad_id, self.max_len = pad_id, max_len
        self.rollout_is, self.rollout_is_cap = engine.rollout_is, engine.rollout_is_cap
        self.other_engine, self.env_names = other_engine, tuple(env_names)
        self.clip: tuple[float, float] | None = None
        self.rows: list[Row] = []
        self.counted: set[str] = set()
        self._statistics: dict[str, tuple[float, float, str]] = {}

    def statistic(self, key: str, value: float, reduce: Literal["mean", "sum", "min", "max"] = "mean",
                  weight: float = 1.0) -> None:
        """A method's own number of this iteration (from any block), logged by ``metrics`` under ``key`` (its
        prefix and name: ``rollout/kept_groups``) and reduced over the processes: ``mean`` (weighted by ``weight``,
        e.g. the process's row count for a mean over rows; 1 = the processes' values alike), ``sum``, ``min`` or
        ``max``. Every process records the same keys: each reduction is a collective."""
        if reduce not in ("mean", "sum", "min", "max"):
            raise ValueError(f"statistic {key!r}: reduce must be 'mean', 'sum', 'min' or 'max', got {reduce!r}")
        self._statistics[key] = (float(value), float(weight), reduce)

    def _reduced_statistics(self) -> dict[str, float]:
        """The iteration's ``statistic`` values over all processes (in key order, the same on every process)."""
        out = {}
        for key, (value, weight, reduce) in sorted(self._statistics.items()):
            if reduce in ("mean", "sum"):
                t = torch.tensor([value * weight if reduce == "mean" else value, weight], dtype=torch.float64,
                                 device=self.device)
                total, weights = self.accelerator.reduce(t, reduction="sum").tolist()
                out[key] = total / weights if reduce == "mean" else total
            else:
                values = self.accelerator.gather(torch.tensor([value], dtype=torch.float64, device=self.device))
                out[key] = float(values.min() if reduce == "min" else values.max())
        self._statistics.clear()
        return out

    def minibatches(self, rows: list[Row], orders: list[list[int]], n_minibatches: int) -> Iterator[MiniBatch]:
        """One iteration's mini-batches: each epoch's row order split into ``n_minibatches`` (the same count on
        every process; a process's share may be empty and it still joins every pass). Resets the accounting."""
        self.rows = rows
        self.sums: dict[str, list[float]] = defaultdict(list)
        self.mismatch: dict[str, list[float]] = defaultdict(list)
        self.grad_norms: list[float] = []
        self.skipped = self.tokens = 0
        self.env_ratios = EnvRatios() if len(self.env_names) > 1 else None
        for order in orders:
            for index in np.array_split(np.array(order, dtype=np.int64), n_minibatches):
                yield MiniBatch(self, [rows[j] for j in index])

    def iteration_metrics(self, *, episodes: list, stats: dict[str, float], t_rollout: float, t_update: float,
                          push: dict[str, float]) -> dict[str, float]:
        """The iteration's metrics, pooled over the processes (docs/metrics.md): ``rollout/*``, ``actor/*``,
        ``perf/*``, each env's in a mixture, the weight push's (``push``), ``rollout_is/*`` and the method's own
        (``statistic``)."""
        out = iteration_metrics(self.accelerator, episodes=episodes, rows=self.rows, stats=stats,
                                actor_sums=self.sums, grad_norms=self.grad_norms, skipped=self.skipped,
                                update_tokens=self.tokens, t_rollout=t_rollout, t_update=t_update,
                                count_keys=(*COUNT_METRICS, *sorted(self.counted)))
        if self.env_ratios is not None:  # env/<name>/*: every env of the mixture apart
            out.update(env_metrics(self.accelerator, self.env_names, episodes=episodes, rows=self.rows))
            ratios = self.env_ratios.metrics(self.accelerator, self.env_names)
            out.update({k: v for k, v in ratios.items() if self.clip or not k.endswith("/ratio_out_frac")})
        out.update(push)
        out.update(pooled_mismatch(self.accelerator, self.mismatch))  # every process holds rows, so values
        out.update(self._reduced_statistics())  # the method's own (Update.statistic)
        return out
