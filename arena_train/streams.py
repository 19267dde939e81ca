"""Per-episode sampling streams: the random numbers of one response depend on which episode and turn it answers,
never on which process, batch, batch position or env worker plays it.

Held-out evaluation is addressed by task seed (``rollout.held_out_seeds``); with sampled decoding it passes each
request a seed of its own (``backend.generate(..., seeds=...)``), derived here from (run seed, the episode's task
seed, its index within its group, the turn), so that a split of the panel over processes or workers draws the same
tokens for the same episode.

Training rollouts draw from the process's own stream (seed + rank) by default: a row's tokens then depend on
everything sampled before it in that process. With ``--episode-streams`` they draw from per-episode streams as
well, keyed by (run seed, iteration, task seed, sample, turn) (``training_seed``), so that a row's tokens are the
same whatever batch size, env worker count or number of processes plays it, and whatever order the episodes'
turns are generated in (``--overlap-turns``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Last word of a sampling stream's key (keeps it apart from the run's other keyed streams, e.g.
#: ``mixture._ALLOCATION_STREAM``).
_SAMPLING_STREAM = 11
#: Last word of the key of an iteration's training streams (``training_seed``).
_TRAINING_STREAM = 13
_UINT64 = 2**64


def sampling_seed(seed: int, task_seed: int, sample: int, turn: int) -> int:
    """The 63-bit seed of one response's sampling stream: numpy's ``SeedSequence`` hash of (run ``seed``,
    ``task_seed``, ``sample`` = the episode's index within its group, ``turn`` = 0-based turn of the episode).
    Distinct keys give independent streams; 63 bits fit every consumer (``torch.Generator.manual_seed``, vLLM's
    per-request ``SamplingParams.seed``). Negative integers are taken modulo 2**64."""
    key = [int(v) % _UINT64 for v in (seed, task_seed, sample, turn, _SAMPLING_STREAM)]
    return int(np.random.SeedSequence(key).generate_state(1, np.uint64)[0] >> np.uint64(1))


def training_seed(seed: int, iteration: int) -> int:
    """The ``sampling_seed`` of iteration ``iteration``'s training rollouts (``collect_rows``; ``--episode-streams``):
    (run ``seed``, ``iteration``) hashed into 63 bits, so that a training episode's stream is keyed by (run seed,
    iteration, task seed, sample, turn): a task seed drawn again in a later iteration samples anew. Training task
    seeds lie below ``rollout.EVAL_SEED_OFFSET`` and held-out ones above it, so no training stream is an evaluation
    stream; the evaluation keys stay what they were."""
    key = [int(v) % _UINT64 for v in (seed, iteration, _TRAINING_STREAM)]
    return int(np.random.SeedSequence(key).generate_state(1, np.uint64)[0] >> np.uint64(1))


def episode_sampling_seeds(seed: int, rollout, episodes: Sequence[int]) -> list[int]:
    """``sampling_seed`` of the next turn of each of ``episodes`` of ``rollout`` (a ``wrappers.GroupRollout``: the
    task seed, the index ``episode % group_size`` within the group and the turns played so far)."""
    stats = rollout.episodes()
    return [sampling_seed(seed, stats[i].task_seed, i % rollout.group_size, stats[i].length) for i in episodes]


def request_streams(rollout, active: list[int], greedy: bool, seed: int | None) -> dict[str, list[int]]:
    """The backend's ``seeds`` argument for the ``active`` episodes' next turn (``seed``: ``rollout.collect_rows``'
    ``sampling_seed``: the run seed in evaluation, ``training_seed`` in training), or no argument: greedy decoding,
    or no per-episode streams."""
    if greedy or seed is None:
        return {}
    return {"seeds": episode_sampling_seeds(seed, rollout, active)}
