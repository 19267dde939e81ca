"""arena_train.monitor on synthetic metric streams: healthy noisy runs (many seeds) never fire; each induced
collapse fires within the stated number of iterations with the right onset; stop / rollback pick the last
healthy checkpoint; the state round-trips through strict JSON; ``restore_healthy`` on a real Accelerator."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from arena_train.checkpoint import (
    latest_checkpoint,
    newest_verified_checkpoint,
    resume_latest,
    save_checkpoint,
    verify_checkpoint,
)
from arena_train.monitor import (
    CollapseConfig,
    CollapseMonitor,
    Decision,
    Signal,
    checkpoints_to_keep,
    decide,
    flag_name,
    restore_healthy,
)

EVAL_EVERY = 10


def healthy_stream(seed: int, n: int = 200) -> list[dict[str, float]]:
    """One plausible healthy run: success learned to a random plateau (binomial noise of 64 or 128 episodes, a
    10-iteration dip of a quarter), held-out success every 10 iterations (100 episodes), a log-normal gradient
    norm with rare 2-4x outliers, entropy decaying to 40 %, KL growing, format and action ratios learned
    (binomial over 400 rows), a small rollout/trainer mismatch on half of the seeds."""
    rng = np.random.default_rng(seed)
    peak, tau = rng.uniform(0.05, 0.95), rng.uniform(10, 60)
    episodes = int(rng.choice([64, 128]))
    dip = int(rng.integers(30, n - 10))
    g0, e0, kmax = rng.uniform(0.1, 2.0), rng.uniform(0.3, 2.0), rng.uniform(0.005, 0.08)
    e_tau = rng.uniform(30, 150)
    f0, f_end = rng.uniform(0.3, 0.9), rng.uniform(0.85, 1.0)
    mismatch = bool(rng.integers(2))
    rows = []
    for t in range(1, n + 1):
        p = peak * (1 - math.exp(-t / tau)) * (0.75 if dip <= t < dip + 10 else 1.0)
        fmt = f_end - (f_end - f0) * math.exp(-t / 15)
        grad = g0 * math.exp(-t / 300) * rng.lognormal(0, 0.35) * (rng.uniform(2, 4) if rng.random() < 0.01 else 1)
        row = {
            "rollout/success_rate": rng.binomial(episodes, p) / episodes,
            "rollout/episode_return": 10 * p,
            "rollout/valid_format_ratio": rng.binomial(400, fmt) / 400,
            "rollout/valid_action_ratio": rng.binomial(400, 0.95 * fmt) / 400,
            "rollout/advantage_abs": 0.5,
            "actor/pg_loss": float(rng.normal(0, 0.05)),
            "actor/grad_norm": grad,
            "actor/entropy": e0 * (0.4 + 0.6 * math.exp(-t / e_tau)) * rng.lognormal(0, 0.05),
            "actor/kl_ref": kmax * (t / n) ** 1.5 * rng.lognormal(0, 0.2) + 1e-5,
            "perf/time_update_s": 1.0,
        }
        if mismatch:
            row["rollout_is/prob_diff_mean"] = abs(rng.normal(0.005, 0.002))
        if t % EVAL_EVERY == 0:
            row["eval/success_rate"] = rng.binomial(100, min(1.0, p * rng.uniform(0.8, 1.1))) / 100
        rows.append(row)
    return rows


def run(monitor: CollapseMonitor, rows, start: int = 1, checkpoint_every: int = 0):
    """Feed ``rows`` as iterations start, start + 1, ...; record checkpoints; returns the steps."""
    steps = []
    for i, row in enumerate(rows, start=start):
        steps.append(monitor.update(i, row))
        if checkpoint_every and i % checkpoint_every == 0:
            monitor.checkpointed(i)
    return steps


def first_alarm(steps, name: str | None = None):
    return next((s for s in steps if any(name in (None, sig.name) for sig in s.signals)), None)


def test_healthy_noisy_runs_never_fire():
    for seed in range(200):
        steps = run(CollapseMonitor(CollapseConfig()), healthy_stream(seed))
        fired = first_alarm(steps)
        assert fired is None, f"seed {seed}: {fired.decision.reason}"
        assert all(s.metrics["stability/alarms"] == 0 and not s.events for s in steps)


# (signal, how the stream changes from iteration 101 on, iterations until it must have fired, counting 101 as 1)
COLLAPSES = {
    "success_drop": (lambda r: r.update({"rollout/success_rate": 0.03}), 10),
    "grad_spike": (lambda r: r.update({"actor/grad_norm": 20 * r["actor/grad_norm"]}), 2),
    "entropy": (lambda r: r.update({"actor/entropy": 5 * r["actor/entropy"]}), 2),
    "format_drop": (lambda r: r.update({"rollout/valid_format_ratio": 0.2}), 2),
    "action_drop": (lambda r: r.update({"rollout/valid_action_ratio": 0.2}), 2),
    "kl_blowup": (lambda r: r.update({"actor/kl_ref": 1.0}), 2),
    "mismatch": (lambda r: r.update({"rollout_is/prob_diff_mean": 0.2}), 2),
    "nonfinite": (lambda r: r.update({"actor/grad_norm": float("nan")}), 1),
    "eval_drop": (lambda r: r.update({"eval/success_rate": 0.02}) if "eval/success_rate" in r else None,
                  3 * EVAL_EVERY),
}
HIGH_PEAK_SEEDS = [s for s in range(60) if np.random.default_rng(s).uniform(0.05, 0.95) > 0.5][:8]


@pytest.mark.parametrize("signal", sorted(COLLAPSES))
def test_induced_collapse_fires_within_its_delay_with_its_onset(signal):
    change, delay = COLLAPSES[signal]
    for seed in HIGH_PEAK_SEEDS:
        rows = healthy_stream(seed)
        for row in rows[100:]:
            change(row)
        steps = run(CollapseMonitor(CollapseConfig()), rows)
        fired = first_alarm(steps)
        assert fired is not None, f"seed {seed}: {signal} never fired"
        assert 101 <= fired.iteration <= 100 + delay, f"seed {seed}: first alarm {fired.decision.reason}"
        sig = next(s for s in fired.signals if s.name == signal)
        assert 100 - CollapseConfig().success_window < sig.onset <= 101 + (delay if signal == "eval_drop" else 0)
        assert fired.decision.action == "warn" and fired.metrics[f"stability/{signal}"] == 1.0
        assert [e["signal"] for e in fired.events] == [s.name for s in fired.signals]


def test_warmup_silences_statistics_but_not_a_nan():
    rows = healthy_stream(0)[:8]
    rows[1]["actor/entropy"] *= 50  # would be an entropy explosion after the warm-up
    rows[2]["actor/pg_loss"] = float("inf")
    steps = run(CollapseMonitor(CollapseConfig(warmup=5)), rows)
    assert [s.iteration for s in steps if s.signals] == [3]
    assert steps[2].signals[0].name == "nonfinite" and "actor/pg_loss" in steps[2].signals[0].reason


def test_an_event_starts_a_stretch_and_off_does_nothing():
    rows = healthy_stream(1)
    for row in rows[100:110]:
        row["actor/grad_norm"] *= 30
    steps = run(CollapseMonitor(CollapseConfig()), rows)
    fired = [s for s in steps if s.signals]
    assert [s.iteration for s in fired] == list(range(102, 111))
    assert sum(len(s.events) for s in steps) == 1 and fired[0].message.startswith("collapse alarm at iteration 102")
    assert all(s.message == "" for s in fired[1:])
    off = run(CollapseMonitor(CollapseConfig(on_collapse="off")), rows)
    assert all(not s.signals and not s.metrics and s.decision.action == "none" for s in off)


# --- the action policy -------------------------------------------------------------------------------------------
def sig(onset: int, name: str = "grad_spike") -> Signal:
    return Signal(name, 20.0, 10.0, "spike", onset)


@pytest.mark.parametrize("onset,healthy", [(31, 20), (32, 30), (12, 10), (11, None), (5, None)])
def test_the_last_healthy_checkpoint_drew_no_bad_rollout(onset, healthy):
    d = decide([sig(onset), sig(onset + 3, "entropy")], [10, 20, 30], "stop", 0, 2, 0.5)
    assert d.action == "stop" and d.checkpoint == healthy


def test_rollback_scales_the_learning_rate_until_max_rollbacks_then_stops():
    ckpts = [10, 20, 30]
    assert decide([sig(35)], ckpts, "rollback", 0, 2, 0.5) == Decision("rollback", 30, 0.5, decide(
        [sig(35)], ckpts, "rollback", 0, 2, 0.5).reason)
    second = decide([sig(35)], ckpts, "rollback", 1, 2, 0.5)
    assert second.action == "rollback" and second.lr_scale == 0.25 and "rollback 2 of 2" in second.reason
    third = decide([sig(35)], ckpts, "rollback", 2, 2, 0.5)
    assert (third.action, third.checkpoint, third.lr_scale) == ("stop", 30, 0.25)
    assert "all 2 rollbacks used" in third.reason
    no_ckpt = decide([sig(5)], ckpts, "rollback", 0, 2, 0.5)
    assert (no_ckpt.action, no_ckpt.checkpoint) == ("stop", None) and "no checkpoint before the onset" in no_ckpt.reason
    assert decide([sig(35)], ckpts, "warn", 0, 2, 0.5).action == "warn"
    assert decide([], ckpts, "rollback", 0, 2, 0.5).action == "none"
    assert decide([sig(35)], ckpts, "off", 0, 2, 0.5).action == "none"


def test_rollback_stream_restores_twice_then_stops():
    """Three collapses (gradient norm x30 from iterations 95, 155 and 215 until the monitor acts) in rollback mode,
    checkpoints every 10 iterations: two rollbacks to the checkpoint before each onset, then a stop."""
    monitor = CollapseMonitor(CollapseConfig(on_collapse="rollback", max_rollbacks=2))
    rows, actions, collapsing = healthy_stream(HIGH_PEAK_SEEDS[0], 300), [], False
    for it, row in enumerate(rows, start=1):
        collapsing = collapsing or it in (95, 155, 215)
        if collapsing:
            row["actor/grad_norm"] *= 30
        step = monitor.update(it, row)
        if step.decision.action in ("rollback", "stop"):
            actions.append((it, step.decision.action, step.decision.checkpoint, step.decision.lr_scale))
            if step.decision.action == "stop":
                break
            monitor.restored(step.decision.checkpoint, it)  # what restore_healthy records
            collapsing = False
        elif it % 10 == 0:
            monitor.checkpointed(it)
    assert actions == [(96, "rollback", 90, 0.5), (156, "rollback", 150, 0.25), (216, "stop", 210, 0.25)]
    assert monitor.state["rollbacks"] == 2 and monitor.lr_scale == 0.25
    summary = monitor.summary()
    assert summary["stability/rollbacks"] == 2 and "all 2 rollbacks used" in summary["stability/stopped"]
    assert [e["action"] for e in summary["stability/events"]] == ["rollback", "rollback", "stop"]


def test_a_collapse_that_began_in_success_goes_back_before_that():
    """Success falls to 0 at iteration 51 (drawn by checkpoint 50's weights) and the format only from 54: the
    format alarm's rollback must skip checkpoint 50, whose weights already failed, to checkpoint 40."""
    monitor = CollapseMonitor(CollapseConfig(on_collapse="rollback"))
    rows = healthy_stream(HIGH_PEAK_SEEDS[0], 80)
    for it, row in enumerate(rows, start=1):
        if it > 50:
            row["rollout/success_rate"] = 0.0
        if it > 53:
            row["rollout/valid_format_ratio"] = row["rollout/valid_action_ratio"] = 0.0
        step = monitor.update(it, row)
        if step.decision.action == "rollback":
            break
        if it % 10 == 0:
            monitor.checkpointed(it)
    assert step.decision.action == "rollback" and it <= 56
    assert step.decision.checkpoint == 40 and min(s.onset for s in step.signals) == 51


def test_restored_forgets_the_collapsed_stretch():
    monitor = CollapseMonitor(CollapseConfig(on_collapse="rollback"))
    rows = healthy_stream(3)
    run(monitor, rows[:60], checkpoint_every=10)
    monitor.restored(40, 60)
    assert monitor.state["checkpoints"] == [10, 20, 30, 40, 60]
    assert all(p[0] <= 40 for h in monitor.state["history"].values() for p in h)
    assert monitor.state["updates"] == 0 and monitor.state["streaks"] == {}


# --- state -------------------------------------------------------------------------------------------------------
def test_state_round_trips_through_strict_json_and_reproduces_decisions():
    rows = healthy_stream(HIGH_PEAK_SEEDS[1])
    rows[40]["actor/grad_norm"] = float("nan")
    for row in rows[120:]:
        row["rollout/success_rate"] = 0.02
    cfg = CollapseConfig(on_collapse="stop")
    a = CollapseMonitor(cfg)
    run(a, rows[:115], checkpoint_every=10)
    text = json.dumps(a.state_dict(), allow_nan=False)
    b = CollapseMonitor(cfg)
    b.load_state_dict(json.loads(text))
    steps_a, steps_b = run(a, rows[115:], start=116), run(b, rows[115:], start=116)
    assert [(s.signals, s.decision, s.metrics, s.events) for s in steps_a] == \
        [(s.signals, s.decision, s.metrics, s.events) for s in steps_b]
    stop = first_alarm(steps_a)
    assert stop.decision.action == "stop" and stop.decision.checkpoint in (100, 110)
    assert a.state_dict() == b.state_dict()
    json.dumps(a.summary(), allow_nan=False)
    assert a.state["events"][0]["signal"] == "nonfinite" and a.state["events"][0]["value"] == "nan"
    with pytest.raises(ValueError, match="version"):
        b.load_state_dict({"version": 0})


def test_config_checks_name_the_flag_and_flags_build_the_config():
    with pytest.raises(ValueError, match="--collapse-success-drop must be in"):
        CollapseConfig(success_drop=1.5)
    with pytest.raises(ValueError, match="--on-collapse must be one of"):
        CollapseConfig(on_collapse="panic")
    with pytest.raises(ValueError, match="--collapse-min-history must be <= --collapse-window"):
        CollapseConfig(window=3, min_history=5)
    assert flag_name("warmup") == "--collapse-warmup" and flag_name("max_rollbacks") == "--max-rollbacks"
    cfg = CollapseConfig.from_flags({"on_collapse": "rollback", "collapse_grad_factor": 20.0, "lr": 1e-6,
                                     "warmup": 99})
    assert cfg == CollapseConfig(on_collapse="rollback", grad_factor=20.0)


def test_checkpoints_to_keep_holds_the_last_healthy_one():
    cfg = CollapseConfig(on_collapse="rollback")
    assert checkpoints_to_keep(cfg, 10) == 3 and checkpoints_to_keep(cfg, 5) == 4 and checkpoints_to_keep(cfg, 0) == 2
    assert checkpoints_to_keep(CollapseConfig(), 1) == 2  # warn keeps what the script keeps
    # the worst case: the success onset as early as the window allows, confirmed `patience` later
    for every in (1, 2, 3, 5, 10, 20):
        keep = checkpoints_to_keep(cfg, every)
        for onset in range(30, 60):
            alarm = onset + cfg.success_window + cfg.success_patience - 2
            taken = [c for c in range(every, alarm, every)]  # the alarm iteration itself is not saved
            healthy = max(c for c in taken if c + 1 < onset)
            assert healthy in taken[-keep:], (every, onset)


# --- restore_healthy on a real Accelerator -------------------------------------------------------------------------
@pytest.fixture
def prepared():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    monitor = CollapseMonitor(CollapseConfig(on_collapse="rollback"))
    return accelerator, model, optimizer, monitor


def train_step(model, optimizer):
    model(torch.randn(3, 4)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_restore_healthy_rolls_back_durably(prepared, tmp_path):
    accelerator, model, optimizer, monitor = prepared
    weights = {}
    for it in range(1, 36):
        train_step(model, optimizer)
        monitor.update(it, {"actor/grad_norm": 1.0})
        if it % 10 == 0:
            monitor.checkpointed(it)
            save_checkpoint(accelerator, tmp_path, it, keep=3, states={"monitor": monitor})
            weights[it] = {k: v.clone() for k, v in model.state_dict().items()}
    step = monitor.update(36, {"actor/grad_norm": float("nan")})
    monitor_state = monitor.state_dict()
    assert step.decision == Decision("rollback", 30, 0.5, step.decision.reason)
    decision = Decision("rollback", 20, 0.5, "pretend the onset was 22")  # restore an older one than the newest
    folder = restore_healthy(accelerator, tmp_path, monitor, decision, 36, optimizer, keep=3)
    assert folder.name == "iter_000020"
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, weights[20][k])
    assert all(g["lr"] == pytest.approx(5e-3) for g in optimizer.param_groups)
    assert monitor.state["rollbacks"] == 1 == monitor_state["rollbacks"]  # the load kept the newer monitor state
    assert monitor.state["checkpoints"] == [10, 20, 36]
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("iter_"))
    assert names == ["iter_000020", "iter_000036"]  # 30, of the collapsed stretch, is gone; 10 was rotated out
    assert latest_checkpoint(tmp_path)[1] == 36 and verify_checkpoint(tmp_path / "checkpoints" / "iter_000036") == 36
    # --resume: a fresh run gets the restored weights, the lowered learning rate and the monitor's decisions
    train_step(model, optimizer)
    fresh = CollapseMonitor(CollapseConfig(on_collapse="rollback"))
    assert resume_latest(accelerator, tmp_path, states={"monitor": fresh}) == 36
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, weights[20][k])
    assert all(g["lr"] == pytest.approx(5e-3) for g in optimizer.param_groups)
    assert fresh.state_dict() == monitor.state_dict()


