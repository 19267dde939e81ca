"""The "trajectory" row layout: one training row per episode, the whole interleaved conversation as one sequence.

In the "step" layout (ARLArena's) every turn is a row whose prompt is re-rendered from the env's messages. Here
(the Practitioner's Guide, SimpleTIR, TRL's multi-turn training) the policy generates every turn on the growing
token sequence first prompt + response 1 + env tokens 1 + response 2 + ...; the generated token ids are kept as
they were sampled (never re-tokenized), the env's tokens (the end of the assistant turn, the next user message
and the generation prompt, as the chat template writes them) are appended, and the finished episode is one
``Row``: ``prompt_ids`` = the first prompt, ``response_ids`` = everything after it, ``loss_mask`` = 1 on the
policy's tokens and 0 on the env's (so the loss, KL and entropy terms skip them), ``turns`` = each turn's span.

Every turn holds exactly one end-of-turn token: the sampled one, when the response ended (any id of the chat
format, ``arena_train.chat``: Gemma's ``<end_of_turn>``, Llama's ``<|eot_id|>``), else the template's own, from
the env's tokens (a response the token limit cut stays cut: its sampled ids are kept as they are, and the
template closes the turn). Sampled rows carry the behaviour policy's log-probs of their tokens (``rollout_logp``,
from the backend's ``generate_scored``; 0 on the env's tokens, which the mask drops), so the rollout correction
(``--rollout-is``) and its ``rollout_is/*`` metrics apply to trajectory rows as to step rows.

A context longer than ``max_prompt_tokens`` drops its oldest turns first, as the step layout drops its oldest
history pairs (``fit_context``; counted in ``dropped_history``): the first prompt (instructions, task) and the
latest turns stay. Only when the first prompt and the last turn alone are over the budget is the context cut in
the middle (``truncated_prompts``, stop reason ``context_overflow``). Either way the row ends there and the
episode goes on in a new row whose prompt is exactly that shorter context (same episode id, ``turn`` = its first
turn), so every row is trained on the context the policy generated from; the rows of one episode share its
return (``arena_train.rewards``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from arena_train.chat import SENTINEL, format_of, render
from arena_train.rows import (
    RolloutConfig,
    Row,
    TurnSpan,
    count_stops,
    cut_at_turn_end,
    encode_prompt,
    keeps_rollout_logp,
    turn_stop_reasons,
)
from arena_train.streams import request_streams
from wrappers.special_tokens import escape_special_tokens


def env_turn_ids(tokenizer, observation: str, response_ended: bool) -> list[int]:
    """Token ids the chat template puts between an assistant response and the next one when the user (the env)
    answers ``observation``: the assistant's end marker (left out when the response already ended with an
    end-of-turn token: one marker per turn), the user message and the generation prompt, rendered with the run's
    template arguments."""
    messages = [{"role": "user", "content": "task"}, {"role": "assistant", "content": SENTINEL},
                {"role": "user", "content": escape_special_tokens(observation, tokenizer)}]
    text = render(tokenizer, [messages])[0]
    ids = list(tokenizer(text[text.index(SENTINEL) + len(SENTINEL):], add_special_tokens=False)["input_ids"])
    if response_ended and ids and ids[0] in format_of(tokenizer).end_ids:
        ids = ids[1:]
    return ids


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


@dataclass
class _Segment:
    """The row an episode is writing: its prompt (the generation context when it opened), where its response
    starts in the episode's body, and how that context was fitted (turns dropped, cut in the middle)."""

    prompt: list[int]
    body_start: int
    first_turn: int
    fit: tuple[int, bool]


@dataclass
class _Episode:
    """One episode's whole token sequence after its first prompt, with per-token mask and behaviour log-probs, its
    turns' spans, format flags and stop reasons, and the rows it closed so far."""

    prompt: list[int]
    body: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    spans: list[TurnSpan] = field(default_factory=list)
    flags: list[tuple[bool, bool]] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)
    closed: list[tuple[_Segment, int, int]] = field(default_factory=list)  # (segment, turns end, body end)
    open: _Segment | None = None

    def context(self, max_tokens: int, stats: dict[str, float], cut: bool) -> tuple[list[int], bool]:
        """The next turn's generation context (``fit_context``), opening a new row when it is not the open row's
        prompt + response so far; and whether it was cut beyond dropping turns."""
        context, dropped, overflow = fit_context(self.prompt, self.body, [s.start for s in self.spans], max_tokens)
        stats["dropped_history"] += dropped
        stats["truncated_prompts"] += cut or overflow
        fit = (dropped, overflow)
        if self.open is None or overflow or fit != self.open.fit:
            self.close()
            self.open = _Segment(context, len(self.body), len(self.spans), fit)
        return context, cut or overflow

    def close(self) -> None:
        if self.open is not None and len(self.spans) > self.open.first_turn:
            self.closed.append((self.open, len(self.spans), len(self.body)))
        self.open = None


