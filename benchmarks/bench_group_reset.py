"""ALFWorld: what one group's resets cost, and the temporary space its engines hold, with TextWorld's stock
``PddlEnv`` under every env (each env parses and translates its game, and copies fast_downward's library) against
the shared engine (``arena_envs.alfworld_env.shared``: one parse and translation per game and process, one library
per process, no copy).

A group is ``--group-size`` envs in one process (as in-process rollouts and each env worker hold them), reset with
one task seed: all play the same game. The same envs then reset for a second group (another seed, another game),
as a rollout's envs do at the next iteration. Temporary space: libdownward files mapped into the process that are
not the installed one (deleted temporary copies) times the library's size.

    python benchmarks/bench_group_reset.py --group-size 8
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time

from bench_env_workers import cpu_name

SEEDS = (3, 1)  # two groups on two different games of the valid_seen split (games_per_task=1)


def stock_engine():
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.envs.pddl import PddlEnv

    infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=False, extras=["gamefile"])
    return AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))


def temp_copies() -> int:
    from fast_downward.interface import DOWNWARD_LIB_PATH

    with open("/proc/self/maps") as f:
        paths = {line.split(None, 5)[5].strip() for line in f if "libdownward" in line}
    return len(paths - {DOWNWARD_LIB_PATH})


def run(engine: str, group_size: int, cache: str) -> dict:
    from fast_downward.interface import DOWNWARD_LIB_PATH

    from arena_envs.alfworld_env import ALFWorldEnv

    envs = [ALFWorldEnv(split="valid_seen", cache_dir=cache, games_per_task=1) for _ in range(group_size)]
    if engine == "stock":
        for env in envs:
            env._engine = stock_engine()
    out = {"engine": engine, "group_size": group_size, "groups": []}
    for seed in SEEDS:
        times = []
        for env in envs:
            t = time.perf_counter()
            env.reset(seed=seed)
            times.append(time.perf_counter() - t)
        out["groups"].append({"seed": seed, "group_s": sum(times), "first_reset_s": times[0],
                              "other_resets_mean_s": sum(times[1:]) / max(1, len(times) - 1)})
    copies = temp_copies()
    out.update(temp_copies=copies, temp_mb=copies * os.path.getsize(DOWNWARD_LIB_PATH) / 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--engine", choices=["stock", "shared"], nargs="+", default=["stock", "shared"])
    parser.add_argument("--cache", default=None, help="ALFWorld game cache (default: the user's)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    print(f"{cpu_name()}, {len(os.sched_getaffinity(0))} cores, load average {os.getloadavg()[0]:.1f} at the start")
    results = {"cpu": cpu_name(), "load_at_start": os.getloadavg()[0], "runs": []}
    ctx = multiprocessing.get_context("spawn")
    for engine in args.engine:
        with ctx.Pool(1) as pool:  # a fresh process each: nothing loaded, no library mapped yet
            r = pool.apply(run, (engine, args.group_size, args.cache))
        results["runs"].append(r)
        for g in r["groups"]:
            print(f"{engine:6s} group of {args.group_size} (seed {g['seed']}): {g['group_s']:.2f} s "
                  f"(first reset {g['first_reset_s']:.2f} s, others {g['other_resets_mean_s']:.3f} s each)")
        print(f"{engine:6s} temporary libdownward copies: {r['temp_copies']} ({r['temp_mb']:.1f} MB)")
    results["load_at_end"] = os.getloadavg()[0]
    print(f"load average {results['load_at_end']:.1f} at the end")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
