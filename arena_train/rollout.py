"""Rows from a group rollout: prompt encoding, task seeds and the batched multi-turn collection loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Task seeds >= this are held out for evaluation; training task seeds are drawn below it.
EVAL_SEED_OFFSET = 1_000_000_000


@dataclass(frozen=True)
class TurnSpan:
    """One turn inside a trajectory row: its response tokens ``response_ids[start:end]`` and its rewards."""

    start: int
    end: int
    env_reward: float  # env reward of this turn, before the format penalty
    format_penalty: float


@dataclass
class Row:
    """A training sample (prompt -> response): one turn of one episode ("step" layout), or a whole episode with
    the env's tokens inside the response and masked out of the loss ("trajectory" layout, ``turns`` filled)."""

    group: int  # task instance; the G episodes of a group share it
    episode: int  # trajectory id, unique within the batch
    turn: int  # 0-based step index in its episode
    prompt_ids: list[int]
    response_ids: list[int]
    step_reward: float  # env reward of this turn, before the format penalty
    format_penalty: float  # penalty of this turn (0 or --format-penalty)
    format_ok: bool
    action_is_valid: bool
    anchor: Any  # canonical key of the state acted on (GiGPO)
    won: bool  # the episode was won (filled when it ends)
    env_return: float = 0.0  # the episode's env return, format penalties excluded (EpisodeStats.env_return)
    advantage: Any = 0.0  # float or (len(response_ids),) array
    old_logp: np.ndarray | None = None  # (len(response_ids),) log-probs before the update
    ref_logp: np.ndarray | None = None  # (len(response_ids),) log-probs of the reference model
    entropy: float = 0.0  # mean token entropy of the response under the old policy (EMPG)
    rollout_logp: np.ndarray | None = None  # (len(response_ids),) log-probs from the generation pass itself
    rollout_entropy: float = 0.0  # mean token entropy from the generation pass (with rollout_logp)
    extra: dict[str, Any] = field(default_factory=dict)  # room for method-specific data
    loss_mask: np.ndarray | None = None  # (len(response_ids),) 1 = policy token, 0 = env token; None = all 1
    turns: list[TurnSpan] = field(default_factory=list)  # trajectory rows: every turn's span (empty for step rows)


@dataclass(frozen=True)
class RolloutConfig:
    """How one rollout generates: turn budget, prompt and response lengths, sampling."""

    max_turns: int
    max_prompt_tokens: int  # longer prompts drop their oldest history pairs first (fit_prompts)
    max_response_tokens: int  # new tokens per turn
    temperature: float = 1.0  # ignored by greedy rollouts
    top_p: float = 1.0  # ignored by greedy rollouts
    row_layout: str = "step"  # "step": a row per turn; "trajectory": a row per episode (arena_train.trajectory)
    top_k: int = 0  # 0 = off; ignored by greedy rollouts


#: ARLArena's validation sampling (verl ``val_kwargs``: temperature 0.6, top-p 0.95, top-k 20), the default of
#: the in-run and standalone evaluations; greedy decoding is the option.
VAL_TEMPERATURE, VAL_TOP_P, VAL_TOP_K = 0.6, 0.95, 20


def encode_prompts(tokenizer, conversations: list[list[dict[str, str]]], max_tokens: int
                   ) -> list[tuple[list[int], bool]]:
    """Chat-template token ids with the generation prompt of each conversation, and whether they were cut to
    ``max_tokens``; one batched template call and one batched tokenizer call.

    A cut drops the middle and keeps the first and last halves: the start holds the instructions and the task,
    the end the admissible actions, the answer format and the generation prompt."""
    if not conversations:
        return []
    texts = tokenizer.apply_chat_template(conversations, add_generation_prompt=True, tokenize=False)
    # what tokenize=True does with the rendered text, without building the attention masks nobody reads
    encoded = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    out = []
    for ids in encoded:
        ids = list(ids)
        if len(ids) <= max_tokens:
            out.append((ids, False))
        else:
            head = max_tokens // 2
            out.append((ids[:head] + ids[len(ids) - (max_tokens - head):], True))
    return out


