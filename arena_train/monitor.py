"""The in-run collapse alarm: per iteration, the collapse signals of docs/evaluation.md ("The in-run alarm") from
the iteration's metrics, and what to do about them (``--on-collapse off|warn|stop|rollback``).

Every script calls it like the logger, after the iteration's metrics and evaluation, before the checkpoint:

    step = monitor.update(iteration, metrics_out)          # -> MonitorStep: signals, decision, stability/* metrics
    metrics_out.update(step.metrics)

The monitor only reads the pooled metrics dict, so every process reaches the same decision without a collective.
Its state is a JSON-able dict (``state_dict`` / ``load_state_dict``) that every checkpoint carries as
``monitor.json`` (``arena_train.checkpoint.save_checkpoint``'s ``states``: JSON, never a pickle), so ``--resume``
makes the same decisions. ``decide`` is the pure policy (signals + the
checkpoint history -> warn / stop / rollback and which checkpoint is the last healthy one); ``restore_healthy``
carries out a stop or rollback on disk, reusing ``arena_train.checkpoint``'s verification.

A checkpoint of iteration i holds the weights that drew iteration i + 1's rollouts, so a checkpoint is healthy
for an alarm whose bad stretch began at iteration ``onset`` when i + 1 < onset.
"""

from __future__ import annotations

import math
import shutil
import statistics
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import tyro

SUCCESS_KEY = "rollout/success_rate"
EVAL_SUCCESS_KEY = "eval/success_rate"
GRAD_KEY = "actor/grad_norm"
ENTROPY_KEY = "actor/entropy"
KL_KEY = "actor/kl_ref"
FORMAT_KEY = "rollout/valid_format_ratio"
ACTION_KEY = "rollout/valid_action_ratio"
MISMATCH_KEY = "rollout_is/prob_diff_mean"
#: metrics whose non-finite value is an alarm at once (a NaN loss or gradient poisons every later update)
NONFINITE_KEYS = (SUCCESS_KEY, EVAL_SUCCESS_KEY, "rollout/episode_return", "rollout/advantage_abs", GRAD_KEY,
                  ENTROPY_KEY, KL_KEY, "actor/pg_loss", "actor/approx_kl", MISMATCH_KEY)
SIGNALS = ("nonfinite", "success_drop", "eval_drop", "grad_spike", "entropy", "kl_blowup", "format_drop",
           "action_drop", "mismatch")
ACTIONS = ("off", "warn", "stop", "rollback")
#: CollapseConfig fields that are script flags under their own name; every other field is ``--collapse-<name>``
OWN_FLAGS = ("on_collapse", "rollback_lr_scale", "max_rollbacks")
STATE_VERSION = 1
#: The name of the monitor's state in a checkpoint (``<name>.json``; ``save_checkpoint``'s ``states``).
MONITOR_STATE = "monitor"


def flag_name(field_name: str) -> str:
    """The script flag of a ``CollapseConfig`` field (``warmup`` -> ``--collapse-warmup``)."""
    name = field_name if field_name in OWN_FLAGS else f"collapse_{field_name}"
    return "--" + name.replace("_", "-")


