"""Env throughput against worker count: episodes per second of ALFWorld, TextWorld and WebShop played in the
trainer's process (``--env-workers 0``) and in N worker processes, through ``wrappers.GroupRollout`` as training
steps them (one batch of steps per turn), with a scripted policy that costs nothing, so the time is the envs'.

Episodes run to the env's turn limit (its registration's ``max_episode_steps``: ALFWorld 50, TextWorld 8, WebShop
15), the recipe's worst case, with a fixed cycle of plausible commands (ALFWorld / TextWorld: ``look``,
``inventory``, ``go to ...``; WebShop: a search, then clicks). From the per-episode time it projects the env time
of one iteration of the paper's recipe (16 groups x 8 episodes) at 1, 2 and 16 workers: measured for the counts
the machine has cores for, and for more, the 1-worker time divided by the workers (perfect scaling: a lower
bound). It also times ALFWorld's env construction, its first reset (the game is written to the cache when new)
and later resets.

    python benchmarks/bench_env_workers.py --episodes 8 --workers 0 1 2
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import tempfile
import time

import gymnasium as gym

import arena_envs  # noqa: F401
import wrappers

COMMANDS = {
    "ARL/ALFWorld-v0": ["look", "inventory", "go to countertop 1", "go to cabinet 1", "open cabinet 1",
                        "go to fridge 1", "open fridge 1", "examine fridge 1"],
    "ARL/TextWorld-v0": ["look", "inventory", "go north", "go south", "open fridge", "take knife", "go east",
                         "go west"],
    "ARL/WebShop-v0": ["search[red cotton shirt]", "click[next >]", "click[< prev]", "click[back to search]"],
}
#: Recipe iteration: 16 groups x 8 episodes.
RECIPE_EPISODES = 16 * 8


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def make(env_id: str, cache: str):
    kwargs = {"cache_dir": cache} if env_id != "ARL/WebShop-v0" else {}
    return wrappers.make_env(env_id, history_length=2, prompt_style="arlarena", split="train", **kwargs)


def episodes_per_s(env_id: str, workers: int, episodes: int, cache: str, repeats: int) -> dict:
    """Best of ``repeats`` timed batches of ``episodes`` episodes on task seeds 0 .. episodes - 1, after one
    warm-up batch on the same seeds (envs made, ALFWorld's games in the cache: ``alfworld_reset_cost`` times
    generating them)."""
    turns = gym.spec(env_id).max_episode_steps
    commands = COMMANDS[env_id]
    rollout = wrappers.GroupRollout(functools.partial(make, env_id, cache), episodes, 1, workers=workers,
                                    env_id=env_id)
    try:
        def play(seed0: int) -> tuple[float, int]:
            start = time.perf_counter()
            rollout.reset([seed0 + k for k in range(episodes)])
            steps, turn = 0, 0
            while active := rollout.active():
                text = wrappers.format_response(commands[turn % len(commands)])
                steps += len(rollout.step({i: text for i in active}, max_turns=turns))
                turn += 1
            return time.perf_counter() - start, steps

        play(0)  # warm-up: envs made, worker imports done, ALFWorld's games generated and cached (timed apart)
        runs = [play(0) for _ in range(repeats)]
        seconds, steps = min(runs)
        errors = sum(e.stop == "env_error" for e in rollout.episodes())
    finally:
        rollout.close()
    return {"env_id": env_id, "workers": workers, "episodes": episodes, "turn_limit": turns, "seconds": seconds,
            "steps": steps, "episodes_per_s": episodes / seconds, "steps_per_s": steps / seconds,
            "env_errors": errors, "all_runs_s": [r[0] for r in runs]}


def alfworld_reset_cost(cache: str) -> dict:
    """Construction, first reset of a game (written to the cache when new) and a later reset of the same game."""
    from arena_envs.alfworld_env import ALFWorldEnv

    t = time.perf_counter()
    env = ALFWorldEnv(split="train", cache_dir=cache)
    construct = time.perf_counter() - t
    out = {"construct_s": construct, "games": len(env.game_files)}
    for label, seed in (("first_reset_new_game_s", 123), ("reset_same_game_again_s", 123),
                        ("first_reset_other_game_s", 456), ("reset_other_game_again_s", 456)):
        t = time.perf_counter()
        env.reset(seed=seed)
        out[label] = time.perf_counter() - t
    env.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=list(COMMANDS))
    parser.add_argument("--workers", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cache", default=None, help="env cache folder (default: a fresh temporary one)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--no-reset-cost", action="store_true", help="skip ALFWorld's reset timing")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()
    cache = args.cache or tempfile.mkdtemp(prefix="bench-env-workers-")
    print(f"{cpu_name()}, {cores} cores, load average {load[0]:.1f} at the start (machine shared with other jobs)")
    results = {"cpu": cpu_name(), "cores": cores, "load_at_start": load[0], "throughput": [], "projection": {}}
    if "ARL/ALFWorld-v0" in args.envs and not args.no_reset_cost:
        results["alfworld_reset"] = alfworld_reset_cost(cache)
        print("ALFWorld reset cost:", json.dumps({k: round(v, 3) for k, v in results["alfworld_reset"].items()}))
    for env_id in args.envs:
        base = None
        for workers in args.workers:
            r = episodes_per_s(env_id, workers, args.episodes, cache, args.repeats)
            base = base or r
            r["speedup_vs_first"] = r["episodes_per_s"] / base["episodes_per_s"]
            results["throughput"].append(r)
            print(f"{env_id:20s} workers={workers:2d}: {r['episodes_per_s']:.3f} episodes/s, {r['steps_per_s']:.1f} "
                  f"steps/s ({r['speedup_vs_first']:.2f}x vs workers={base['workers']}), errors {r['env_errors']}")
        by_workers = {r["workers"]: r for r in results["throughput"] if r["env_id"] == env_id}
        one = by_workers.get(1) or by_workers[min(by_workers)]
        per_episode = one["seconds"] / one["episodes"]
        projection = {}
        for n in (1, 2, 16):
            if n in by_workers and n <= cores:
                projection[n] = RECIPE_EPISODES * by_workers[n]["seconds"] / by_workers[n]["episodes"]
            else:
                projection[n] = RECIPE_EPISODES * per_episode / n  # perfect scaling on n free cores
        results["projection"][env_id] = projection
        print(f"{env_id:20s} recipe iteration ({RECIPE_EPISODES} episodes x {one['turn_limit']} turns) env time: "
              + ", ".join(f"{n} workers {s:.0f} s" for n, s in projection.items()))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
