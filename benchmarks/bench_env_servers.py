"""Env servers on loopback against local env workers: steps per second of the same episodes played in the trainer's
process, in N local worker processes (``--env-workers N``) and on N OpenEnv servers (``--env-servers``, each
``python -m integrations.openenv_server`` on 127.0.0.1) through ``wrappers.GroupRollout`` as training steps them,
with a scripted policy that costs nothing (so the time is the envs' and the transport's).

    python benchmarks/bench_env_servers.py --envs ARL/Sokoban-Mini-v0 ARL/TextWorld-v0 --servers 2
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench_env_workers import COMMANDS, cpu_name

import wrappers
from arena_envs.pool import EnvPool, EnvServers, LocalEnvs, served_env

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {**COMMANDS, "ARL/Sokoban-Mini-v0": ["up", "right", "down", "left"]}
KWARGS = {"ARL/TextWorld-v0": {"num_games": 4}}


def make_env(env_id: str, **kwargs):
    return wrappers.make_env(env_id, history_length=2, prompt_style="arlarena", **kwargs)


def start_server(env_id: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "integrations.openenv_server", "--env-id", env_id, "--port",
                             str(port), "--env-kwargs", json.dumps(KWARGS.get(env_id, {}))], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the {env_id} server did not start")


def play(runner, env_id: str, episodes: int, repeats: int) -> dict:
    turns = {"ARL/Sokoban-Mini-v0": 10, "ARL/TextWorld-v0": 8}.get(env_id, 10)
    commands = COMMANDS[env_id]
    rollout = wrappers.GroupRollout(runner, episodes, 1, env_id=env_id)

    def once() -> tuple[float, int]:
        start = time.perf_counter()
        rollout.reset(list(range(episodes)))
        steps, turn = 0, 0
        while active := rollout.active():
            text = wrappers.format_response(commands[turn % len(commands)])
            steps += len(rollout.step({i: text for i in active}, max_turns=turns))
            turn += 1
        return time.perf_counter() - start, steps

    once()  # warm-up: envs made, sessions open, games cached
    seconds, steps = min(once() for _ in range(repeats))
    errors = sum(e.stop == "env_error" for e in rollout.episodes())
    return {"seconds": seconds, "steps": steps, "steps_per_s": steps / seconds, "env_errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["ARL/Sokoban-Mini-v0", "ARL/TextWorld-v0"])
    parser.add_argument("--servers", type=int, default=2, help="servers, and local workers to compare with")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    print(f"{cpu_name()}, {len(os.sched_getaffinity(0))} cores, load average {os.getloadavg()[0]:.1f} at the start")
    results = {"cpu": cpu_name(), "load_at_start": os.getloadavg()[0], "runs": []}
    for env_id in args.envs:
        env_fn = functools.partial(make_env, env_id, **KWARGS.get(env_id, {}))
        procs, urls = zip(*(start_server(env_id) for _ in range(args.servers)))
        try:
            for label, runner in (("in-process", LocalEnvs(env_fn)),
                                  (f"{args.servers} workers", EnvPool(env_fn, args.episodes, workers=args.servers)),
                                  (f"{args.servers} servers", EnvServers(
                                      functools.partial(served_env, make_env, env_id), list(urls), args.episodes))):
                try:
                    r = play(runner, env_id, args.episodes, args.repeats)
                finally:
                    runner.close()
                r.update(env_id=env_id, runner=label)
                results["runs"].append(r)
                print(f"{env_id:20s} {label:12s}: {r['steps_per_s']:.1f} steps/s ({r['steps']} steps in "
                      f"{r['seconds']:.2f} s), errors {r['env_errors']}", flush=True)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    results["load_at_end"] = os.getloadavg()[0]
    print(f"load average {results['load_at_end']:.1f} at the end")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
