"""ALFWorld and TextWorld: raw engine vs our env + wrappers, and worker-process scaling.

Baseline ``raw``: the engine exactly as our env configures it (ALFWorld: ``PddlEnv`` →
``AlfredDemangler`` → ``AlfredInfos``; TextWorld: ``textworld.start`` with the same
``EnvInfos``), driven directly. ``ours``: ``wrappers.make_env(id)`` (env → AnchorState →
FormatPenalty → PromptHistory) fed ``<think>…</think><action>…</action>`` responses. Both replay
the same seeded random walk over admissible commands in lockstep (one raw step, then the same
step through our stack), so machine load hits both alike; ours/raw of the step time is the
overhead (target ≤ 1.05).
Scaling: ``EnvPool`` with N worker processes vs 1, steps/s over random-walk episodes.

    python benchmarks/bench_text_engines.py --steps 60 --games 2 --workers 1 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

import arena_envs  # noqa: F401
from wrappers import make_env


def random_walk(engine_reset, engine_step, admissible, n: int, rng) -> list[str]:
    """Commands of a seeded random walk over admissible commands (restarting when done)."""
    state = engine_reset()
    actions = []
    for _ in range(n):
        cmds = admissible(state)
        action = cmds[int(rng.integers(len(cmds)))]
        actions.append(action)
        state, done = engine_step(action)
        if done:
            state = engine_reset()
    return actions


def alfworld_pair(game: int):
    from arena_envs.alfworld_env.engine import make_engine

    ours = make_env("ARL/ALFWorld-v0", max_episode_steps=10_000, games_per_task=1)  # shipped games only
    ours.reset(seed=0, options={"game": game})
    gamefile = ours.unwrapped.gamefile
    raw = make_engine(expert=False)
    t = time.perf_counter()
    raw.load(gamefile)
    raw.reset()
    load_s = time.perf_counter() - t

    def raw_reset():
        return raw.reset()

    def raw_step(a):
        s, _, done = raw.step(a)
        return s, done

    return ours, (raw_reset, raw_step, lambda s: s["admissible_commands"]), load_s, {"options": {"game": game}}


def textworld_pair(game: int, cache: str):
    import textworld

    ours = make_env("ARL/TextWorld-v0", max_episode_steps=10_000, cache_dir=cache)
    ours.reset(seed=0, options={"game": game})
    infos = textworld.EnvInfos(admissible_commands=True, objective=True, won=True, lost=True, score=True,
                               max_score=True, policy_commands=True, extras=["walkthrough"])
    t = time.perf_counter()
    raw = textworld.start(str(ours.unwrapped.game_file), request_infos=infos)
    raw.reset()
    load_s = time.perf_counter() - t

    def raw_step(a):
        s, _, done = raw.step(a)
        return s, done

    return ours, (raw.reset, raw_step, lambda s: s["admissible_commands"]), load_s, {"options": {"game": game}}


def bench_overhead(name, make_pair, games: int, steps: int, reps: int) -> None:
    rng = np.random.default_rng(0)
    raw_ms, our_ms, raw_reset, our_reset, loads = [], [], [], [], []
    for game in range(games):
        ours, (r_reset, r_step, admissible), load_s, reset_kw = make_pair(game)
        loads.append(load_s)
        actions = random_walk(r_reset, r_step, admissible, steps, rng)

        def o_reset(ours=ours, reset_kw=reset_kw):
            return ours.reset(seed=0, **reset_kw)

        def o_step(a, ours=ours):
            _, _, term, trunc, _ = ours.step(f"<think>go</think><action>{a}</action>")
            return term or trunc

        for _ in range(reps):
            for _ in range(5):  # resets of the loaded game, lockstep too
                t0 = time.perf_counter()
                r_reset()
                t1 = time.perf_counter()
                o_reset()
                raw_reset.append(t1 - t0)
                our_reset.append(time.perf_counter() - t1)
            for a in actions:  # lockstep: background load hits both stacks alike
                t0 = time.perf_counter()
                raw_done = r_step(a)[1]
                t1 = time.perf_counter()
                our_done = o_step(a)
                raw_ms.append(t1 - t0)
                our_ms.append(time.perf_counter() - t1)
                assert raw_done == our_done, "raw engine and env diverged"
                if raw_done:
                    r_reset()
                    o_reset()
        ours.close()
    raw_med, our_med = statistics.median(raw_ms), statistics.median(our_ms)
    total_ratio = sum(our_ms) / sum(raw_ms)
    print(f"{name}: load+reset of a new game (raw) {statistics.median(loads) * 1e3:.0f} ms")
    print(f"{name}: reset same game  raw {statistics.median(raw_reset) * 1e3:7.1f} ms   "
          f"ours {statistics.median(our_reset) * 1e3:7.1f} ms   "
          f"ratio {statistics.median(our_reset) / statistics.median(raw_reset):.3f}")
    print(f"{name}: step (median)    raw {raw_med * 1e3:7.2f} ms   ours {our_med * 1e3:7.2f} ms   "
          f"ratio {our_med / raw_med:.3f} (total-time ratio {total_ratio:.3f}; "
          f"{len(raw_ms) / sum(raw_ms):.1f} vs {len(our_ms) / sum(our_ms):.1f} steps/s over {len(raw_ms)} steps)")


def bench_scaling(name, env_id, workers: list[int], episodes: int, max_steps: int, **kwargs) -> None:
    from arena_envs.pool import EnvPool

    base = None
    for n in workers:
        with EnvPool(env_id, n, **kwargs) as pool:
            rng = np.random.default_rng(1)
            for i in range(n):  # warm-up: imports and first game load are not throughput
                pool.reset(i, seed=i)
            total, t = 0, time.perf_counter()
            for start in range(0, episodes, n):
                slots = list(range(min(n, episodes - start)))
                infos = {i: pool.reset(i, seed=start + i)[1] for i in slots}
                active = set(slots)
                for _ in range(max_steps):
                    if not active:
                        break
                    acts = {i: infos[i]["admissible_actions"][int(rng.integers(len(infos[i]["admissible_actions"])))]
                            for i in active}
                    for i, (_, _, term, trunc, info) in pool.step(acts).items():
                        total += 1
                        infos[i] = info
                        if term or trunc:
                            active.discard(i)
            rate = total / (time.perf_counter() - t)
        base = base or rate
        print(f"{name}: {n} worker(s) {rate:7.1f} steps/s   speed-up vs 1 worker {rate / base:.2f}x "
              f"({episodes} episodes, resets included)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", nargs="+", default=["alfworld", "textworld"])
    ap.add_argument("--games", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60, help="random-walk steps per game")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=15, help="steps per episode in the scaling run")
    args = ap.parse_args()
    cache = tempfile.mkdtemp(prefix="tw-bench-")
    if "alfworld" in args.engines:
        bench_overhead("ALFWorld", alfworld_pair, args.games, args.steps, args.reps)
        bench_scaling("ALFWorld", "ARL/ALFWorld-v0", args.workers, args.episodes, args.max_steps, games_per_task=1)
    if "textworld" in args.engines:
        bench_overhead("TextWorld", lambda g: textworld_pair(g, cache), args.games, args.steps, args.reps)
        from arena_envs.textworld_env import cached_game

        for g in range(args.episodes):  # generate the scaling run's games up front (cache shared by workers)
            cached_game("tw-cooking", None, g, cache)
        bench_scaling("TextWorld", "ARL/TextWorld-v0", args.workers, args.episodes, args.max_steps,
                      cache_dir=cache, num_games=args.episodes)


if __name__ == "__main__":
    main()
