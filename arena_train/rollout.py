"""Rows from a group rollout: prompt fitting, task seeds and the batched multi-turn collection loop (the row records
and prompt encoding live in ``arena_train.rows``, shared with the trajectory layout)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from arena_train.chat import format_of

# re-exported: callers import every row record and prompt helper from this module
from arena_train.rows import EVAL_SEED_OFFSET as EVAL_SEED_OFFSET
from arena_train.rows import (
    RolloutConfig,
    Row,
    count_stops,
    cut_at_turn_end,
    encode_prompts,
    keeps_rollout_logp,
    turn_stop_reasons,
)
from arena_train.rows import TurnSpan as TurnSpan
from arena_train.rows import encode_prompt as encode_prompt
from arena_train.streams import request_streams
from arena_train.trajectory import collect_trajectories

#: ARLArena's validation sampling (verl ``val_kwargs``: temperature 0.6, top-p 0.95, top-k 20), the default of
#: the in-run and standalone evaluations; greedy decoding is the option.
VAL_TEMPERATURE, VAL_TOP_P, VAL_TOP_K = 0.6, 0.95, 20


def fit_prompts(tokenizer, variants: list[list[list[dict[str, str]]]], max_tokens: int
                ) -> list[tuple[list[int], int, bool]]:
    """Per prompt, (token ids, history pairs dropped, cut) of the first of its ``variants`` (the prompt, then the
    same with the oldest 1, 2, ... history pairs left out) that fits ``max_tokens``; when none fits, the last one
    cut in the middle (``encode_prompts``). Each round encodes the next variant of every prompt still too long in
    one batch."""
    if any(not v for v in variants):
        raise ValueError("fit_prompts needs at least one variant per prompt")
    result: list[tuple[list[int], int, bool] | None] = [None] * len(variants)
    pending, dropped = list(range(len(variants))), 0
    while pending:
        encoded = encode_prompts(tokenizer, [variants[k][dropped] for k in pending], max_tokens)
        still = []
        for k, (ids, cut) in zip(pending, encoded):
            if cut and dropped < len(variants[k]) - 1:
                still.append(k)
            else:
                result[k] = (ids, dropped, cut)
        pending, dropped = still, dropped + 1
    return result  # type: ignore[return-value]


def fit_prompt(tokenizer, variants: list[list[dict[str, str]]], max_tokens: int) -> tuple[list[int], int, bool]:
    """``fit_prompts`` of one prompt."""
    return fit_prompts(tokenizer, [variants], max_tokens)[0]


def require_prompt_fits(tokenizer, env, max_tokens: int, seed: int) -> None:
    """Exit before training when the first prompt of ``env`` (instructions, task and first observation, no
    history yet) exceeds ``max_tokens``: every prompt of the run would then lose part of its instructions."""
    _, info = env.reset(seed=seed)
    require_messages_fit(tokenizer, info.get("messages"), env.spec.id if env.spec else type(env).__name__,
                         max_tokens)


def require_messages_fit(tokenizer, messages: list[dict[str, str]] | None, env_id: str, max_tokens: int) -> None:
    """``require_prompt_fits`` of an env's first ``messages`` (None: an env without chat messages passes)."""
    if messages is None:
        return
    n = len(encode_prompt(tokenizer, messages, max_tokens=1 << 62)[0])
    if n > max_tokens:
        raise SystemExit(f"the first prompt of {env_id} (instructions, task, "
                         f"first observation) has {n} tokens, more than --max-prompt-tokens {max_tokens}: raise it "
                         f"to at least {n} plus room for history")


def task_seeds(seed: int, iteration: int, num_groups: int, rank: int, world: int, attempt: int = 0) -> list[int]:
    """This process's share of an iteration's ``num_groups`` training task seeds, all below EVAL_SEED_OFFSET
    (deterministic in seed, iteration and attempt; a resampling loop passes attempt = 1, 2, ...)."""
    rng = np.random.default_rng([seed, iteration, attempt])
    seeds = rng.integers(0, EVAL_SEED_OFFSET, size=num_groups).tolist()
    return seeds[rank::world]


def held_out_seeds(num_episodes: int, rank: int, world: int) -> list[int]:
    """This process's share of the held-out evaluation seeds EVAL_SEED_OFFSET + 0 .. num_episodes - 1."""
    return [EVAL_SEED_OFFSET + k for k in range(num_episodes)][rank::world]