def collect_trajectories(backend, tokenizer, rollout, seeds: list[int], config: RolloutConfig,
                         stats: dict[str, float], greedy: bool = False, id_offset: int = 0,
                         groups: list[int] | None = None, sampling_seed: int | None = None
                         ) -> tuple[list[Row], list[Any]]:
    """``collect_rows`` in the trajectory layout: same arguments, same batching (one generate call per turn over
    all active episodes; ``generate_scored`` for rows that may be trained on), one row per episode of ``groups``
    (default: all), more when its context outgrew the budget (module docstring). The env's next message is the
    last message of ``rollout.messages(i)`` (use ``history_length=0``: the sequence already holds the history)."""
    rollout.reset(seeds, groups)
    played = set(rollout.active()) | set(rollout.failures())
    scored = keeps_rollout_logp(backend, seeds, greedy)
    end_ids = format_of(tokenizer).end_ids
    episodes: dict[int, _Episode] = {}
    anchors: dict[int, Any] = {}
    envs = rollout.envs
    for _ in range(config.max_turns):
        active = rollout.active()
        if not active:
            break
        contexts, cuts = [], []
        for i in active:
            cut = False
            if i not in episodes:
                prompt, cut = encode_prompt(tokenizer, rollout.messages(i), config.max_prompt_tokens)
                episodes[i] = _Episode(prompt)
            context, cut = episodes[i].context(config.max_prompt_tokens, stats, cut)
            contexts.append(context)
            cuts.append(cut)
        streams = request_streams(rollout, active, greedy, sampling_seed)
        if scored:
            generated, logps, entropies = backend.generate_scored(
                contexts, config.max_response_tokens, config.temperature, config.top_p, config.top_k, **streams)
        else:
            generated = backend.generate(contexts, config.max_response_tokens, config.temperature, config.top_p,
                                         greedy, config.top_k, **streams)
            logps = entropies = [[0.0] * len(g) for g in generated]
        responses = cut_at_turn_end(tokenizer, [envs[i] for i in active], generated)
        reasons = turn_stop_reasons(backend, generated, responses, cuts, config.max_response_tokens, end_ids)
        texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
        turns = rollout.step(dict(zip(active, texts)), max_turns=config.max_turns)
        by_episode = {i: (list(r), lp[:len(r)], h[:len(r)], reason)
                      for i, r, lp, h, reason in zip(active, responses, logps, entropies, reasons)}
        for t in turns:
            ep, (response, logp, entropy, reason) = episodes[t.episode], by_episode[t.episode]
            ep.stops.append("env_error" if t.env_error else reason)
            anchors.setdefault(t.episode, t.anchor)
            start = len(ep.body)
            ep.body += response
            ep.mask += [1] * len(response)
            ep.logp += logp
            ep.entropy += entropy
            ep.spans.append(TurnSpan(start, len(ep.body), t.env_reward, t.format_penalty))
            ep.flags.append((t.format_ok, t.action_is_valid))
            if not t.done:
                env_ids = env_turn_ids(tokenizer, rollout.messages(t.episode)[-1]["content"],
                                       bool(response) and response[-1] in end_ids)
                ep.body += env_ids
                ep.mask += [0] * len(env_ids)
                ep.logp += [0.0] * len(env_ids)
                ep.entropy += [0.0] * len(env_ids)
        stats["gen_tokens"] += sum(len(r) for r in responses)
    kept = [e for e in rollout.episodes() if e.episode in played]
    count_stops(stats, [reason for i in sorted(episodes) for reason in episodes[i].stops], kept)
    rows = []
    for i in sorted(episodes):
        if i not in played:
            continue
        ep, stats_i = episodes[i], rollout.episodes()[i]
        ep.close()
        for segment, turns_end, body_end in ep.closed:
            rows.append(_segment_row(ep, segment, turns_end, body_end, scored, rollout.group_of(i) + id_offset,
                                     i + id_offset, anchors.get(i), stats_i))
    return rows, kept


def _segment_row(ep: _Episode, segment: _Segment, turns_end: int, body_end: int, scored: bool, group: int,
                 episode: int, anchor: Any, stats: Any) -> Row:
    """The row of one segment of an episode: its prompt, the episode's tokens after it up to the segment's last
    turn (the env's tokens that follow a last turn belong to the next row's prompt), spans rebased to it."""
    turns = ep.spans[segment.first_turn:turns_end]
    lo, hi = segment.body_start, turns[-1].end
    spans = [TurnSpan(s.start - lo, s.end - lo, s.env_reward, s.format_penalty) for s in turns]
    flags = ep.flags[segment.first_turn:turns_end]
    mask = np.array(ep.mask[lo:hi], dtype=np.float32)
    row = Row(group=group, episode=episode, turn=segment.first_turn, prompt_ids=segment.prompt,
              response_ids=ep.body[lo:hi], step_reward=float(sum(s.env_reward for s in spans)),
              format_penalty=float(sum(s.format_penalty for s in spans)),
              format_ok=all(f for f, _ in flags), action_is_valid=all(v for _, v in flags), anchor=anchor,
              won=stats.won, env_return=stats.env_return, loss_mask=mask, turns=spans,
              stop=ep.stops[turns_end - 1])
    if scored:
        row.rollout_logp = np.asarray(ep.logp[lo:hi], dtype=np.float32)
        policy = mask > 0
        row.rollout_entropy = float(np.asarray(ep.entropy[lo:hi])[policy].mean()) if policy.any() else 0.0
    return row


def loss_masks(rows: list[Row]) -> list[np.ndarray]:
    """Every row's loss mask as an array (all ones for a step row)."""
    return [np.ones(len(r.response_ids), dtype=np.float32) if r.loss_mask is None
            else np.asarray(r.loss_mask, dtype=np.float32) for r in rows]
