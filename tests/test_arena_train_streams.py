"""arena_train.streams: the seeds of held-out evaluation's per-episode sampling streams."""

from __future__ import annotations

import itertools

import torch

import wrappers
from arena_train.rollout import EVAL_SEED_OFFSET
from arena_train.streams import episode_sampling_seeds, request_streams, sampling_seed


def test_sampling_seed_is_a_fixed_63_bit_hash_of_its_key():
    """Pinned: a change of the derivation would change every sampled evaluation, so it must be deliberate. The
    hash is integer arithmetic (numpy's SeedSequence), the same on every machine."""
    assert sampling_seed(0, EVAL_SEED_OFFSET, 0, 0) == 4208853605806107461
    keys = list(itertools.product((0, 1, 7), (EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + 1), range(3), range(4)))
    seeds = [sampling_seed(*k) for k in keys]
    assert len(set(seeds)) == len(keys)  # every field of the key counts
    assert all(0 <= s < 2**63 for s in seeds)
    torch.Generator().manual_seed(max(seeds))  # fits torch's (and vLLM's) seeds
    assert sampling_seed(-1, 5, 0, 0) == sampling_seed(2**64 - 1, 5, 0, 0)  # negatives taken modulo 2**64


def test_episode_seeds_follow_the_task_the_sample_and_the_turn():
    rollout = wrappers.GroupRollout(lambda: wrappers.make_env("ARL/Sokoban-Mini-v0", prompt_style="compact"), 2, 3)
    tasks = [EVAL_SEED_OFFSET + 4, EVAL_SEED_OFFSET + 9]
    rollout.reset(tasks)
    assert episode_sampling_seeds(7, rollout, [5, 0]) == [sampling_seed(7, tasks[1], 2, 0),
                                                          sampling_seed(7, tasks[0], 0, 0)]
    rollout.step({0: "no tags"})  # episode 0 is on its second turn, the others still on their first
    assert episode_sampling_seeds(7, rollout, [0, 1]) == [sampling_seed(7, tasks[0], 0, 1),
                                                          sampling_seed(7, tasks[0], 1, 0)]
    assert request_streams(rollout, [0], greedy=False, seed=7) == {"seeds": [sampling_seed(7, tasks[0], 0, 1)]}
    assert request_streams(rollout, [0], greedy=True, seed=7) == request_streams(rollout, [0], False, None) == {}
