"""The Practitioner's Guide's studies at CPU scale — ``python -m eval.practitioner``.

One pipeline for both questions of docs/practitioner.md that need training runs:

* ``--preset density`` — reward density: GRPO, RLOO and PPO, each with ``--reward-density sparse`` and ``dense``,
  on ``ARL/TextWorld-Mini-v0`` (the cooking game: the score rises on every quest step, so dense rewards differ
  from sparse ones), evaluated on the same env's held-out games;
* ``--preset transfer`` — world complexity: GRPO trained on the small custom worlds (``ARL/TextWorld-Small-v0``,
  the guide's w2-o3-q4) and evaluated on held-out small, medium and large worlds (``-Small``, ``-Medium``,
  ``-Large``: w2-o3-q4, w4-o6-q8, w8-o12-q16).

One BC start on ``--env-id`` (the mini-arena's BC with its early stop, ``eval.mini_arena.run_bc``), shared by every
run (or one per pipeline seed: ``--bc-per-seed``); each run is ``algos/<method>.py --reward-density <d>`` from it
(the mini-arena's RL command line); then the BC start and every run are evaluated greedily on the SAME held-out
task seeds of every ``--eval-env-ids`` env (success with Wilson intervals, mean score = env return). Over seeds:
mean with a Student-t interval, and the gain over the BC start paired per task seed, pooled over seeds.
Everything derives from the seeds; a finished BC start or run found in ``--out`` is reused (``--resume``).

Output: ``<out>/results.json``, ``<out>/report.md``, ``<out>/practitioner.png``.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from arena_train.rollout import EVAL_SEED_OFFSET
from arena_train.stats import mean_ci, pct_ci
from eval import mini_arena

#: Values for the ``Args`` fields left unset (None), per preset.
PRESETS: dict[str, dict[str, Any]] = {
    "density": dict(env_id="ARL/TextWorld-Mini-v0", eval_env_ids=["ARL/TextWorld-Mini-v0"],
                    methods=["grpo", "rloo", "ppo"], densities=["sparse", "dense"]),
    "transfer": dict(env_id="ARL/TextWorld-Small-v0",
                     eval_env_ids=["ARL/TextWorld-Small-v0", "ARL/TextWorld-Medium-v0", "ARL/TextWorld-Large-v0"],
                     methods=["grpo"], densities=["sparse"]),
}
#: CPU-scale training settings shared by both presets (the mini-arena's tiny model and BC recipe, scaled down).
#: Sized for a shared 2-core machine: a few CPU-minutes per preset and seed (docs/practitioner.md has the timings).
#: BC is validated once, at its last step: at this scale validation success is often 0 at every check, and the
#: mini-arena keeps the first of tied checkpoints.
COMMON: dict[str, Any] = dict(bc_episodes=100, bc_max_steps=600, bc_batch_size=16, bc_learning_rate=1e-3,
                              bc_target=1.0, bc_eval_every=600, bc_eval_start=600, bc_eval_episodes=10,
                              rl_iterations=3, num_groups=4, group_size=4, learning_rate=1e-4, temperature=0.7,
                              mini_batch_size=64, eval_episodes=20, max_response_tokens=24,
                              max_prompt_tokens=1024)


@dataclass
class Args:
    """BC start -> (method x reward density) RL runs -> held-out evaluation on one or more envs, per seed."""

    preset: Literal["density", "transfer"] = "density"
    """fills every field left unset: the reward-density comparison or the small-to-large world transfer"""
    seeds: list[int] = field(default_factory=lambda: [1])
    """pipeline seeds (RL runs; BC too with --bc-per-seed)"""
    out: Path = Path("runs/practitioner")
    """output folder: <out>/seed<s>/{bc,<density>/<method>}, results.json, report.md, practitioner.png"""
    env_id: str | None = None
    """env of BC and RL (its train split)"""
    eval_env_ids: list[str] | None = None
    """envs evaluated on their held-out split (the BC start and every run, same task seeds)"""
    methods: list[str] | None = None
    """algos/<method>.py run from the BC start (methods with --reward-density: grpo, rloo, ppo)"""
    densities: list[Literal["sparse", "dense"]] | None = None
    """--reward-density of each run"""
    bc_episodes: int | None = None
    """noisy-expert episodes of BC data (train task seeds 0..N-1)"""
    bc_max_steps: int | None = None
    """BC optimizer steps at most"""
    bc_batch_size: int | None = None
    """BC examples per step"""
    bc_learning_rate: float | None = None
    """BC peak learning rate"""
    bc_target: float | None = None
    """stop BC once greedy validation success (train games) >= this"""
    bc_eval_every: int | None = None
    """BC validation every N steps"""
    bc_eval_start: int | None = None
    """first validated BC step"""
    bc_eval_episodes: int | None = None
    """validation episodes per BC check"""
    rl_iterations: int | None = None
    """RL iterations per run"""
    num_groups: int | None = None
    """RL groups per iteration"""
    group_size: int | None = None
    """RL episodes per group"""
    learning_rate: float | None = None
    """RL learning rate"""
    temperature: float | None = None
    """RL rollout temperature"""
    mini_batch_size: int | None = None
    """RL rows per optimizer step"""
    eval_episodes: int | None = None
    """held-out greedy episodes per evaluated env (task seeds from EVAL_SEED_OFFSET)"""
    max_response_tokens: int | None = None
    """generation budget per turn"""
    max_prompt_tokens: int | None = None
    """prompt budget of BC, RL and evaluation (TextWorld's first observation alone is ~600 tokens)"""
    rl_args: list[str] = field(default_factory=list)
    """extra flags for every RL run, given last: --rl-args --kl-coef 0"""
    torch_threads: int = 1
    """CPU threads (1 on a shared machine)"""
    bc_per_seed: bool = False
    """one BC start per pipeline seed (<out>/seed<s>/bc); default: one BC start (seed = the first of --seeds,
    <out>/bc) shared by every seed, so seeds differ only in their RL runs"""
    resume: bool = False
    """reuse the BC starts and runs already finished in --out (evaluation is always redone)"""
    report_only: bool = False
    """run nothing: summarize <out>/results.json again and rewrite report.md and practitioner.png"""


def resolve(args: Args) -> Args:
    for key, value in {**COMMON, **PRESETS[args.preset]}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("methods", "densities", "eval_env_ids", "seeds"):
        if not getattr(args, key):
            raise SystemExit(f"--{key.replace('_', '-')} needs at least one value")
    for method in args.methods:
        if not (mini_arena.ROOT / "algos" / f"{method}.py").is_file():
            raise SystemExit(f"no RL script algos/{method}.py")
    return args


def arena_args(args: Args) -> mini_arena.Args:
    """The mini-arena's settings for these (its tiny profile, overridden by the study's values)."""
    shared = ("env_id", "bc_episodes", "bc_max_steps", "bc_batch_size", "bc_learning_rate", "bc_target",
              "bc_eval_every", "bc_eval_start", "bc_eval_episodes", "rl_iterations", "num_groups", "group_size",
              "learning_rate", "temperature", "mini_batch_size", "eval_episodes", "max_response_tokens",
              "max_prompt_tokens", "torch_threads")
    # the studies' BC start is the env's own expert (TextWorld has no other teacher), as in their published figures
    # one BC thread and one RL process per run, as the studies were measured (--torch-threads applies to each)
    arena = mini_arena.Args(profile="tiny", out=args.out, rl_eval_every=0, rl_eval_episodes=1, teacher="expert",
                            think_horizon=0, bc_threads=1, rl_processes=1, **{k: getattr(args, k) for k in shared})
    return mini_arena.resolve(arena)


def run_key(method: str, density: str) -> str:
    return f"{method}/{density}"


def model_names(methods: list[str], densities: list[str]) -> list[str]:
    """The BC start, then every run in the order the studies train them."""
    return ["bc"] + [run_key(m, d) for d in densities for m in methods]


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its finished children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def bc_start(args: Args, arena: mini_arena.Args, seed: int) -> tuple[Path, dict[str, Any]]:
    """(folder, summary) of the BC start that ``seed``'s runs start from; trained unless it is already there."""
    bc_seed = seed if args.bc_per_seed else args.seeds[0]
    bc_dir = args.out / (f"seed{seed}" if args.bc_per_seed else "") / "bc"
    if (bc_dir / "bc_summary.json").is_file() and (args.resume or not args.bc_per_seed and seed != args.seeds[0]):
        print(f"[seed {seed}] BC: reusing {bc_dir}", flush=True)
        return bc_dir, json.loads((bc_dir / "bc_summary.json").read_text())
    print(f"[seed {seed}] BC on {args.env_id} (seed {bc_seed})", flush=True)
    return bc_dir, mini_arena.run_bc(arena, bc_seed, bc_dir)


def run_seed(args: Args, arena: mini_arena.Args, seed: int, cache: dict[tuple[str, str], Any]) -> dict[str, Any]:
    seed_dir = args.out / f"seed{seed}"
    timing: dict[str, float] = {}
    t0 = time.perf_counter()
    bc_dir, bc = bc_start(args, arena, seed)
    timing["bc_s"] = time.perf_counter() - t0
    print(f"[seed {seed}] BC start: step {bc['step']}, validation success {bc['val_success']:.3f}", flush=True)
    models = {"bc": str(bc_dir)}
    runs: dict[str, Any] = {}
    for density in args.densities:
        for method in args.methods:
            key = run_key(method, density)
            runs_dir = seed_dir / density
            final = runs_dir / method / "final"
            run_args = dataclasses.replace(arena, rl_script=method, rl_args=["--reward-density", density,
                                                                             *args.rl_args])
            t1 = time.perf_counter()
            if args.resume and final.is_dir() and (runs_dir / method / "metrics.jsonl").is_file():
                print(f"[seed {seed}] {key}: reusing {final}", flush=True)
                rl = {"command": mini_arena.rl_command(run_args, seed, bc_dir, runs_dir),
                      "metrics": mini_arena.training_lines((runs_dir / method / "metrics.jsonl").read_text()),
                      "model": str(final)}
            else:
                print(f"[seed {seed}] {key}: algos/{method}.py, {args.rl_iterations} iterations", flush=True)
                rl = mini_arena.run_rl(run_args, seed, bc_dir, runs_dir)
            timing[f"rl_s/{key}"] = time.perf_counter() - t1
            runs[key] = {"command": " ".join(rl["command"]), "model": rl["model"],
                         "rollout_success": [m.get("rollout/success_rate") for m in rl["metrics"]]}
            models[key] = rl["model"]
    t2 = time.perf_counter()
    task_seeds = [EVAL_SEED_OFFSET + k for k in range(args.eval_episodes)]
    evals: dict[str, dict[str, Any]] = {}
    for env_id in args.eval_env_ids:
        env_args = dataclasses.replace(arena, env_id=env_id)
        evals[env_id] = {}
        for name, path in models.items():
            if (env_id, path) not in cache:  # a shared BC start is evaluated once (greedy: the same episodes)
                result, wins = mini_arena.evaluate_model(env_args, path, name, task_seeds)
                cache[env_id, path] = {"success": result.success.as_dict(), "score": result.score.as_dict(),
                                       "valid_action": result.valid_action.as_dict(), "wins": wins}
            evals[env_id][name] = cache[env_id, path]
            result = evals[env_id][name]
            print(f"[seed {seed}] {env_id} {name}: success {pct_ci(result['success'])}, "
                  f"score {result['score']['mean']:.2f}", flush=True)
    timing["eval_s"] = time.perf_counter() - t2
    return {"seed": seed, "bc": bc, "runs": runs, "eval": evals, "timing": timing}


def summarize(per_seed: list[dict[str, Any]], eval_env_ids: list[str], names: list[str]) -> dict[str, Any]:
    """Per (env, model): mean success and score over seeds (Student-t), and the gain over the BC start paired per
    task seed, pooled over pipeline seeds."""
    out: dict[str, Any] = {}
    for env_id in eval_env_ids:
        out[env_id] = {}
        for name in names:
            rows = [r["eval"][env_id][name] for r in per_seed]
            entry = {"success": mean_ci([x["success"]["mean"] for x in rows]).as_dict(),
                     "score": mean_ci([x["score"]["mean"] for x in rows]).as_dict(),
                     "valid_action": mean_ci([x["valid_action"]["mean"] for x in rows]).as_dict(),
                     "per_seed_success": [x["success"]["mean"] for x in rows]}
            if name != "bc":
                pairs = [b - a for r in per_seed
                         for a, b in zip(r["eval"][env_id]["bc"]["wins"], r["eval"][env_id][name]["wins"])]
                entry["paired_gain"] = mean_ci(pairs).as_dict()
            out[env_id][name] = entry
    return out


def label(name: str) -> str:
    if name == "bc":
        return "BC start"
    method, density = name.split("/")
    return f"{method.upper()} {density}"


def write_report(results: dict[str, Any], out: Path) -> str:
    a, summary = results["args"], results["summary"]
    names = model_names(a["methods"], a["densities"])
    seeds = ", ".join(str(s) for s in a["seeds"])
    start = ("one BC start per seed shared by its runs" if a["bc_per_seed"] else
             f"one BC start (seed {a['seeds'][0]}) shared by every run")
    lines = [f"# Practitioner's Guide study: {a['preset']}", "",
             f"BC and RL on `{a['env_id']}` (train games); tiny model (mini-arena `tiny` profile), {start}; "
             f"{a['rl_iterations']} RL iterations of {a['num_groups']} x {a['group_size']} episodes per run; "
             f"seeds {seeds}.",
             f"Held-out greedy evaluation: {a['eval_episodes']} task seeds from {EVAL_SEED_OFFSET} per env, the same "
             "for every model. Success, score and valid actions (share of turns whose action the game accepted): "
             "mean over seeds with a 95 % Student-t interval; gain: held-out "
             "success minus the BC start's, paired per task seed and pooled over seeds (95 % t-interval).", ""]
    for env_id in a["eval_env_ids"]:
        lines += [f"## {env_id}", "", "| model | success % | score (env return) | valid actions % "
                  "| success per seed % | paired gain over BC (points) |", "|---|---|---|---|---|---|"]
        for name in names:
            e = summary[env_id][name]
            per = " / ".join(f"{100 * x:.0f}" for x in e["per_seed_success"])
            gain = pct_ci(e["paired_gain"]) if "paired_gain" in e else "-"
            sc = e["score"]
            lines.append(f"| {label(name)} | {pct_ci(e['success'])} | {sc['mean']:.2f} [{sc['low']:.2f}, "
                         f"{sc['high']:.2f}] | {100 * e['valid_action']['mean']:.0f} | {per} | {gain} |")
        lines.append("")
    if len(a["eval_env_ids"]) > 1:
        lines += ["## Transfer (success %, mean over seeds)", "",
                  "| model | " + " | ".join(e.split("/")[-1] for e in a["eval_env_ids"]) + " |",
                  "|---|" + "---|" * len(a["eval_env_ids"])]
        for name in names:
            cells = [pct_ci(summary[e][name]["success"]) for e in a["eval_env_ids"]]
            lines.append(f"| {label(name)} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [f"Wall time {results['wall_s'] / 60:.1f} min, CPU time {results['cpu_s'] / 60:.1f} min "
              f"(this process and its children).", "", "![results](practitioner.png)", ""]
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    return text


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a, summary = results["args"], results["summary"]
    names = model_names(a["methods"], a["densities"])
    envs = a["eval_env_ids"]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(names) * len(envs)), 3.4))
    width = 0.8 / len(envs)
    for k, env_id in enumerate(envs):
        means = [100 * summary[env_id][n]["success"]["mean"] for n in names]
        err = [[100 * (summary[env_id][n]["success"]["mean"] - max(0.0, summary[env_id][n]["success"]["low"]))
                for n in names],
               [100 * (min(1.0, summary[env_id][n]["success"]["high"]) - summary[env_id][n]["success"]["mean"])
                for n in names]]
        ax.bar(np.arange(len(names)) + k * width, means, width, yerr=err, capsize=2, label=env_id)
    ax.set_xticks(np.arange(len(names)) + width * (len(envs) - 1) / 2, [label(n) for n in names], fontsize=7)
    ax.set(ylabel="held-out success %", ylim=(0, 100), title=f"{a['preset']} study (mean over seeds, 95 % t)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rewrite_report(out: Path) -> dict[str, Any]:
    """Summary, report and plot again from ``<out>/results.json`` (its per-seed records)."""
    path = out / "results.json"
    if not path.is_file():
        raise SystemExit(f"--report-only: no results.json in {out}")
    results = json.loads(path.read_text())
    a = results["args"]
    names = model_names(a["methods"], a["densities"])
    results["summary"] = summarize(results["per_seed"], a["eval_env_ids"], names)
    path.write_text(json.dumps(results, indent=1, default=str))
    plot(results, out / "practitioner.png")
    print(write_report(results, out))
    return results


def main(args: Args) -> dict[str, Any]:
    import torch
    from transformers.utils import logging as hf_logging

    if args.report_only:
        return rewrite_report(args.out)
    args = resolve(args)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.torch_threads)
    hf_logging.disable_progress_bar()
    arena = arena_args(args)
    start, cpu0 = time.perf_counter(), cpu_seconds()
    cache: dict[tuple[str, str], Any] = {}
    per_seed = [run_seed(args, arena, seed, cache) for seed in args.seeds]
    names = model_names(args.methods, args.densities)
    results = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(args).items()},
               "per_seed": per_seed, "summary": summarize(per_seed, args.eval_env_ids, names),
               "wall_s": time.perf_counter() - start, "cpu_s": cpu_seconds() - cpu0}
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    plot(results, args.out / "practitioner.png")
    print(write_report(results, args.out))
    return results


if __name__ == "__main__":
    import tyro

    from arena_train.cli import split_passthrough

    own_argv, rl_argv = split_passthrough(sys.argv[1:], "--rl-args")
    main(dataclasses.replace(tyro.cli(Args, args=own_argv), rl_args=rl_argv))
