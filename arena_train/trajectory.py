"""The "trajectory" row layout: one training row per episode, the whole interleaved conversation as one sequence.

In the "step" layout (ARLArena's) every turn is a row whose prompt is re-rendered from the env's messages. Here
(the Practitioner's Guide, SimpleTIR, TRL's multi-turn training) the policy generates every turn on the growing
token sequence first prompt + response 1 + env tokens 1 + response 2 + ...; the generated token ids are kept as
they were sampled (never re-tokenized), the env's tokens (the end of the assistant turn, the next user message
and the generation prompt, as the chat template writes them) are appended, and the finished episode is one
``Row``: ``prompt_ids`` = the first prompt, ``response_ids`` = everything after it, ``loss_mask`` = 1 on the
policy's tokens and 0 on the env's (so the loss, KL and entropy terms skip them), ``turns`` = each turn's span.

A context longer than ``max_prompt_tokens`` drops its oldest turns first for generation, as the step layout drops
its oldest history pairs (``fit_context``; counted in ``dropped_history``): the first prompt (instructions, task)
and the latest turns stay. Only when the first prompt and the last turn alone are over the budget is the context
cut in the middle (``truncated_prompts``, stop reason ``context_overflow``). The row keeps the whole sequence,
and the scoring pass that fills ``old_logp`` sees it whole (the policy generated from the shorter context), so
size ``max_prompt_tokens`` for the full episode.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from arena_train.rows import (
    RolloutConfig,
    Row,
    TurnSpan,
    count_stops,
    cut_at_turn_end,
    encode_prompt,
    turn_stop_reasons,
)
from arena_train.streams import request_streams
from wrappers.special_tokens import escape_special_tokens

#: Stand-in for a response when the chat template renders the text between two assistant turns.
_SENTINEL = "<<ARL-RESPONSE>>"


def env_turn_ids(tokenizer, observation: str, response_ended: bool) -> list[int]:
    """Token ids the chat template puts between an assistant response and the next one when the user (the env)
    answers ``observation``: the assistant's end marker (left out when the response already ended with the end
    token), the user message and the generation prompt."""
    messages = [{"role": "user", "content": "task"}, {"role": "assistant", "content": _SENTINEL},
                {"role": "user", "content": escape_special_tokens(observation, tokenizer)}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    between = text[text.index(_SENTINEL) + len(_SENTINEL):]
    if response_ended and tokenizer.eos_token and between.startswith(tokenizer.eos_token):
        between = between[len(tokenizer.eos_token):]
    return list(tokenizer(between, add_special_tokens=False)["input_ids"])


def fit_context(prompt: list[int], body: list[int], starts: list[int], max_tokens: int
                ) -> tuple[list[int], int, bool]:
    """The generation context of a trajectory: ``prompt + body`` if it fits ``max_tokens``, else the prompt and the
    body from the start of its oldest turn that fits (``starts``: each turn's first body index), and the turns
    left out. When even the last turn does not fit after the prompt, the prompt and the last turn cut in the
    middle (first and last halves kept, as ``rows.encode_prompts``), and True."""
    if len(prompt) + len(body) <= max_tokens:
        return prompt + body, 0, False
    for dropped, start in enumerate(starts[1:], start=1):
        if len(prompt) + len(body) - start <= max_tokens:
            return prompt + body[start:], dropped, False
    context = prompt + body[starts[-1]:] if starts else prompt + body
    head = max_tokens // 2
    return context[:head] + context[len(context) - (max_tokens - head):], max(len(starts) - 1, 0), True


def collect_trajectories(backend, tokenizer, rollout, seeds: list[int], config: RolloutConfig,
                         stats: dict[str, float], greedy: bool = False, id_offset: int = 0,
                         groups: list[int] | None = None, sampling_seed: int | None = None
                         ) -> tuple[list[Row], list[Any]]:
    """``collect_rows`` in the trajectory layout: same arguments, same batching (one ``backend.generate`` call per
    turn over all active episodes), one row per episode of ``groups`` (default: all). The env's next message is
    the last message of ``rollout.messages(i)`` (use ``history_length=0``: the sequence already holds the
    history)."""
    rollout.reset(seeds, groups)
    played = set(rollout.active()) | set(rollout.failures())
    n = rollout.num_episodes
    prompts = {}
    bodies: dict[int, list[int]] = {i: [] for i in range(n)}
    masks: dict[int, list[int]] = {i: [] for i in range(n)}
    spans: dict[int, list[TurnSpan]] = {i: [] for i in range(n)}
    flags: dict[int, list[tuple[bool, bool]]] = {i: [] for i in range(n)}
    anchors: dict[int, Any] = {}
    stops: dict[int, list[str]] = {i: [] for i in range(n)}
    eos = tokenizer.eos_token_id
    envs = rollout.envs
    for _ in range(config.max_turns):
        active = rollout.active()
        if not active:
            break
        contexts, cuts = [], []
        for i in active:
            cut = False
            if i not in prompts:
                prompts[i], cut = encode_prompt(tokenizer, rollout.messages(i), config.max_prompt_tokens)
            context, dropped, overflow = fit_context(prompts[i], bodies[i], [s.start for s in spans[i]],
                                                     config.max_prompt_tokens)
            stats["dropped_history"] += dropped
            stats["truncated_prompts"] += cut or overflow
            contexts.append(context)
            cuts.append(cut or overflow)
        generated = backend.generate(contexts, config.max_response_tokens, config.temperature, config.top_p, greedy,
                                     config.top_k, **request_streams(rollout, active, greedy, sampling_seed))
        responses = cut_at_turn_end(tokenizer, [envs[i] for i in active], generated)
        reasons = turn_stop_reasons(backend, generated, responses, cuts, config.max_response_tokens,
                                    tokenizer.eos_token_id)
        texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
        turns = rollout.step(dict(zip(active, texts)), max_turns=config.max_turns)
        by_episode = {i: (list(r), reason) for i, r, reason in zip(active, responses, reasons)}
        for t in turns:
            i, (response, reason) = t.episode, by_episode[t.episode]
            stops[i].append("env_error" if t.env_error else reason)
            anchors.setdefault(i, t.anchor)
            start = len(bodies[i])
            bodies[i] += response
            masks[i] += [1] * len(response)
            spans[i].append(TurnSpan(start, len(bodies[i]), t.env_reward, t.format_penalty))
            flags[i].append((t.format_ok, t.action_is_valid))
            if not t.done:
                env_ids = env_turn_ids(tokenizer, rollout.messages(i)[-1]["content"],
                                       bool(response) and response[-1] == eos)
                bodies[i] += env_ids
                masks[i] += [0] * len(env_ids)
        stats["gen_tokens"] += sum(len(r) for r in responses)
    episodes = [e for e in rollout.episodes() if e.episode in played]
    count_stops(stats, [reason for i in sorted(stops) for reason in stops[i]], episodes)
    rows = []
    for i in sorted(prompts):
        if i not in played:
            continue
        ep = rollout.episodes()[i]
        rows.append(Row(group=rollout.group_of(i) + id_offset, episode=i + id_offset, turn=0, prompt_ids=prompts[i],
                        response_ids=bodies[i], step_reward=float(sum(s.env_reward for s in spans[i])),
                        format_penalty=float(sum(s.format_penalty for s in spans[i])),
                        format_ok=all(f for f, _ in flags[i]), action_is_valid=all(v for _, v in flags[i]),
                        anchor=anchors.get(i), won=ep.won, env_return=ep.env_return,
                        loss_mask=np.array(masks[i], dtype=np.float32), turns=spans[i],
                        stop=stops[i][-1] if stops[i] else "env_error"))
    return rows, episodes


def loss_masks(rows: list[Row]) -> list[np.ndarray]:
    """Every row's loss mask as an array (all ones for a step row)."""
    return [np.ones(len(r.response_ids), dtype=np.float32) if r.loss_mask is None
            else np.asarray(r.loss_mask, dtype=np.float32) for r in rows]
