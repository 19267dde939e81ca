"""Message text that cannot become a special token: an observation cannot forge a turn.

Prompts are rendered with the chat template and the rendered text is tokenized with special-token
parsing (the template's own markers must become their tokens). Text that came from an env -- tool
output, file contents, test output -- or from an earlier response could otherwise carry
``<|im_end|>\\n<|im_start|>system`` and put real turn markers into the next prompt. Every message
content is therefore escaped before rendering: each special token's text gets a zero-width space
after its first character, so it tokenizes as ordinary text and reads the same.
"""

from __future__ import annotations

import weakref

ZERO_WIDTH_SPACE = "\u200b"
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def special_texts(tokenizer) -> tuple[str, ...]:
    """Texts the tokenizer parses into special tokens (named ones and added ones flagged special), longest first."""
    try:
        return _CACHE[tokenizer]
    except (KeyError, TypeError):
        pass
    texts = set(getattr(tokenizer, "all_special_tokens", ()) or ())
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            texts.add(str(token))
    found = tuple(sorted((t for t in texts if len(t) > 1), key=len, reverse=True))
    try:
        _CACHE[tokenizer] = found
    except TypeError:  # not weak-referenceable: compute each time
        pass
    return found


def escape_special_tokens(text: str, tokenizer) -> str:
    """``text`` with every special token's text broken by a zero-width space (it stays readable)."""
    for special in special_texts(tokenizer):
        if special in text:
            text = text.replace(special, special[0] + ZERO_WIDTH_SPACE + special[1:])
    return text


def escape_messages(messages: list[dict[str, str]], tokenizer) -> list[dict[str, str]]:
    """Chat messages whose contents cannot become special tokens (roles and keys unchanged)."""
    return [{**m, "content": escape_special_tokens(m["content"], tokenizer)} if isinstance(m.get("content"), str)
            else m for m in messages]


def escape_turn_markers(text: str) -> str:
    """For text handed to a caller that tokenizes it (the TRL and OpenEnv adapters), without the caller's
    tokenizer: every ``<|`` gets a zero-width space, which breaks the special-token texts of ChatML-style templates
    (``<|im_start|>``, ``<|im_end|>``, ``<|eot_id|>``, ``<|endoftext|>`` ...)."""
    return text.replace("<|", "<" + ZERO_WIDTH_SPACE + "|")
