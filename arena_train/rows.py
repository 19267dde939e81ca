"""What both row layouts share, below ``rollout`` (the "step" layout and the collection loop) and ``trajectory``
(the "trajectory" layout), so that neither imports the other for it: the row and turn records, the rollout
settings, prompt encoding and the cut of a response at its env's turn end."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import numpy as np

from arena_train.chat import render
from wrappers.special_tokens import escape_messages

#: Task seeds >= this are held out for evaluation; training task seeds are drawn below it.
EVAL_SEED_OFFSET = 1_000_000_000


def keeps_rollout_logp(backend, seeds: list[int], greedy: bool) -> bool:
    """Whether a rollout's rows carry the behaviour policy's log-probs (``Row.rollout_logp``, from the backend's
    ``generate_scored``): sampled rows that may be trained on; greedy rollouts and held-out seeds (evaluation:
    never trained on) skip that work, and a custom backend with ``generate`` only leaves them unset."""
    return not greedy and hasattr(backend, "generate_scored") and any(seed < EVAL_SEED_OFFSET for seed in seeds)


@dataclass(frozen=True)
class TurnSpan:
    """One turn inside a trajectory row: its response tokens ``response_ids[start:end]`` and its rewards."""

    start: int
    end: int
    env_reward: float  # env reward of this turn, before the format penalty
    format_penalty: float


class RowNotScored(RuntimeError):
    """A row field read before the pass that fills it (``Row.old_logp``, ``Row.entropy``)."""


@dataclass
class Later:
    """Which fields of a row ``score_rows`` left for later (the update's first mini-batch: its own forward pass gives
    those rows' old log-probs), and the one call that fills them now: ``score`` = that ``score_rows`` call on
    other rows (``arena_train.batching.score_all``). Scored rows share one ``Later`` with no fields."""

    fields: set[str]
    score: Callable[[list[Row]], None] = field(repr=False)


class FilledByScoring:
    """A ``Row`` field filled by ``score_rows``: reading it while the row's ``later`` lists it raises
    ``RowNotScored`` instead of returning the placeholder (None, 0.0), which would be a wrong number, not a marker.
    The machinery that fills the field reads it with ``Row.stored``."""

    def __init__(self, default: Any) -> None:
        self.default = default

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, row: Row | None, owner: type | None = None) -> Any:
        if row is None:  # the class attribute: the dataclass's default
            return self.default
        later = row.later
        if later is not None and self.name in later.fields:
            raise RowNotScored(
                f"Row.{self.name} is not filled yet: this row is in the update's first mini-batch, which score_rows "
                f"leaves to the update's own forward pass (arena_train.batching.fill_old_logp fills old_logp there; "
                f"entropy only a scoring pass fills). To read it now, call arena_train.batching.score_all(rows) "
                f"first: one no-grad pass over the rows not scored yet, whose log-probs the update then uses.")
        return row.__dict__[self.name]

    def __set__(self, row: Row, value: Any) -> None:
        row.__dict__[self.name] = value
        later = row.later
        if later is not None and self.name in later.fields:
            later.fields.discard(self.name)


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
    old_logp: np.ndarray | None = FilledByScoring(None)  # (len(response_ids),) log-probs before the update
    ref_logp: np.ndarray | None = None  # (len(response_ids),) log-probs of the reference model
    entropy: float = FilledByScoring(0.0)  # mean token entropy of the response under the old policy (EMPG)
    rollout_logp: np.ndarray | None = None  # (len(response_ids),) log-probs from the generation pass itself
    rollout_entropy: float = 0.0  # mean token entropy from the generation pass (with rollout_logp)
    extra: dict[str, Any] = field(default_factory=dict)  # room for method-specific data
    loss_mask: np.ndarray | None = None  # (len(response_ids),) 1 = policy token, 0 = env token; None = all 1
    turns: list[TurnSpan] = field(default_factory=list)  # trajectory rows: every turn's span (empty for step rows)
    stop: str = "eos"  # why the response ended (TURN_STOPS; a trajectory row: its last turn's)
    later = None  # a Later: which fields score_rows left for later (not a dataclass field: it holds the policy)

    def stored(self, name: str) -> Any:
        """A field's value as stored, without ``RowNotScored``: for the machinery that fills it."""
        return self.__dict__[name]

    def __repr__(self) -> str:  # a row waiting for its old log-probs can still be printed
        later = self.later.fields if self.later is not None else ()
        shown = (f"{f.name}={'<not scored yet>' if f.name in later else repr(self.stored(f.name))}"
                 for f in fields(self) if f.repr)
        return f"Row({', '.join(shown)})"


#: Why a turn's response ended (docs/metrics.md "Stop reasons"): its end token, the env's turn end (the env read
#: the turn as complete: the response is cut there), the token limit, a prompt cut even after dropping all
#: history, or an env error in the step it fed.
TURN_STOPS = ("eos", "turn_end", "max_response_tokens", "context_overflow", "env_error")
#: Why an episode ended: won, another terminal state, the run's turn budget (--max-turns), the env's own step
#: limit (truncated), or an env error (exception, crashed worker, timeout).
EPISODE_STOPS = ("won", "terminated", "max_turns", "truncated", "env_error")


def count_stops(stats: dict[str, float], turn_stops: list[str], episodes: list[Any]) -> None:
    """Add one to ``stats["stop/<reason>"]`` per turn and to ``stats["stop/episode/<reason>"]`` per ended
    episode (``rows.TURN_STOPS``, ``rows.EPISODE_STOPS``)."""
    for reason in turn_stops:
        stats[f"stop/{reason}"] += 1
    for e in episodes:
        stats[f"stop/episode/{e.stop}"] += 1


def turn_stop_reasons(backend, generated: list[list[int]], kept: list[list[int]], prompt_cut: list[bool],
                      max_new_tokens: int, end_ids: Collection[int]) -> list[str]:
    """Why each response of one generate call ended (``TURN_STOPS`` but ``env_error``, which the env step adds):
    ``context_overflow`` when its prompt was cut beyond dropping history, ``turn_end`` when ``cut_at_turn_end``
    shortened it (``kept``), else the backend's ``last_stop_reasons``; a backend that keeps none is read from the
    ids: a response without an end-of-turn token (``end_ids``) at the token limit was cut by it."""
    reported = getattr(backend, "last_stop_reasons", None)
    if reported is None or len(reported) != len(generated):
        reported = ["max_response_tokens" if len(ids) >= max_new_tokens and (not ids or ids[-1] not in end_ids)
                    else "eos" for ids in generated]
    return ["context_overflow" if cut else "turn_end" if len(k) < len(g) else reason
            for g, k, cut, reason in zip(generated, kept, prompt_cut, reported)]


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


def encode_prompts(tokenizer, conversations: list[list[dict[str, str]]], max_tokens: int
                   ) -> list[tuple[list[int], bool]]:
    """Chat-template token ids with the generation prompt of each conversation, and whether they were cut to
    ``max_tokens``; one batched template call and one batched tokenizer call.

    A cut drops the middle and keeps the first and last halves: the start holds the instructions and the task,
    the end the admissible actions, the answer format and the generation prompt."""
    if not conversations:
        return []
    conversations = [escape_messages(c, tokenizer) for c in conversations]  # env text never becomes a special token
    texts = render(tokenizer, conversations)  # with the run's template arguments (arena_train.chat)
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