def test_restore_healthy_without_a_healthy_checkpoint_stops_on_the_current_weights(prepared, tmp_path):
    accelerator, model, optimizer, monitor = prepared
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert restore_healthy(accelerator, tmp_path, monitor, Decision("stop", None, 1.0, "nan"), 5) is None
    monitor.state["rollbacks"] = 1  # as update() counts a rollback decision
    assert restore_healthy(accelerator, tmp_path, monitor, Decision("rollback", 3, 0.5, "nan"), 5) is None
    assert monitor.state["rollbacks"] == 0 and "no checkpoint at or before 3 verifies" in monitor.stopped
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k])


def test_newest_verified_checkpoint_skips_damaged_and_newer_ones(prepared, tmp_path):
    accelerator, model, optimizer, _ = prepared
    for it in (10, 20, 30):
        save_checkpoint(accelerator, tmp_path, it, keep=3)
    assert newest_verified_checkpoint(tmp_path)[1] == 30 and newest_verified_checkpoint(tmp_path, 29)[1] == 20
    damaged = next(p for p in (tmp_path / "checkpoints" / "iter_000020").iterdir() if p.name != "manifest.json")
    damaged.write_bytes(damaged.read_bytes()[:-1])
    assert newest_verified_checkpoint(tmp_path, 25)[1] == 10 and newest_verified_checkpoint(tmp_path, 9) is None


def test_an_iteration_without_rows_is_not_a_nan_alarm():
    """Every group dropped on env errors: NaN means of nothing, not a collapse; a NaN with rows still fires."""
    rows = healthy_stream(0)[:8]
    nan = float("nan")
    rows[3].update({"rollout/num_rows": 0, "rollout/success_rate": nan, "rollout/episode_return": nan,
                    "rollout/advantage_abs": nan, "actor/grad_norm": nan, "actor/pg_loss": nan})
    rows[5].update({"rollout/num_rows": 12, "actor/grad_norm": nan})
    steps = run(CollapseMonitor(CollapseConfig(warmup=5)), rows)
    assert [s.iteration for s in steps if s.signals] == [6]
