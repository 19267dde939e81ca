"""Do the scripts' defaults learn? ``algos/sft.py`` then every RL script, each with its defaults, per seed; the
start and final models on the same held-out rooms; the table into docs/algorithms.md.

Per seed: ``python algos/sft.py --seed S`` (its defaults: the greedy teacher's plans, 1,500 steps), then for every
script ``python algos/<script>.py --model-path <that BC folder> --seed S`` with its defaults. Both the BC start and
the run's final model play the same held-out task seeds with the run's own settings (env, turns, prompt, response
budget, from its args.json), greedily, as eval.mini_arena evaluates; the paired gain is a Student-t 95 % interval
over the per-room differences. Wall and CPU seconds are the run's process (children included). Finished runs and
evaluations are kept under --out and reused (delete a folder to redo it), so the command resumes where it stopped.
The table holds the rows of ``--record`` (benchmarks/results/bench_defaults.json, committed: the measurements behind
docs/algorithms.md, with their CPU) updated by every finished run under --out, a (script, seed) measured again
replacing its recorded row; the updated rows are written back to the record.

    python benchmarks/bench_defaults.py                              # sft + 10 scripts x seeds 1-3 (hours)
    python benchmarks/bench_defaults.py --scripts grpo sampo --seeds 1
    python benchmarks/bench_defaults.py --table-only                 # the table of the finished runs, into --doc

Not a test (a test runs a short smoke of this command): the numbers depend on the machine and its load, which is why
the table names the CPU beside the times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("grpo", "gspo", "sapo", "cispo", "gigpo", "empg", "dapo", "sampo", "rloo", "ppo")
START, END = "<!-- bench_defaults:start -->", "<!-- bench_defaults:end -->"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def timed(cmd: list[str], log: Path) -> dict[str, float]:
    """Run ``cmd`` (output to ``log``); its wall and CPU seconds (user + system of the finished child) and the
    machine's 1-minute load average at its start and end (wall time on a busy machine is not the run's own)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    before, t0, load = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter(), os.getloadavg()[0]
    with log.open("w") as out:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {shlex.join(cmd)}\n{log.read_text()[-2000:]}")
    return {"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "load": [load, os.getloadavg()[0]]}


def held_out_wins(model_dir: Path, run_args: dict, num_seeds: int) -> list[int]:
    """Greedy outcome (1 = solved) on held-out task seeds EVAL_SEED_OFFSET + 0..N-1 with the run's settings."""
    import wrappers
    from arena_envs import held_out_split
    from arena_train.rollout import EVAL_SEED_OFFSET
    from eval.evaluate import hf_policy, load_model

    (env_id,) = run_args["env_id"]  # the defaults train on one env
    model, tokenizer = load_model(str(model_dir), device="cpu")
    policy = hf_policy(model, tokenizer, greedy=True, max_new_tokens=run_args["max_response_tokens"],
                       max_prompt_tokens=run_args["max_prompt_tokens"], batch_size=256)
    seeds = [EVAL_SEED_OFFSET + k for k in range(num_seeds)]
    rollout = wrappers.GroupRollout(
        lambda: wrappers.make_env(env_id, history_length=run_args["history_length"],
                                  format_penalty=run_args["format_penalty"], prompt_style=run_args["prompt_style"],
                                  split=held_out_split(env_id)), len(seeds), 1)
    rollout.reset(seeds)
    rollout.run(policy, run_args["max_turns"])
    return [int(ep.won) for ep in rollout.episodes()]  # one per task seed, in seed order


def cached(path: Path, make) -> dict:
    if path.is_file():
        return json.loads(path.read_text())
    value = make()
    path.write_text(json.dumps(value))
    return value


def bench_seed(args: argparse.Namespace, seed: int) -> list[dict]:
    from arena_train.stats import mean_ci

    folder = args.out / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    bc = folder / "bc"
    threads = ["--torch-threads", str(args.torch_threads)]
    if args.table_only and not (folder / "sft_time.json").is_file():
        return []
    sft = cached(folder / "sft_time.json", lambda: timed(
        [sys.executable, "algos/sft.py", "--seed", str(seed), "--output-dir", str(bc), "--overwrite", *threads,
         *args.sft_args], folder / "sft.log"))
    if not (bc / "sft_summary.json").is_file():
        raise SystemExit(f"{bc}: no finished sft.py run (its time is recorded in {folder / 'sft_time.json'}: "
                         "delete that file to run it again)")
    rows = [{"script": "sft", "seed": seed, **sft,
             "validation": json.loads((bc / "sft_summary.json").read_text())["best_eval_success_rate"]}]
    for script in args.scripts:
        run_dir = folder / script
        done = run_dir / "bench.json"
        if args.table_only and not done.is_file():
            continue
        if not done.is_file():
            print(f"[seed {seed}] {script}", flush=True)
            timing = timed([sys.executable, f"algos/{script}.py", "--model-path", str(bc), "--seed", str(seed),
                            "--output-dir", str(folder), "--run-name", script, "--overwrite", *threads,
                            *args.rl_args], folder / f"{script}.log")
            done.write_text(json.dumps(timing))
        run_args = json.loads((run_dir / "args.json").read_text())
        key = json.dumps({k: run_args[k] for k in ("env_id", "max_response_tokens", "max_prompt_tokens",
                                                   "history_length", "format_penalty", "prompt_style", "max_turns")},
                         sort_keys=True)
        starts = cached(folder / "start_wins.json", dict)  # by the settings the start was played with
        if key not in starts:
            starts[key] = held_out_wins(bc, run_args, args.eval_seeds)
            (folder / "start_wins.json").write_text(json.dumps(starts))
        if not (run_dir / "final_wins.json").is_file():
            (run_dir / "final_wins.json").write_text(json.dumps(held_out_wins(run_dir / "final", run_args,
                                                                              args.eval_seeds)))
        final = json.loads((run_dir / "final_wins.json").read_text())
        start = starts[key][:len(final)]
        rows.append({"script": script, "seed": seed, **json.loads(done.read_text()),
                     "iterations": run_args["num_iterations"], "rooms": len(final),
                     "streams": run_args.get("episode_streams", False),
                     "start": sum(start) / len(start), "final": sum(final) / len(final),
                     "gain": mean_ci([f - s for s, f in zip(start, final)]).as_dict()})
    return rows


def table(rows: list[dict], cpu: str, threads: int) -> str:
    def pct(x: float) -> str:
        return f"{100 * x:.1f}"

    sft = [r for r in rows if r["script"] == "sft"]
    def load(r: dict) -> str:
        return "–" if "load" not in r else f"{r['load'][0]:.1f} / {r['load'][1]:.1f}"

    lines = [f"CPU: {cpu}; torch threads per process: {threads or 'all cores'}; one process of this benchmark at a "
             "time\n(load: the machine's 1-minute load average at the run's start / end).", ""]
    lines += ["| seed | sft.py wall s | CPU s | load | validation success |", "|---|---|---|---|---|"]
    lines += [f"| {r['seed']} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} | {load(r)} | {r['validation']:.2f} |"
              for r in sft]
    lines += ["", "| script | seed | iterations | start % | final % | paired gain (points, 95 %) | rooms | wall s "
              "| CPU s | load | episode streams |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted((r for r in rows if r["script"] != "sft"), key=lambda r: (SCRIPTS.index(r["script"])
                                                                               if r["script"] in SCRIPTS else 99,
                                                                               r["seed"])):
        g = r["gain"]
        lines.append(f"| {r['script']} | {r['seed']} | {r['iterations']} | {pct(r['start'])} | {pct(r['final'])} "
                     f"| {100 * g['mean']:+.1f} [{100 * g['low']:+.1f}, {100 * g['high']:+.1f}] | {r['rooms']} "
                     f"| {r['wall_s']:.0f} | {r['cpu_s']:.0f} | {load(r)} | {'on' if r.get('streams') else 'off'} |")
    return "\n".join(lines)