@tyro.conf.configure(tyro.conf.OmitArgPrefixes)  # a script's flags: --on-collapse, --collapse-<field>
@dataclass(frozen=True)
class CollapseConfig:
    """Alarm thresholds and the action; every field is a script flag (``flag_name``). Defaults fire on none of
    200 simulated healthy runs (tests/test_arena_train_monitor.py) and on every induced collapse within the
    delays stated there."""

    on_collapse: Literal["off", "warn", "stop", "rollback"] = "warn"
    """off: no monitoring; warn: log the alarm; stop: end the run on its last healthy checkpoint; rollback: go back
    to that checkpoint with a smaller learning rate (stop once max_rollbacks are used)"""
    rollback_lr_scale: float = 0.5
    """each rollback multiplies the learning rate by this"""
    max_rollbacks: int = 2
    """rollbacks allowed per run; the next alarm stops the run"""
    warmup: Annotated[int, tyro.conf.arg(name="collapse-warmup")] = 5
    """iterations after the start (or a rollback) in which statistics are collected and nothing but a
    non-finite value fires"""
    success_drop: Annotated[float, tyro.conf.arg(name="collapse-success-drop")] = 0.5
    """success_drop / eval_drop fire when success < this fraction of its running best ..."""
    success_window: Annotated[int, tyro.conf.arg(name="collapse-success-window")] = 10
    """... rollout success averaged over this many iterations (one batch of 64 episodes is too noisy) ..."""
    success_patience: Annotated[int, tyro.conf.arg(name="collapse-success-patience")] = 3
    """... for this many consecutive iterations ..."""
    success_min_peak: Annotated[float, tyro.conf.arg(name="collapse-success-min-peak")] = 0.2
    """... once that best is at least this (below it, halving is noise, not a collapse)"""
    eval_window: Annotated[int, tyro.conf.arg(name="collapse-eval-window")] = 3
    """held-out success (eval/success_rate) averaged over this many evaluations ..."""
    eval_patience: Annotated[int, tyro.conf.arg(name="collapse-eval-patience")] = 2
    """... below success_drop x its best for this many consecutive evaluations"""
    patience: Annotated[int, tyro.conf.arg(name="collapse-patience")] = 2
    """consecutive iterations a grad_spike, entropy, kl_blowup, format_drop, action_drop or mismatch condition
    must hold (a single outlier batch is clipped and survived)"""
    window: Annotated[int, tyro.conf.arg(name="collapse-window")] = 50
    """running medians (grad norm, entropy, KL) use at most this many previous finite values ..."""
    min_history: Annotated[int, tyro.conf.arg(name="collapse-min-history")] = 5
    """... and need this many"""
    grad_factor: Annotated[float, tyro.conf.arg(name="collapse-grad-factor")] = 10.0
    """grad_spike: gradient norm > this x its running median"""
    entropy_factor: Annotated[float, tyro.conf.arg(name="collapse-entropy-factor")] = 4.0
    """entropy: above this x, or below 1/this x, its running median (explosion or collapse)"""
    kl_factor: Annotated[float, tyro.conf.arg(name="collapse-kl-factor")] = 10.0
    """kl_blowup: KL to the reference > max(kl_floor, this x its running median)"""
    kl_floor: Annotated[float, tyro.conf.arg(name="collapse-kl-floor")] = 0.1
    """KL starts near 0, where a ratio alone fires on noise"""
    ratio_drop: Annotated[float, tyro.conf.arg(name="collapse-ratio-drop")] = 0.5
    """format_drop / action_drop: valid-format / valid-action ratio < this x its running best ..."""
    ratio_min_peak: Annotated[float, tyro.conf.arg(name="collapse-ratio-min-peak")] = 0.5
    """... once that best is at least this (never having the format is not learning it, not a collapse)"""
    mismatch_max: Annotated[float, tyro.conf.arg(name="collapse-mismatch-max")] = 0.05
    """mismatch: mean |p_rollout - p_train| of the sampled tokens (rollout_is/prob_diff_mean) above this"""

    def __post_init__(self):
        def need(ok: bool, name: str, what: str):
            if not ok:
                raise ValueError(f"{flag_name(name)} must be {what} (got {getattr(self, name)!r})")

        need(self.on_collapse in ACTIONS, "on_collapse", "one of " + ", ".join(ACTIONS))
        need(0 < self.rollback_lr_scale <= 1, "rollback_lr_scale", "in (0, 1]")
        for name in ("success_drop", "ratio_drop"):
            need(0 < getattr(self, name) < 1, name, "in (0, 1)")
        for name in ("success_window", "success_patience", "eval_window", "eval_patience", "patience", "window",
                     "min_history"):
            need(getattr(self, name) >= 1, name, ">= 1")
        for name in ("max_rollbacks", "warmup", "success_min_peak", "ratio_min_peak", "kl_floor"):
            need(getattr(self, name) >= 0, name, ">= 0")
        for name in ("grad_factor", "entropy_factor", "kl_factor"):
            need(getattr(self, name) > 1, name, "> 1")
        need(self.mismatch_max > 0, "mismatch_max", "> 0")
        need(self.min_history <= self.window, "min_history", f"<= {flag_name('window')}")

    @staticmethod
    def flag_key(field_name: str) -> str:
        """The flat key of a field in a script's ``args.json`` (``warmup`` -> ``collapse_warmup``)."""
        return flag_name(field_name)[2:].replace("-", "_")

    @classmethod
    def from_flags(cls, values: Mapping[str, Any]) -> CollapseConfig:
        """The config from a script's flat flag values (``asdict(args)``): ``OWN_FLAGS`` under their names, every
        other field as ``collapse_<field>``; absent ones keep their defaults."""
        names = {f.name: f.name if f.name in OWN_FLAGS else f"collapse_{f.name}" for f in fields(cls)}
        return cls(**{name: values[key] for name, key in names.items() if key in values})