def collect_rows(backend, tokenizer, rollout, seeds: list[int], config: RolloutConfig, stats: dict[str, float],
                 greedy: bool = False, id_offset: int = 0, sampling_seed: int | None = None, overlap: bool = False
                 ) -> tuple[list[Row], list[Any]]:
    """Play every episode of ``rollout`` (a ``wrappers.GroupRollout``) on ``seeds`` to the end, batching all active
    episodes into one ``backend.generate`` call per turn.

    Returns the rows and the per-episode ``wrappers.EpisodeStats``. Group and episode ids are shifted by
    ``id_offset`` (keeps ids unique over several calls of one iteration). Prompts over the budget drop their
    oldest history pairs first (``fit_prompts``). Adds to ``stats``: ``gen_tokens``, ``dropped_history`` (pairs
    left out), ``truncated_prompts`` (prompts cut in the middle even without history) and the stop-reason counts
    (``count_stops``).
    Sampled training rows carry the backend's own log-probs of their tokens and mean entropy (``rollout_logp``,
    ``rollout_entropy``: the behaviour policy's, from ``generate_scored``, which every arena_train backend has;
    a custom backend with ``generate`` only leaves them unset); greedy rollouts and held-out seeds (evaluation:
    never trained on) skip that work. ``config.row_layout == "trajectory"`` gives one row per
    episode instead (``arena_train.trajectory.collect_trajectories``).

    ``sampling_seed``: sampled responses draw from per-episode streams, each request passing the backend ``seeds=``
    ``arena_train.streams.episode_sampling_seeds`` (of this seed, the episode's task seed, its index within its
    group and the turn), so an episode's tokens do not depend on the episodes batched with it. Held-out evaluation
    passes the run seed, training with ``--episode-streams`` ``arena_train.streams.training_seed`` (run seed,
    iteration); None (training by default): the backend's own stream, and no ``seeds`` argument.

    ``overlap`` (``--overlap-turns``, "step" layout, per-episode streams or greedy decoding): the episodes are
    played in two cohorts that alternate, so that while one cohort's envs step in the env workers
    (``GroupRollout.start_step``) the model generates for the other. Each episode sees the same prompts, streams
    and env answers as in the lockstep loop (every active episode generates, then every env steps), so the rows
    are the same, in the same order (by turn, then episode).

    The failure policy: a group with a failed episode (an env error: exception, crashed worker, timeout) never
    reaches the update half played, which would put a zero-reward row in its baseline. Its rows and episodes are
    left out, the group is replayed once on the same task seed with a fresh env (the failing env was replaced),
    and a group that fails again is dropped. Adds ``env_errors`` (failed episodes), ``retried_groups`` and
    ``dropped_groups``; the episodes returned are those of the groups kept.
    """
    if config.row_layout == "trajectory":
        if overlap:
            raise ValueError("overlapped turns play the 'step' row layout only")
        play = collect_trajectories
    elif config.row_layout == "step":
        play = functools.partial(_collect_steps, overlap=overlap)
    else:
        raise ValueError(f"row_layout must be 'step' or 'trajectory', got {config.row_layout!r}")
    if overlap and sampling_seed is None and not greedy:
        raise ValueError("overlapped turns need per-episode streams (sampling_seed): with the backend's own stream "
                         "a row's tokens would depend on the order the cohorts generate in")
    rows, episodes = play(backend, tokenizer, rollout, seeds, config, stats, greedy, id_offset,
                          sampling_seed=sampling_seed)
    failed = rollout.failed_groups()
    if not failed:
        return rows, episodes
    stats["env_errors"] += len(rollout.failures())
    stats["retried_groups"] += len(failed)
    retry_rows, retry_episodes = play(backend, tokenizer, rollout, seeds, config, stats, greedy, id_offset,
                                      groups=failed, sampling_seed=sampling_seed)
    dropped = set(rollout.failed_groups())
    stats["env_errors"] += len(rollout.failures())
    stats["dropped_groups"] += len(dropped)
    retried = set(failed)
    rows = ([r for r in rows if r.group - id_offset not in retried]
            + [r for r in retry_rows if r.group - id_offset not in dropped])
    episodes = ([e for e in episodes if e.group not in retried]
                + [e for e in retry_episodes if e.group not in dropped])
    return rows, sorted(episodes, key=lambda e: e.episode)