def encode_prompt(tokenizer, messages: list[dict[str, str]], max_tokens: int) -> tuple[list[int], bool]:
    """``encode_prompts`` of one conversation."""
    return encode_prompts(tokenizer, [messages], max_tokens)[0]


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
    messages = info.get("messages")
    if messages is None:
        return
    n = len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                          return_dict=True)["input_ids"])
    if n > max_tokens:
        raise SystemExit(f"the first prompt of {env.spec.id if env.spec else type(env).__name__} (instructions, task, "
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


def cut_at_turn_end(tokenizer, envs, responses: list[list[int]]) -> list[list[int]]:
    """Each response cut after the shortest prefix at which its env (``envs[k].unwrapped``) reads the turn as
    complete, for envs with a ``turn_end(text) -> int | None`` hook (TIR-Math: the end of a code block or an
    answer). Sampling is token by token, so a cut response is exactly what generation stopping there would give."""
    out = []
    for env, ids in zip(envs, responses):
        turn_end = getattr(env.unwrapped, "turn_end", None)
        if turn_end is None or turn_end(tokenizer.decode(ids, skip_special_tokens=True)) is None:
            out.append(list(ids))
            continue
        lo, hi = 1, len(ids)  # the whole response is complete; a longer prefix of a complete turn stays complete
        while lo < hi:
            mid = (lo + hi) // 2
            if turn_end(tokenizer.decode(ids[:mid], skip_special_tokens=True)) is None:
                lo = mid + 1
            else:
                hi = mid
        out.append(list(ids[:hi]))
    return out


def collect_rows(backend, tokenizer, rollout, seeds: list[int], config: RolloutConfig, stats: dict[str, float],
                 greedy: bool = False, id_offset: int = 0) -> tuple[list[Row], list[Any]]:
    """Play every episode of ``rollout`` (a ``wrappers.GroupRollout``) on ``seeds`` to the end, batching all active
    episodes into one ``backend.generate`` call per turn.

    Returns the rows and the per-episode ``wrappers.EpisodeStats``. Group and episode ids are shifted by
    ``id_offset`` (keeps ids unique over several calls of one iteration). Prompts over the budget drop their
    oldest history pairs first (``fit_prompts``). Adds to ``stats``: ``gen_tokens``, ``dropped_history`` (pairs
    left out) and ``truncated_prompts`` (prompts cut in the middle even without history).
    A backend that scores its rollouts (``HFBackend(score_rollouts=True)``) also fills ``rollout_logp`` and
    ``rollout_entropy`` of sampled training rows; greedy rollouts and held-out seeds (evaluation: never trained on)
    skip that work. ``config.row_layout == "trajectory"`` gives one row per episode instead
    (``arena_train.trajectory.collect_trajectories``).
    """
    if config.row_layout == "trajectory":
        from arena_train.trajectory import collect_trajectories  # imports this module

        return collect_trajectories(backend, tokenizer, rollout, seeds, config, stats, greedy, id_offset)
    if config.row_layout != "step":
        raise ValueError(f"row_layout must be 'step' or 'trajectory', got {config.row_layout!r}")
    rollout.reset(seeds)
    rows: list[Row] = []
    # the policy's own log-probs, kept on rows that may be trained on
    scored = (not greedy and getattr(backend, "score_rollouts", False)
              and any(seed < EVAL_SEED_OFFSET for seed in seeds))
    for _ in range(config.max_turns):
        active = rollout.active()
        if not active:
            break
        encoded = fit_prompts(tokenizer, [[rollout.messages(i), *rollout.shorter_messages(i)] for i in active],
                              config.max_prompt_tokens)
        prompts = [ids for ids, _, _ in encoded]
        if scored:
            responses, logps, entropies = backend.generate_scored(prompts, config.max_response_tokens,
                                                                  config.temperature, config.top_p, config.top_k)
        else:
            responses = backend.generate(prompts, config.max_response_tokens, config.temperature, config.top_p,
                                         greedy, config.top_k)
            logps = entropies = [None] * len(responses)
        responses = cut_at_turn_end(tokenizer, [rollout.envs[i] for i in active], responses)
        texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
        turns = rollout.step(dict(zip(active, texts)), max_turns=config.max_turns)
        by_episode = {i: (p, r, lp, h) for i, p, r, lp, h in zip(active, prompts, responses, logps, entropies)}
        for t in turns:
            prompt_ids, response_ids, logp, entropy = by_episode[t.episode]
            row = Row(group=t.group + id_offset, episode=t.episode + id_offset, turn=t.turn, prompt_ids=prompt_ids,
                      response_ids=response_ids, step_reward=t.env_reward, format_penalty=t.format_penalty,
                      format_ok=t.format_ok, action_is_valid=t.action_is_valid, anchor=t.anchor, won=False)
            if logp is not None:  # a cut response keeps the scores of its tokens
                n = len(response_ids)
                row.rollout_logp = np.asarray(logp[:n], dtype=np.float32)
                row.rollout_entropy = float(np.mean(entropy[:n])) if n else 0.0
            rows.append(row)
        stats["gen_tokens"] += sum(len(r) for r in responses)
        stats["dropped_history"] += sum(dropped for _, dropped, _ in encoded)
        stats["truncated_prompts"] += sum(cut for _, _, cut in encoded)
    episodes = rollout.episodes()
    for row in rows:
        ep = episodes[row.episode - id_offset]
        row.env_return, row.won = ep.env_return, ep.won
    return rows, episodes


def eval_split_of(env_id: str, requested: str | None) -> str:
    """The split a run evaluates on: ``requested``, else the env's held-out split (``arena_envs.held_out_split``);
    ``train`` is refused, since rollout and evaluation tasks must never meet."""
    from arena_envs import held_out_split

    split = requested or held_out_split(env_id)
    if split == "train":
        raise SystemExit("error: --eval-split must be a held-out split, not 'train' (rollout and eval tasks must not "
                         "meet)")
    return split