def write_doc(doc: Path, text: str) -> None:
    """Replace the text between the bench markers of ``doc`` (appended with the markers if they are missing)."""
    old = doc.read_text() if doc.is_file() else ""
    block = f"{START}\n{text}\n{END}"
    if START in old and END in old:
        new = old[:old.index(START)] + block + old[old.index(END) + len(END):]
    else:
        new = old + ("\n" if old and not old.endswith("\n") else "") + block + "\n"
    doc.write_text(new)


def read_record(path: Path, cpu: str, threads: int) -> list[dict]:
    """The recorded rows, if they were measured on this CPU model with these threads (a table mixes no machines)."""
    if not path.is_file():
        return []
    record = json.loads(path.read_text())
    if (record["cpu"], record["torch_threads"]) != (cpu, threads):
        print(f"{path}: measured on {record['cpu']!r} with {record['torch_threads']} threads, not {cpu!r} with "
              f"{threads}: its rows are left out of the table", file=sys.stderr)
        return []
    return record["rows"]


def merge(recorded: list[dict], measured: list[dict]) -> list[dict]:
    """``recorded`` with every (script, seed) of ``measured`` replaced by the new measurement."""
    new = {(r["script"], r["seed"]) for r in measured}
    return [r for r in recorded if (r["script"], r["seed"]) not in new] + measured


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scripts", nargs="+", default=list(SCRIPTS), choices=SCRIPTS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--eval-seeds", type=int, default=300, help="held-out rooms per evaluation")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="threads of every process (1: one core; 0: the scripts' default, all cores)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_defaults")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "algorithms.md",
                        help="the file whose bench_defaults markers receive the table")
    parser.add_argument("--record", type=Path, default=ROOT / "benchmarks" / "results" / "bench_defaults.json",
                        help="earlier rows kept in the table until their (script, seed) is measured again")
    parser.add_argument("--sft-args", default="", help="extra sft.py flags, one quoted string (a smoke run's)")
    parser.add_argument("--rl-args", default="", help="extra flags for every RL script, one quoted string")
    parser.add_argument("--table-only", action="store_true",
                        help="train nothing: only the table of the finished runs (evaluating any not yet evaluated)")
    args = parser.parse_args(argv)
    if args.eval_seeds < 1 or args.torch_threads < 0:
        parser.error("--eval-seeds must be >= 1 and --torch-threads >= 0")
    args.sft_args, args.rl_args = shlex.split(args.sft_args), shlex.split(args.rl_args)
    if not args.table_only:
        for seed in args.seeds:
            bench_seed(args, seed)
    # the table holds every finished run under --out (a partial call must not drop the others' rows)
    seeds = sorted(int(p.name[4:]) for p in args.out.glob("seed*") if p.name[4:].isdigit())
    every = argparse.Namespace(**{**vars(args), "table_only": True, "scripts": list(SCRIPTS)})
    rows = merge(read_record(args.record, cpu_model(), args.torch_threads),
                 [row for seed in seeds for row in bench_seed(every, seed)])
    text = table(rows, cpu_model(), args.torch_threads)
    write_doc(args.doc, text)
    args.record.parent.mkdir(parents=True, exist_ok=True)
    args.record.write_text(json.dumps({"cpu": cpu_model(), "torch_threads": args.torch_threads, "rows": rows},
                                      indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