def _collect_steps(backend, tokenizer, rollout, seeds: list[int], config: RolloutConfig, stats: dict[str, float],
                   greedy: bool = False, id_offset: int = 0, groups: list[int] | None = None,
                   sampling_seed: int | None = None, overlap: bool = False) -> tuple[list[Row], list[Any]]:
    """The "step" layout of ``collect_rows``: a row per turn, for the episodes of ``groups`` (default: all)."""
    rollout.reset(seeds, groups)
    rows: list[Row] = []
    played = sorted(set(rollout.active()) | set(rollout.failures()))
    scored = keeps_rollout_logp(backend, seeds, greedy)
    generate = functools.partial(_generate_turn, backend, tokenizer, rollout, config, stats, greedy, scored,
                                 sampling_seed)
    if overlap:
        half = len(played) // 2
        cohorts = [set(c) for c in (played[:half], played[half:]) if c]
        started: dict[int, tuple[dict[int, str], dict[int, tuple]]] = {}  # cohort -> its turn in the envs
        while True:
            for k, cohort in enumerate(cohorts):
                if k in started:  # its envs stepped while the other cohort generated
                    texts, generated = started.pop(k)
                    rows += _turn_rows(rollout.step(texts, max_turns=config.max_turns), generated, id_offset)
                active = [i for i in rollout.active() if i in cohort]
                if active:
                    texts, generated = generate(active)
                    rollout.start_step(texts)
                    started[k] = texts, generated
            if not started:
                break
        rows.sort(key=lambda r: (r.turn, r.episode))  # the lockstep order
    else:
        for _ in range(config.max_turns):
            active = rollout.active()
            if not active:
                break
            texts, generated = generate(active)
            rows += _turn_rows(rollout.step(texts, max_turns=config.max_turns), generated, id_offset)
    kept = set(played)
    episodes = [e for e in rollout.episodes() if e.episode in kept]
    count_stops(stats, [r.stop for r in rows], episodes)
    by_id = {e.episode: e for e in episodes}
    for row in rows:
        ep = by_id[row.episode - id_offset]
        row.env_return, row.won = ep.env_return, ep.won
    return rows, episodes


def _generate_turn(backend, tokenizer, rollout, config: RolloutConfig, stats: dict[str, float], greedy: bool,
                   scored: bool, sampling_seed: int | None, active: list[int]
                   ) -> tuple[dict[int, str], dict[int, tuple]]:
    """One batched generation for the ``active`` episodes' next turn: their responses as text (the envs' actions)
    and, per episode, (prompt ids, response ids, log-probs, entropies, stop reason) for its row. Adds the turn's
    ``gen_tokens``, ``dropped_history`` and ``truncated_prompts`` to ``stats``."""
    encoded = fit_prompts(tokenizer, [[rollout.messages(i), *rollout.shorter_messages(i)] for i in active],
                          config.max_prompt_tokens)
    prompts = [ids for ids, _, _ in encoded]
    streams = request_streams(rollout, active, greedy, sampling_seed)
    if scored:
        generated, logps, entropies = backend.generate_scored(prompts, config.max_response_tokens,
                                                              config.temperature, config.top_p, config.top_k,
                                                              **streams)
    else:
        generated = backend.generate(prompts, config.max_response_tokens, config.temperature, config.top_p,
                                     greedy, config.top_k, **streams)
        logps = entropies = [None] * len(generated)
    envs = rollout.envs
    responses = cut_at_turn_end(tokenizer, [envs[i] for i in active], generated)
    reasons = turn_stop_reasons(backend, generated, responses, [cut for _, _, cut in encoded],
                                config.max_response_tokens, format_of(tokenizer).end_ids)
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    stats["gen_tokens"] += sum(len(r) for r in responses)
    stats["dropped_history"] += sum(dropped for _, dropped, _ in encoded)
    stats["truncated_prompts"] += sum(cut for _, _, cut in encoded)
    return dict(zip(active, texts)), {i: (p, r, lp, h, s) for i, p, r, lp, h, s in zip(active, prompts, responses,
                                                                                       logps, entropies, reasons)}


def _turn_rows(turns: list[Any], generated: dict[int, tuple], id_offset: int) -> list[Row]:
    """The rows of one step's ``turns`` (``wrappers.Turn``) from what ``_generate_turn`` returned for them."""
    rows = []
    for t in turns:
        prompt_ids, response_ids, logp, entropy, reason = generated[t.episode]
        row = Row(group=t.group + id_offset, episode=t.episode + id_offset, turn=t.turn, prompt_ids=prompt_ids,
                  response_ids=response_ids, step_reward=t.env_reward, format_penalty=t.format_penalty,
                  format_ok=t.format_ok, action_is_valid=t.action_is_valid, anchor=t.anchor, won=False,
                  stop="env_error" if t.env_error else reason)
        if logp is not None:  # a cut response keeps the scores of its tokens
            n = len(response_ids)
            row.rollout_logp = np.asarray(logp[:n], dtype=np.float32)
            row.rollout_entropy = float(np.mean(entropy[:n])) if n else 0.0
        rows.append(row)
    return rows


def eval_split_of(env_id: str, requested: str | None) -> str:
    """The split a run evaluates on: ``requested``, else the env's held-out split (``arena_envs.held_out_split``);
    ``train`` is refused, since rollout and evaluation tasks must never meet."""
    from arena_envs import held_out_split

    split = requested or held_out_split(env_id)
    if split == "train":
        raise SystemExit("error: --eval-split must be a held-out split, not 'train' (rollout and eval tasks must not "
                         "meet)")
    return split