def checkpoints_to_keep(config: CollapseConfig, checkpoint_every: int, keep: int = 2) -> int:
    """``save_checkpoint``'s ``keep`` that still holds the last healthy checkpoint when a success drop is
    confirmed: its onset can lie success_window + success_patience − 2 iterations before the alarm, plus one
    checkpoint interval. A held-out (eval_drop) onset can be older still; then the rollback finds nothing and
    stops."""
    if checkpoint_every <= 0 or config.on_collapse not in ("stop", "rollback"):
        return keep
    return max(keep, 2 + (config.success_window + config.success_patience - 2) // checkpoint_every)


@dataclass(frozen=True)
class Signal:
    """A collapse signal that fired: the metric's value, the threshold it crossed, a one-line reason, and the
    iteration where its bad stretch began (``onset`` ≤ the current iteration)."""

    name: str
    value: float
    threshold: float
    reason: str
    onset: int


@dataclass(frozen=True)
class Decision:
    """What the caller does. ``checkpoint``: the iteration of the last healthy checkpoint (rollback target, or
    the state a stopped run ends on; None: none was taken before the onset). ``lr_scale``: the learning rate
    multiplier from now on (relative to the configured one)."""

    action: Literal["none", "warn", "stop", "rollback"]
    checkpoint: int | None
    lr_scale: float
    reason: str


@dataclass(frozen=True)
class MonitorStep:
    """One iteration's outcome: the signals firing, the decision, the ``stability/*`` metrics to log, and the
    events it adds (signals firing for the first time in a stretch; every signal on a stop or rollback)."""

    iteration: int
    signals: list[Signal]
    decision: Decision
    metrics: dict[str, float]
    events: list[dict[str, Any]]

    @property
    def message(self) -> str:
        """One line for the console when there is something new to say, else ''."""
        if not self.events:
            return ""
        return f"collapse alarm at iteration {self.iteration}: {self.decision.reason}"


def decide(signals: list[Signal], checkpoints: list[int], on_collapse: str, rollbacks: int, max_rollbacks: int,
           rollback_lr_scale: float) -> Decision:
    """The pure action policy: given the signals firing now, the iterations of the checkpoints taken so far and
    the rollbacks already done, what to do and which checkpoint is the last healthy one."""
    scale = rollback_lr_scale ** rollbacks
    if not signals or on_collapse == "off":
        return Decision("none", None, scale, "")
    onset = min(s.onset for s in signals)
    healthy = max((c for c in checkpoints if c + 1 < onset), default=None)
    what = "; ".join(f"{s.name}: {s.reason}" for s in signals)
    where = "no checkpoint before the onset" if healthy is None else f"last healthy checkpoint {healthy}"
    if on_collapse == "warn":
        return Decision("warn", healthy, scale, f"{what} (onset {onset}, {where})")
    if on_collapse == "rollback":
        if healthy is not None and rollbacks < max_rollbacks:
            new = scale * rollback_lr_scale
            return Decision("rollback", healthy, new, f"{what}; rolling back to checkpoint {healthy} "
                                                      f"(rollback {rollbacks + 1} of {max_rollbacks}, lr x{new:g})")
        why = where if healthy is None else f"all {max_rollbacks} rollbacks used; {where}"
        return Decision("stop", healthy, scale, f"{what}; stopping ({why})")
    return Decision("stop", healthy, scale, f"{what}; stopping ({where})")


def _num(x: float) -> float | str:
    """A float for strict JSON: non-finite values as the strings json readers and ``eval.runlog`` accept."""
    return x if math.isfinite(x) else str(x)


def _fresh_state() -> dict[str, Any]:
    return {
        "version": STATE_VERSION,
        "updates": 0,  # update() calls since the start or the last restore (the warm-up counts these)
        "tracks": {},  # drop signals: {"recent": [[iteration, value], ...], "best": float | None}
        "history": {},  # running-median metrics: [[iteration, value], ...] (finite, at most `window`)
        "success": [],  # raw rollout success [[iteration, value], ...] (at most `window`): where a collapse began
        "streaks": {},  # signal -> [consecutive bad iterations, onset]
        "active": [],  # signals that fired on the last update (an event is written when one starts)
        "checkpoints": [],  # iterations of the checkpoints taken on the current (not rolled-back) branch
        "rollbacks": 0,
        "events": [],
        "stopped": None,
    }


class CollapseMonitor:
    """Per-iteration collapse signals and decisions (module docstring). ``checkpointed(i)`` before every
    ``save_checkpoint(..., i)``; ``restore_healthy`` after a stop or rollback decision; ``summary()`` into
    ``summary.json``."""

    def __init__(self, config: CollapseConfig):
        self.config = config
        self.state = _fresh_state()

    # --- checkpointing (save_checkpoint's states: monitor.json) ------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"config": asdict(self.config), **self.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a saved state; the config stays the one given at construction (flags may change on resume)."""
        state = dict(state)
        state.pop("config", None)
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"collapse monitor state version {state.get('version')!r}, expected {STATE_VERSION}")
        self.state = state

    # --- the record the caller keeps it informed of ------------------------------------------------------------
    def checkpointed(self, iteration: int) -> None:
        """Checkpoint ``iteration`` is about to be saved (call before ``save_checkpoint``, so it carries this)."""
        self.state["checkpoints"] = [c for c in self.state["checkpoints"] if c != iteration] + [iteration]

    def restored(self, checkpoint: int, iteration: int) -> None:
        """The weights of ``checkpoint`` are back and are being saved as checkpoint ``iteration``: forget the
        collapsed stretch (its checkpoints and statistics), restart the warm-up."""
        s = self.state
        s["checkpoints"] = [c for c in s["checkpoints"] if c <= checkpoint] + [iteration]
        s["history"] = {k: [p for p in v if p[0] <= checkpoint] for k, v in s["history"].items()}
        for track in s["tracks"].values():
            track["recent"] = [p for p in track["recent"] if p[0] <= checkpoint]
        s["success"] = [p for p in s.get("success", []) if p[0] <= checkpoint]
        s["streaks"], s["active"], s["updates"] = {}, [], 0

    def unrestorable(self, decision: Decision) -> None:
        """No healthy checkpoint verified for ``decision``: the run stops on its current weights (a rollback
        that could not happen is not counted)."""
        if decision.action == "rollback":
            self.state["rollbacks"] -= 1
        unverified = f"; no checkpoint at or before {decision.checkpoint} verifies: stopped on the current weights"
        self.state["stopped"] = decision.reason + ("" if decision.checkpoint is None else unverified)

    @property
    def lr_scale(self) -> float:
        return self.config.rollback_lr_scale ** self.state["rollbacks"]

    @property
    def stopped(self) -> str | None:
        return self.state["stopped"]

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` records of the alarm."""
        return {"stability/events": self.state["events"], "stability/rollbacks": self.state["rollbacks"],
                "stability/stopped": self.state["stopped"], "stability/lr_scale": self.lr_scale}

    # --- the signals -------------------------------------------------------------------------------------------
    def _streak(self, name: str, bad: bool, iteration: int, onset: int | None = None) -> int:
        """Consecutive bad iterations of ``name`` so far (0 when not bad); the stretch's onset is kept."""
        if not bad:
            self.state["streaks"].pop(name, None)
            return 0
        count, first = self.state["streaks"].get(name, [0, onset if onset is not None else iteration])
        self.state["streaks"][name] = [count + 1, first]
        return count + 1

    def _onset(self, name: str) -> int:
        return self.state["streaks"][name][1]

    def _drop(self, name: str, key: str, iteration: int, value: float, drop: float, window: int, patience: int,
              min_peak: float, label: str) -> Signal | None:
        """``value`` averaged over ``window`` observations below ``drop`` x the best such average (once that is
        ≥ ``min_peak``) for ``patience`` observations in a row. The onset goes back to the first observation of
        the average that was itself below the threshold: the average lags the fall."""
        track = self.state["tracks"].setdefault(name, {"recent": [], "best": None})
        track["recent"] = (track["recent"] + [[iteration, value]])[-window:]
        if len(track["recent"]) < window:
            return None
        level = sum(v for _, v in track["recent"]) / window
        best = track["best"]
        threshold = drop * best if best is not None else math.nan
        bad = best is not None and best >= min_peak and level < threshold
        onset = min((i for i, v in track["recent"] if v < threshold), default=iteration) if bad else None
        count = self._streak(name, bad, iteration, onset)
        track["best"] = level if best is None else max(best, level)
        if count < patience:
            return None
        unit = "evaluations" if name == "eval_drop" else "iterations"
        return Signal(name, level, threshold, f"{key}{label} {level:.3g} < {drop:g} x best {best:.3g} for {count} "
                                              f"{unit}", self._onset(name))

    def _median(self, key: str, iteration: int, value: float) -> float | None:
        """Median of the previous finite values of ``key`` (None until ``min_history``); records ``value``."""
        cfg = self.config
        history = self.state["history"].setdefault(key, [])
        median = statistics.median(v for _, v in history) if len(history) >= cfg.min_history else None
        self.state["history"][key] = (history + [[iteration, value]])[-cfg.window:]
        return median

    def _check(self, iteration: int, metrics: Mapping[str, float]) -> list[Signal]:
        cfg = self.config
        value = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        finite = {k: v for k, v in value.items() if math.isfinite(v)}
        found: list[Signal | None] = []
        # an iteration whose every group was dropped on env errors has no rows: its rollout and update means are
        # NaN for want of values, which says nothing of the policy (the env-failure limit watches that case)
        empty = value.get("rollout/num_rows") == 0
        bad_keys = [k for k in NONFINITE_KEYS if k in value and k not in finite
                    and not (empty and math.isnan(value[k]) and k != EVAL_SUCCESS_KEY)]
        if self._streak("nonfinite", bool(bad_keys), iteration):
            found.append(Signal("nonfinite", value[bad_keys[0]], math.inf, f"non-finite {', '.join(bad_keys)}",
                                self._onset("nonfinite")))
        if SUCCESS_KEY in finite:
            self.state["success"] = (self.state.get("success", []) + [[iteration, finite[SUCCESS_KEY]]])[-cfg.window:]
            found.append(self._drop("success_drop", SUCCESS_KEY, iteration, finite[SUCCESS_KEY], cfg.success_drop,
                                    cfg.success_window, cfg.success_patience, cfg.success_min_peak,
                                    f" (mean of {cfg.success_window})"))
        if EVAL_SUCCESS_KEY in finite:
            found.append(self._drop("eval_drop", EVAL_SUCCESS_KEY, iteration, finite[EVAL_SUCCESS_KEY],
                                    cfg.success_drop, cfg.eval_window, cfg.eval_patience, cfg.success_min_peak,
                                    f" (mean of {cfg.eval_window})"))
        for name, key in (("format_drop", FORMAT_KEY), ("action_drop", ACTION_KEY)):
            if key in finite:
                found.append(self._drop(name, key, iteration, finite[key], cfg.ratio_drop, 1, cfg.patience,
                                        cfg.ratio_min_peak, ""))
        if GRAD_KEY in finite:
            med, v = self._median(GRAD_KEY, iteration, finite[GRAD_KEY]), finite[GRAD_KEY]
            limit = math.inf if med is None else cfg.grad_factor * med
            found.append(self._sustained("grad_spike", v > limit, iteration, v, limit,
                                         f"{GRAD_KEY} {v:.3g} > {cfg.grad_factor:g} x running median"))
        if ENTROPY_KEY in finite:
            med, v = self._median(ENTROPY_KEY, iteration, finite[ENTROPY_KEY]), finite[ENTROPY_KEY]
            high, low = (math.inf, -math.inf) if med is None else (cfg.entropy_factor * med, med / cfg.entropy_factor)
            side = f"> {cfg.entropy_factor:g} x" if v > high else f"< 1/{cfg.entropy_factor:g} x"
            found.append(self._sustained("entropy", v > high or v < low, iteration, v, high if v > high else low,
                                         f"{ENTROPY_KEY} {v:.3g} {side} running median"))
        if KL_KEY in finite:
            med, v = self._median(KL_KEY, iteration, finite[KL_KEY]), finite[KL_KEY]
            limit = max(cfg.kl_floor, cfg.kl_factor * med) if med is not None else math.inf
            found.append(self._sustained("kl_blowup", v > limit, iteration, v, limit,
                                         f"{KL_KEY} {v:.3g} > max({cfg.kl_floor:g}, {cfg.kl_factor:g} x running "
                                         f"median)"))
        if MISMATCH_KEY in finite:
            v = finite[MISMATCH_KEY]
            found.append(self._sustained("mismatch", v > cfg.mismatch_max, iteration, v, cfg.mismatch_max,
                                         f"{MISMATCH_KEY} {v:.3g} > {cfg.mismatch_max:g}"))
        return [s for s in found if s is not None]

    def _sustained(self, name: str, bad: bool, iteration: int, value: float, threshold: float,
                   reason: str) -> Signal | None:
        count = self._streak(name, bad, iteration)
        if count < self.config.patience:
            return None
        return Signal(name, value, threshold, f"{reason} for {count} iteration{'s' * (count > 1)}", self._onset(name))

    def _success_onset(self) -> int | None:
        """The iteration after the last one whose raw rollout success still reached ``success_drop`` x its best so
        far (once that best is ≥ ``success_min_peak``), or None while the latest one does: a collapse announced by
        another signal may have begun earlier in success, and the healthy checkpoint must predate that."""
        cfg, values = self.config, self.state.get("success", [])
        best, last_good = -math.inf, None
        for k, (_, v) in enumerate(values):
            best = max(best, v)
            if best < cfg.success_min_peak or v >= cfg.success_drop * best:
                last_good = k
        if last_good is None or last_good == len(values) - 1:
            return None
        return values[last_good][0] + 1

    # --- one iteration -----------------------------------------------------------------------------------------
    def update(self, iteration: int, metrics: Mapping[str, float]) -> MonitorStep:
        """Check this iteration's (pooled) metrics; returns the signals, the decision and what to log."""
        cfg, s = self.config, self.state
        if cfg.on_collapse == "off":
            return MonitorStep(iteration, [], Decision("none", None, self.lr_scale, ""), {}, [])
        s["updates"] += 1
        signals = self._check(iteration, metrics)
        if s["updates"] <= cfg.warmup:
            signals = [sig for sig in signals if sig.name == "nonfinite"]
        early = self._success_onset()
        if early is not None:  # the bad stretch began where success fell, if that came first
            signals = [replace(sig, onset=min(sig.onset, early)) for sig in signals]
        decision = decide(signals, s["checkpoints"], cfg.on_collapse, s["rollbacks"], cfg.max_rollbacks,
                          cfg.rollback_lr_scale)
        acting = decision.action in ("stop", "rollback")
        new = [sig for sig in signals if acting or sig.name not in s["active"]]
        events = [{"iteration": iteration, "signal": sig.name, "value": _num(sig.value),
                   "threshold": _num(sig.threshold), "onset": sig.onset, "reason": sig.reason,
                   "action": decision.action, "checkpoint": decision.checkpoint, "lr_scale": decision.lr_scale}
                  for sig in new]
        s["events"] += events
        s["active"] = [sig.name for sig in signals]
        metrics_out = {"stability/alarms": float(len(signals)), "stability/lr_scale": decision.lr_scale}
        metrics_out.update({f"stability/{sig.name}": 1.0 for sig in signals})
        if decision.action == "rollback":
            s["rollbacks"] += 1
            metrics_out["stability/rollback"] = float(decision.checkpoint)
        elif decision.action == "stop":
            s["stopped"] = decision.reason
            metrics_out["stability/stop"] = float(-1 if decision.checkpoint is None else decision.checkpoint)
        return MonitorStep(iteration, signals, decision, metrics_out, events)


def restore_healthy(accelerator, run_dir: Path, monitor: CollapseMonitor, decision: Decision, iteration: int,
                    optimizer=None, keep: int = 2) -> Path | None:
    """Carry out a stop or rollback: load the newest verified checkpoint at or before ``decision.checkpoint`` into
    the prepared objects (the monitor keeps its own, newer state), set every optimizer group's learning rate to its
    first rate (kept as ``base_lr`` in the group, so checkpoints carry it) x ``decision.lr_scale``, save that state
    as checkpoint ``iteration`` and delete the checkpoints of the collapsed stretch, so the run's newest checkpoint
    is healthy and ``--resume`` continues from it with the same decisions. Returns the folder restored, or None
    when no healthy checkpoint verifies: the weights stay, the monitor records the stop, and the caller ends the
    run (a rollback included). After a rollback the caller pushes the restored weights to its rollout engine."""
    from arena_train.checkpoint import (
        CheckpointError,
        checkpoint_folders,
        load_checkpoint,
        newest_verified_checkpoint,
        save_checkpoint,
    )

    found: list = [None]
    if decision.checkpoint is not None and accelerator.is_main_process:
        found[0] = newest_verified_checkpoint(run_dir, decision.checkpoint)
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(found)
    if found[0] is None:
        monitor.unrestorable(decision)
        return None
    folder, healthy = found[0]
    try:
        load_checkpoint(accelerator, folder)  # the weights and optimizer of then; the monitor keeps its newer state
    except CheckpointError as err:
        raise SystemExit(f"error: cannot roll back: {err}" if accelerator.is_main_process else 1) from None
    if optimizer is not None:
        for group in optimizer.param_groups:  # each group's own rate (PPO's critic has another), as first set
            group["lr"] = group.setdefault("base_lr", group["lr"]) * decision.lr_scale
    monitor.restored(healthy, iteration)
    save_checkpoint(accelerator, run_dir, iteration, keep, {MONITOR_STATE: monitor})
    if accelerator.is_main_process:
        for it, stale in checkpoint_folders(run_dir):
            if healthy < it < iteration:
                shutil.rmtree(stale, ignore_errors=True)
    accelerator.print(f"restored checkpoint {healthy} from {folder}; saved as checkpoint {iteration}")
    return Path(folder)
