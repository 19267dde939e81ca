"""WebShop: catalogue build time, search latency and quality, env steps per second.

Search: the env's top-50 (``Catalog.search`` without its result cache: BM25 weights from
the ``rank_bm25`` index scattered over each query term's documents), ``rank_bm25``'s own
``BM25Okapi.get_scores`` (same scores, one Python pass over all documents per term), and a
named baseline measured in the same run, ``token-overlap scan`` (score = number of
distinct query tokens in the document, one Python pass over all documents, top 50).
All are timed on the same goal instructions; quality is recall@10 (first results page)
and recall@50 of the goal's target product. Steps/s: expert episodes through
``gym.make("ARL/WebShop-v0")`` (search cache cold for each new instruction), and random
walks over the admissible actions.

    python benchmarks/bench_webshop.py --queries 200 --episodes 100
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

import arena_envs  # noqa: F401
from arena_envs.webshop.catalog import SEARCH_RETURN_N, tokenize
from arena_envs.webshop.env import SEARCH_PATTERN
from arena_envs.webshop.synthetic import DEFAULT_NUM_PRODUCTS, generate, synthetic_catalog


def percentiles(ms: list[float]) -> tuple[float, float]:
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 95))


def timed(fn, queries):
    out, ms = [], []
    for q in queries:
        t = time.perf_counter()
        out.append(fn(q))
        ms.append((time.perf_counter() - t) * 1e3)
    return out, ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--num-products", type=int, default=DEFAULT_NUM_PRODUCTS)
    args = ap.parse_args()

    t = time.perf_counter()
    generate(args.num_products)
    gen_s = time.perf_counter() - t
    cat = synthetic_catalog(args.num_products)
    t = time.perf_counter()
    cat.search("warm up")  # builds the rank_bm25 index and the term postings
    index_s = time.perf_counter() - t
    print(f"catalogue: {len(cat.products)} products, {len(cat.goals)} goals; generate {gen_s:.2f} s, "
          f"BM25 index + postings {index_s:.2f} s")

    rng = np.random.default_rng(0)
    goals = [cat.goals[i] for i in rng.choice(len(cat.goals), min(args.queries, len(cat.goals)), replace=False)]
    queries = [g.instruction_text for g in goals]

    def env_search(q):
        cat._cache.clear()
        return cat.search(q)

    def rank_bm25_search(q):
        scores = cat.bm25.get_scores(tokenize(q))
        order = np.argsort(-scores, kind="stable")[:SEARCH_RETURN_N]
        return tuple(cat.products[i] for i in order if scores[i] > 0)

    doc_sets = [frozenset(tokenize(p.search_text())) for p in cat.products]

    def overlap_search(q):
        terms = set(tokenize(q))
        scores = [len(terms & d) for d in doc_sets]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:SEARCH_RETURN_N]
        return tuple(cat.products[i] for i in order if scores[i] > 0)

    rows = []
    methods = (("env search (BM25 postings)", env_search), ("rank_bm25 get_scores", rank_bm25_search),
               ("token-overlap scan (baseline)", overlap_search))
    for name, fn in methods:
        hits, ms = timed(fn, queries)
        recall = [np.mean([any(p.asin == g.asin for p in h[:k]) for h, g in zip(hits, goals)]) for k in (10, 50)]
        rows.append((name, *percentiles(ms), *recall))
    print(f"\nsearch over {len(queries)} instructions (top {SEARCH_RETURN_N}):")
    print(f"{'method':32s} {'p50 ms':>8s} {'p95 ms':>8s} {'recall@10':>10s} {'recall@50':>10s}")
    for name, p50, p95, r10, r50 in rows:
        print(f"{name:32s} {p50:8.2f} {p95:8.2f} {r10:10.3f} {r50:10.3f}")
    for name, p50, *_ in rows[:2]:
        print(f"p50 speed-up of {name} over the token-overlap baseline: {rows[2][1] / p50:.2f}x")

    env = gym.make("ARL/WebShop-v0")
    expert = env.unwrapped.expert_action
    steps = wins = 0
    t = time.perf_counter()
    for seed in range(args.episodes):
        env.reset(seed=seed)
        while True:
            *_, terminated, truncated, info = env.step(expert())
            steps += 1
            if terminated or truncated:
                wins += info["won"]
                break
    expert_s = time.perf_counter() - t
    rand_steps = 0
    t = time.perf_counter()
    for seed in range(args.episodes):
        env.reset(seed=seed)
        while True:
            actions = env.unwrapped.admissible_actions()
            a = actions[int(rng.integers(len(actions)))]
            *_, terminated, truncated, _ = env.step("search[shoes]" if a == SEARCH_PATTERN else a)
            rand_steps += 1
            if terminated or truncated:
                break
    rand_s = time.perf_counter() - t
    print(f"\nexpert: {args.episodes} episodes, success {wins / args.episodes:.3f}, "
          f"{steps / args.episodes:.1f} steps/episode, {steps / expert_s:.0f} steps/s")
    print(f"random admissible policy: {rand_steps / rand_s:.0f} steps/s")


if __name__ == "__main__":
    main()
