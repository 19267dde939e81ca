"""Difficulty of each registered Sokoban variant: optimal solution lengths and the
success rate of a uniformly random policy (the baseline an RL gain must beat).

    python benchmarks/sokoban_difficulty.py [--rooms 500]
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

import arena_envs

ACTIONS = ["up", "down", "left", "right"]


def measure(env_id: str, rooms: int, seed0: int = 100_000) -> dict[str, float]:
    env = gym.make(env_id)
    rng = np.random.default_rng(0)
    optimal, random_wins, expert_wins = [], 0, 0
    for k in range(rooms):
        _, info = env.reset(seed=seed0 + k)
        optimal.append(info["optimal_solution_length"])
        terminated = truncated = False
        while not (terminated or truncated):
            _, _, terminated, truncated, info = env.step(ACTIONS[rng.integers(4)])
        random_wins += info["won"]
        env.reset(seed=seed0 + k)
        terminated = truncated = False
        while not (terminated or truncated):
            _, _, terminated, truncated, info = env.step(env.unwrapped.expert_action())
        expert_wins += info["won"]
    opt = np.array(optimal)
    return {"opt_mean": opt.mean(), "opt_median": float(np.median(opt)), "opt_max": opt.max(),
            "random_success": random_wins / rooms, "expert_success": expert_wins / rooms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rooms", type=int, default=500)
    args = parser.parse_args()
    print(f"{'env id':24s} {'steps':>5s} {'opt mean':>8s} {'median':>6s} {'max':>4s} {'random':>7s} {'expert':>7s}")
    for env_id in (i for i in arena_envs.ENV_IDS if i.startswith("ARL/Sokoban")):
        m = measure(env_id, args.rooms)
        steps = gym.spec(env_id).max_episode_steps
        print(f"{env_id:24s} {steps:5d} {m['opt_mean']:8.2f} {m['opt_median']:6.1f} {m['opt_max']:4d} "
              f"{m['random_success']:7.3f} {m['expert_success']:7.3f}")


if __name__ == "__main__":
    main()
