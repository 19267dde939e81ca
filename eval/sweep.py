"""Grids over the four design dimensions × methods × seeds × envs, from a TOML file.

``python -m eval.sweep CONFIG.toml run [--index I] [--stop-on-error]`` runs the grid
locally, one run after another. It is resumable: a run whose directory holds a
completion marker is skipped — ``DONE`` (written by the sweep when the command exits 0)
or ``summary.json`` (written by a training script after saving its final model).
``print`` lists the launch commands (one per line, for a cluster or GNU parallel),
``array`` prints a SLURM array script whose task I runs ``run --index I``, and
``collect`` writes every run's stability summary into one results file (``run``
does this too when it finishes). See ``eval/configs/four_dims.toml`` for the format.
DAPO's ``--advantage`` flag follows the issue's mapping; remap it in a config's
``[methods.DAPO_GRPO]`` table if dapo.py names it differently.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from arena_train.run import RUN_ENTRIES
from eval.runlog import METRICS_FILE, SWEEP_META_FILE, RunLog
from eval.stability import StabilityConfig, analyze

DONE_MARKER = "DONE"
#: Any of these in a run directory means the run finished (``summary.json``: algos/*.py).
COMPLETION_MARKERS = (DONE_MARKER, "summary.json")
FAILED_MARKER = "FAILED"
LOG_FILE = "sweep.log"


@dataclass(frozen=True)
class Method:
    """How a method of the paper's table maps onto a script (or any command)."""

    script: str | None = None
    args: tuple[str, ...] = ()
    dimension: str = ""
    command: tuple[str, ...] | None = None
    """replaces ``launcher script args ...`` entirely; placeholders as in ``Job.argv``"""


#: The rows of the paper's results table (docs/algorithms.md) plus RLOO and PPO.
METHODS: dict[str, Method] = {
    "GRPO": Method("algos/grpo.py", (), "Base"),
    "GRPO_ST": Method("algos/grpo.py", ("--loss-agg-mode", "seq-mean-token-mean"), "Loss Agg"),
    "GRPO_SM": Method("algos/grpo.py", ("--use-seq-mask",), "IS"),
    "GSPO": Method("algos/gspo.py", (), "IS"),
    "SAPO": Method("algos/sapo.py", (), "IS"),
    "CISPO": Method("algos/cispo.py", (), "IS"),
    "GiGPO": Method("algos/gigpo.py", (), "Advantage"),
    "EMPG": Method("algos/empg.py", (), "Advantage"),
    "DAPO_GRPO": Method("algos/dapo.py", ("--advantage", "grpo"), "Dyn. sampling"),
    "DAPO_GiGPO": Method("algos/dapo.py", ("--advantage", "gigpo"), "Dyn. sampling"),
    "SAMPO": Method("algos/sampo.py", (), "Ours"),
    "RLOO": Method("algos/rloo.py", (), "Advantage"),
    "PPO": Method("algos/ppo.py", (), "Advantage"),
}

#: Flags every training script takes for the grid point's env, seed and output location.
DEFAULT_FLAGS = {"env": "--env-id", "seed": "--seed", "run_name": "--run-name", "runs_dir": "--output-dir"}


class SweepConfigError(ValueError):
    """The sweep file is missing, not TOML, or names something unknown."""


@dataclass(frozen=True)
class Job:
    """One grid point: a single training run."""

    index: int
    name: str
    method: str
    dimension: str
    env: str
    seed: int
    overrides: dict[str, str]
    run_dir: Path
    argv: list[str]
    script: bool = False
    """a training script (takes --resume / --overwrite), not a free-form command"""

    @property
    def done(self) -> bool:
        return any((self.run_dir / marker).is_file() for marker in COMPLETION_MARKERS)

    @property
    def status(self) -> str:
        if self.done:
            return "done"
        return "failed" if (self.run_dir / FAILED_MARKER).is_file() else "pending"


@dataclass
class Sweep:
    name: str
    runs_dir: Path
    results: Path
    jobs: list[Job] = field(default_factory=list)


def _str_list(value: Any, where: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, list):
        raise SweepConfigError(f"{where} must be a list, got {value!r}")
    return [str(v) for v in value]


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-._" else "-" for c in text).strip("-")


