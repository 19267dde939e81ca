"""A real model's chat format: which tokens end an assistant turn, which template renders the prompts and with which
arguments, and whether that template keeps earlier turns as they were once a message follows.

Why this is its own concern: a turn of Gemma 3 ends at ``<end_of_turn>`` while its eos is ``<eos>``, Llama 3
instruct ends at ``<|eot_id|>``, GPT-OSS at ``<|return|>`` (and ``<|call|>``), a base checkpoint at
``<|endoftext|>``. A sampler that stops at the tokenizer's eos alone generates such a model to the token limit every
turn. The end-of-turn ids are therefore found once per tokenizer (``configure``): the tokenizer's eos, every id of
the model's generation config (``eos_token_id`` there is an int or a list, as real checkpoints ship it), and the
token the template itself writes after an assistant message (rendered as the last message and followed by another,
which differ for GPT-OSS). Both rollout backends stop at any of them and the trajectory layout's env-turn delta
leaves its own end marker out when the sampled response already ended (``arena_train.trajectory``), so every turn
holds exactly one.

The format is kept per tokenizer object (a weak map, as ``wrappers.special_tokens`` caches its texts), so every
caller that holds the tokenizer renders and stops the same way without a new argument on every function: the run
configures it once after loading (``--chat-template``, ``--chat-template-kwargs``); an unconfigured tokenizer gets
the format its own template and eos give.

Prefix preservation: Qwen3 and DeepSeek-R1 drop the ``<think>`` of earlier assistant turns once a user message
follows, GPT-OSS renders an earlier final answer with ``<|end|>`` where it generated ``<|return|>``. The "step"
layout re-renders every prompt from the messages and is unaffected; the "trajectory" layout keeps the sampled tokens
(token in, token out), i.e. trains on what the training variant of such a template (TRL's ``<name>_training``,
``--chat-template qwen3_training``) renders. ``prefix_preserving`` detects the case, and the run says it once.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Stand-in for an assistant message when a template's text around it is needed.
SENTINEL = "<<ARL-RESPONSE>>"
_FORMATS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ChatFormat:
    """How one tokenizer renders and ends turns. ``end_ids``: every id that ends an assistant turn, the
    template's own terminator first (what a behaviour-cloning target ends with); ``template_kwargs``: passed to
    every ``apply_chat_template`` call (e.g. ``enable_thinking``); ``prefix_preserving``: earlier turns render the
    same whatever follows them."""

    end_ids: tuple[int, ...]
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    prefix_preserving: bool = True

    @property
    def terminator(self) -> int | None:
        """The id a complete response ends with (the template's own end of an assistant turn)."""
        return self.end_ids[0] if self.end_ids else None


def trl_templates() -> dict[str, Path]:
    """The chat templates TRL ships as ``.jinja`` files (``trl/chat_templates/``), by name; {} without TRL."""
    import importlib.util

    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return {}
    folder = Path(list(spec.submodule_search_locations)[0]) / "chat_templates"
    return {p.stem: p for p in sorted(folder.glob("*.jinja"))}


def template_problem(template: str | None, kwargs_json: str) -> str | None:
    """Why ``--chat-template`` / ``--chat-template-kwargs`` cannot apply (one line), or None."""
    if template:
        if not Path(template).is_file() and template not in trl_templates():
            names = ", ".join(sorted(trl_templates())[:12])
            return (f"error: --chat-template {template}: neither a .jinja file nor a template TRL ships "
                    f"(pip install trl; names such as {names}, ...)")
    try:
        parse_kwargs(kwargs_json)
    except ValueError as err:
        return f"error: --chat-template-kwargs {kwargs_json!r}: {err}"
    return None


def parse_kwargs(kwargs_json: str) -> dict[str, Any]:
    """``--chat-template-kwargs``: a JSON object (``'{"enable_thinking": false}'``); '' is {}."""
    if not kwargs_json.strip():
        return {}
    try:
        value = json.loads(kwargs_json)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON ({err.msg}); give an object such as '{{\"enable_thinking\": false}}'") from None
    if not isinstance(value, dict):
        raise ValueError("give a JSON object such as '{\"enable_thinking\": false}'")
    return value


def template_text(template: str) -> str:
    """The Jinja source of ``--chat-template``: a file's text, or the TRL template of that name."""
    path = Path(template) if Path(template).is_file() else trl_templates()[template]
    return path.read_text()


def configure(tokenizer, generation_config=None, template: str | None = None,
              template_kwargs: dict[str, Any] | None = None) -> ChatFormat:
    """Set ``tokenizer``'s template (``template``: a ``.jinja`` path or a TRL template name; None keeps its own)
    and record its format (end-of-turn ids from itself, ``generation_config`` and the template); returns it."""
    if template:
        tokenizer.chat_template = template_text(template)
    kwargs = dict(template_kwargs or {})
    fmt = ChatFormat(end_of_turn_ids(tokenizer, generation_config, kwargs), kwargs,
                     prefix_preserving(tokenizer, kwargs))
    _FORMATS[tokenizer] = fmt
    return fmt


def format_of(tokenizer) -> ChatFormat:
    """The tokenizer's configured format, or (first use, cached) the one its own template and eos give."""
    try:
        return _FORMATS[tokenizer]
    except KeyError:
        return configure(tokenizer)
    except TypeError:  # not weak-referenceable: compute each time
        return ChatFormat(end_of_turn_ids(tokenizer, None, {}), {}, prefix_preserving(tokenizer, {}))


def render(tokenizer, conversations: list[list[dict[str, str]]], add_generation_prompt: bool = True) -> list[str]:
    """The template's text of each conversation, with the configured template arguments."""
    return tokenizer.apply_chat_template(conversations, add_generation_prompt=add_generation_prompt, tokenize=False,
                                         **format_of(tokenizer).template_kwargs)


def end_of_turn_ids(tokenizer, generation_config=None, template_kwargs: dict[str, Any] | None = None
                    ) -> tuple[int, ...]:
    """Every id that ends an assistant turn, without repeats: the template's terminators first (the token it writes
    after an assistant message that is last, then after one that another message follows), then the
    tokenizer's eos and the generation config's eos ids."""
    kwargs = template_kwargs or {}
    ids: list[int] = []
    for terminator in _template_terminators(tokenizer, kwargs):
        if terminator not in ids:
            ids.append(terminator)
    eos = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    for candidate in [tokenizer.eos_token_id, *(eos if isinstance(eos, list | tuple) else [eos])]:
        if candidate is not None and int(candidate) not in ids:
            ids.append(int(candidate))
    return tuple(ids)


def _template_terminators(tokenizer, kwargs: dict[str, Any]) -> list[int]:
    """The special token right after an assistant message in the template's text, when the message is last and
    when a user message follows (none for a template that writes plain text there, or no template)."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    user = {"role": "user", "content": "task"}
    found = []
    for messages in ([user, {"role": "assistant", "content": SENTINEL}],
                     [user, {"role": "assistant", "content": SENTINEL}, {"role": "user", "content": "next"}]):
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        except Exception:  # noqa: BLE001 - a template that refuses this shape (e.g. a system message first) has none
            continue
        if SENTINEL not in text:
            continue
        after = text[text.index(SENTINEL) + len(SENTINEL):]
        ids = tokenizer(after, add_special_tokens=False)["input_ids"]
        if ids and ids[0] in set(tokenizer.all_special_ids) | _added_special_ids(tokenizer):
            found.append(int(ids[0]))
    return found


def _added_special_ids(tokenizer) -> set[int]:
    return {i for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items() if t.special}


def prefix_preserving(tokenizer, template_kwargs: dict[str, Any] | None = None) -> bool:
    """Whether the generation prompt is a prefix of the assistant turn the template renders, and a conversation's
    text a prefix of its text once a user message follows, for an assistant turn that thinks
    (``<think>...</think>`` before its answer): Qwen3's template strips it once a message follows, DeepSeek-V3's
    opens the generation prompt with a ``<think>`` it never renders. True without a template."""
    if not getattr(tokenizer, "chat_template", None):
        return True
    kwargs = template_kwargs or {}
    turn = [{"role": "user", "content": "task"},
            {"role": "assistant", "content": "<think>plan</think><action>up</action>"}]
    try:
        prompt = tokenizer.apply_chat_template(turn[:1], tokenize=False, add_generation_prompt=True, **kwargs)
        first = tokenizer.apply_chat_template(turn, tokenize=False, **kwargs)
        longer = tokenizer.apply_chat_template(turn + [{"role": "user", "content": "next"}], tokenize=False,
                                               add_generation_prompt=True, **kwargs)
    except Exception:  # noqa: BLE001 - a template that cannot render the probe cannot be vouched for
        return False
    return first.startswith(prompt) and longer.startswith(first)
