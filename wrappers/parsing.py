"""Strict parsing of a policy response into (think, action).

The only accepted shape is one ``<think>…</think>`` followed by one
``<action>…</action>``, optionally surrounded by whitespace; tags are matched
case-insensitively (as in ARLArena's projection code). Anything else — missing,
repeated, nested or out-of-order tags, text outside the tags — is malformed, so a
model can never get an action executed by hiding it in free text.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_TAGS = ("<think>", "</think>", "<action>", "</action>")
_STRICT = re.compile(r"\s*<think>(.*?)</think>\s*<action>(.*?)</action>\s*", re.DOTALL | re.IGNORECASE)


class ParsedResponse(NamedTuple):
    action: str | None  # stripped content of <action>, None when the format is not ok
    think: str | None
    format_ok: bool


def parse_response(text: object) -> ParsedResponse:
    """Parse ``text``; never raises (non-strings are malformed)."""
    if not isinstance(text, str):
        return ParsedResponse(None, None, False)
    lowered = text.lower()
    if any(lowered.count(tag) != 1 for tag in _TAGS):
        return ParsedResponse(None, None, False)
    match = _STRICT.fullmatch(text)
    if match is None:
        return ParsedResponse(None, None, False)
    return ParsedResponse(match.group(2).strip(), match.group(1).strip(), True)


def format_response(action: str, think: str = "") -> str:
    """The canonical well-formed response (for experts, tests and SFT data)."""
    return f"<think>{think}</think><action>{action}</action>"