def _substitute(arg: str, values: dict[str, str]) -> str:
    # Plain replacement, not str.format: commands (python -c ...) may contain braces.
    for key, value in values.items():
        arg = arg.replace("{" + key + "}", value)
    return arg


def load_sweep(path: str | Path, launcher: str | None = None) -> Sweep:
    """Parse a sweep file into the ordered list of jobs (methods × envs × overrides × seeds)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise SweepConfigError(f"{path}: {err}") from err
    top = raw.get("sweep", {})
    methods = dict(METHODS)
    for name, spec in raw.get("methods", {}).items():
        base = methods.get(name, Method())
        methods[name] = Method(
            spec.get("script", base.script),
            tuple(_str_list(spec["args"], f"methods.{name}.args")) if "args" in spec else base.args,
            spec.get("dimension", base.dimension),
            tuple(_str_list(spec["command"], f"methods.{name}.command")) if "command" in spec else base.command,
        )
    chosen = _str_list(top.get("methods", []), "sweep.methods")
    envs = _str_list(top.get("envs", []), "sweep.envs")
    seeds = top.get("seeds", [])
    if not chosen or not envs or not seeds:
        raise SweepConfigError(f"{path}: [sweep] needs non-empty methods, envs and seeds")
    if unknown := [m for m in chosen if m not in methods]:
        raise SweepConfigError(f"{path}: unknown methods {unknown}; known: {sorted(methods)}")
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise SweepConfigError(f"{path}: seeds must be integers, got {seeds!r}")
    runs_dir = Path(top.get("runs_dir", "runs"))
    flags = {**DEFAULT_FLAGS, **raw.get("flags", {})}
    launch = shlex.split(launcher if launcher is not None else top.get("launcher", "python"))
    common = _str_list(top.get("args", []), "sweep.args")
    grid = {flag: _str_list(vals, f"grid.{flag}") for flag, vals in raw.get("grid", {}).items()}
    sweep = Sweep(str(top.get("name", path.stem)), runs_dir, Path(top.get("results", runs_dir / "results.json")))
    points = list(itertools.product(*grid.values()))
    for method, env, point, seed in itertools.product(chosen, envs, points, seeds):
        spec = methods[method]
        overrides = dict(zip(grid, point))
        parts = [method, _slug(env.split("/")[-1])] + [_slug(f"{k.lstrip('-')}={v}") for k, v in overrides.items()]
        name = "__".join(parts + [f"s{seed}"])
        run_dir = runs_dir / name
        values = {"run_dir": str(run_dir), "run_name": name, "runs_dir": str(runs_dir), "seed": str(seed),
                  "env": env, "method": method}
        if spec.command is not None:
            argv = [_substitute(a, values) for a in spec.command]
        elif spec.script is None:
            raise SweepConfigError(f"{path}: method {method} has neither a script nor a command")
        else:
            argv = [*launch, spec.script, *spec.args, *itertools.chain.from_iterable(overrides.items()), *common,
                    *_str_list(raw.get("env_args", {}).get(env, []), f"env_args.{env}"),
                    *_str_list(raw.get("method_args", {}).get(method, []), f"method_args.{method}"),
                    flags["env"], env, flags["seed"], str(seed), flags["run_name"], name,
                    flags["runs_dir"], str(runs_dir)]
            argv = [_substitute(a, values) for a in argv]
        sweep.jobs.append(Job(len(sweep.jobs), name, method, spec.dimension, env, int(seed), overrides, run_dir, argv,
                              script=spec.command is None))
    return sweep


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))


def rerun_flags(run_dir: Path) -> list[str]:
    """A script run killed or failed earlier continues from its last checkpoint; one without a checkpoint starts
    over (a training script refuses a folder that holds a run unless told which)."""
    if (run_dir / "checkpoints" / "latest.json").is_file():
        return ["--resume"]
    return ["--overwrite"] if any((run_dir / name).exists() for name in RUN_ENTRIES) else []


def run_job(job: Job) -> bool:
    """Run one job to completion (output to ``sweep.log``); mark it DONE or FAILED."""
    job.run_dir.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in asdict(job).items() if k not in ("run_dir", "index")}
    _write_json(job.run_dir / SWEEP_META_FILE, meta)
    (job.run_dir / FAILED_MARKER).unlink(missing_ok=True)
    argv = [sys.executable, *job.argv[1:]] if job.argv[0] in ("python", "python3") else job.argv
    if job.script:
        argv = [*argv, *rerun_flags(job.run_dir)]
    start = time.time()
    with open(job.run_dir / LOG_FILE, "ab") as log:
        try:
            code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT).returncode
        except OSError as err:  # command not found, not executable, ...
            log.write(f"cannot start {argv[0]}: {err}\n".encode())
            code = 127
    record = {"returncode": code, "seconds": round(time.time() - start, 3), "finished": time.ctime()}
    _write_json(job.run_dir / (DONE_MARKER if code == 0 else FAILED_MARKER), record)
    return code == 0


def collect(sweep: Sweep, cfg: StabilityConfig | None = None) -> dict[str, Any]:
    """One results file for the whole sweep: labels, status and stability summary per run."""
    cfg = cfg if cfg is not None else StabilityConfig()
    runs = []
    for job in sweep.jobs:
        entry = {"name": job.name, "method": job.method, "dimension": job.dimension, "env": job.env,
                 "seed": job.seed, "overrides": job.overrides, "run_dir": str(job.run_dir),
                 "status": job.status, "stability": None}
        if (job.run_dir / METRICS_FILE).is_file():
            entry["stability"] = analyze(RunLog.load(job.run_dir), cfg).as_dict()
        runs.append(entry)
    results = {"sweep": sweep.name, "runs": runs}
    _write_json(sweep.results, results)
    return results


def run_sweep(sweep: Sweep, index: int | None = None, stop_on_error: bool = False) -> int:
    """Run pending jobs in order (or only job ``index``); returns the number that failed."""
    jobs = sweep.jobs if index is None else [sweep.jobs[index]]
    failed = 0
    for job in jobs:
        if job.done:
            print(f"[{job.index + 1}/{len(sweep.jobs)}] skip (done): {job.name}", flush=True)
            continue
        print(f"[{job.index + 1}/{len(sweep.jobs)}] run: {shlex.join(job.argv)}", flush=True)
        if not run_job(job):
            failed += 1
            print(f"  failed, see {job.run_dir / LOG_FILE}", flush=True)
            if stop_on_error:
                break
    return failed


def array_script(sweep: Sweep, config: Path, launcher: str | None) -> str:
    """A SLURM array job: task I runs grid point I through this module (so DONE is written)."""
    extra = f" --launcher {shlex.quote(launcher)}" if launcher is not None else ""
    return "\n".join([
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={_slug(sweep.name)}",
        f"#SBATCH --array=0-{len(sweep.jobs) - 1}",
        f"#SBATCH --output={sweep.runs_dir}/slurm-%A_%a.out",
        f"python -m eval.sweep {shlex.quote(str(config))} run --index \"$SLURM_ARRAY_TASK_ID\"{extra}",
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, help="sweep TOML file")
    parser.add_argument("mode", nargs="?", default="run", choices=("run", "print", "array", "collect"))
    parser.add_argument("--index", type=int, help="run only this grid point (array jobs)")
    parser.add_argument("--launcher", help='e.g. "accelerate launch --num_processes 8" (default: config or python)')
    parser.add_argument("--stop-on-error", action="store_true", help="stop at the first failed run")
    args = parser.parse_args(argv)
    try:
        sweep = load_sweep(args.config, args.launcher)
    except SweepConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.index is not None and not 0 <= args.index < len(sweep.jobs):
        print(f"error: --index {args.index} outside 0..{len(sweep.jobs) - 1}", file=sys.stderr)
        return 2
    if args.mode == "print":
        print("\n".join(shlex.join(job.argv) for job in sweep.jobs))
        return 0
    if args.mode == "array":
        print(array_script(sweep, args.config, args.launcher), end="")
        return 0
    failed = run_sweep(sweep, args.index, args.stop_on_error) if args.mode == "run" else 0
    if args.index is not None:  # array tasks run concurrently: `collect` once they are all done
        return 1 if failed else 0
    results = collect(sweep)
    counts = {s: sum(r["status"] == s for r in results["runs"]) for s in ("done", "failed", "pending")}
    print(f"{sweep.name}: {counts} -> {sweep.results}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
