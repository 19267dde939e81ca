"""Parsing of TIR responses (code blocks, ``\\boxed{}`` answers) and answer checking.

Extraction follows ARLArena/SimpleTIR: the first fenced ```python block is the tool call
(generation stops there), and the **last** ``\\boxed{...}`` is the final answer. Boxed
contents are matched with a brace counter (any nesting depth, ``\\{``/``\\}`` escapes),
which is stricter than ARLArena's two-level regex.
"""

from __future__ import annotations

import re
from fractions import Fraction

from arena_envs.tirmath.sandbox import Sandbox

#: ARLArena's code pattern, tolerant of a missing newline before the closing fence.
CODE_RE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)\n?```", re.DOTALL)
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
#: longest answer (``\\boxed{}`` content) checked; a longer one is a wrong answer, never an error
MAX_ANSWER_CHARS = 1000


def _closing_braces(text: str) -> dict[int, int]:
    """Index of each ``{`` -> index just past its closing ``}``, in one pass (``\\x`` escapes skipped)."""
    closing, stack, i, n = {}, [], 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            closing[stack.pop()] = i + 1
        i += 1
    return closing


def extract_boxed_all(text: str) -> list[str]:
    """Contents of every complete outermost ``\\boxed{...}`` in order (unclosed ones are skipped).

    Linear time whatever the text (thousands of unclosed ``\\fbox{`` included): braces are matched
    once for the whole text instead of rescanning the rest after each opening.
    """
    closing = _closing_braces(text)
    found, end = [], 0
    for m in _BOXED_RE.finditer(text):
        close = closing.get(m.end() - 1)
        if close is None or m.start() < end:  # unclosed, or nested in the previous answer
            continue
        found.append(text[m.end():close - 1])
        end = close
    return found


def first_boxed_end(text: str) -> int | None:
    """Index just past the first complete ``\\boxed{...}`` (linear time), or ``None``."""
    closing = _closing_braces(text)
    return next((closing[m.end() - 1] for m in _BOXED_RE.finditer(text) if m.end() - 1 in closing), None)


def extract_boxed(text: str) -> str | None:
    """The last complete ``\\boxed{...}`` content, or ``None``."""
    found = extract_boxed_all(text)
    return found[-1] if found else None


def extract_code(text: str) -> tuple[str | None, int]:
    """(code of the first fenced block, index where the response is cut), or (None, len)."""
    m = CODE_RE.search(text)
    return (m.group(1), m.end()) if m else (None, len(text))


def gsm8k_final(answer_field: str) -> str:
    """The number after ``####`` in a GSM8K answer, thousands separators removed."""
    tail = answer_field.rsplit("####", 1)[-1].strip()
    return tail.replace(",", "").rstrip(".")


_NUMBER_RE = re.compile(r"\s*(-?)\s*(?:(\d+(?:\.\d+)?)|\\d?frac\{(\d+)\}\{(\d+)\}|(\d+)\s*/\s*(\d+))\s*")


def as_number(text: str) -> Fraction | None:
    """Exact value of a plain number, ``a/b`` or ``\\frac{a}{b}``; ``None`` for anything else (longer
    than ``MAX_ANSWER_CHARS`` included: Python refuses to convert integers of more than 4,300 digits)."""
    if len(text) > MAX_ANSWER_CHARS:
        return None
    m = _NUMBER_RE.fullmatch(text)
    if m is None:
        return None
    sign, dec, fn, fd, sn, sd = m.groups()
    num, den = (fn, fd) if fn is not None else (sn, sd) if sn is not None else (dec, "1")
    if int(den) == 0:
        return None
    value = Fraction(num) / Fraction(den)
    return -value if sign else value


def is_correct(pred: str | None, gold: str, sandbox: Sandbox, timeout: float = 5.0) -> bool:
    """math-verify equivalence of two answers (contents of ``\\boxed{}``, LaTeX or plain).

    Identical strings and plain numbers/fractions are decided here; everything else goes through
    ``Sandbox.verify`` because math-verify's expression parser evaluates its input and its own timeouts rely on
    ``signal.alarm`` (main thread only), so the time limit is enforced by the sandbox.
    """
    if pred is None or not pred.strip() or len(pred) > MAX_ANSWER_CHARS:
        return False
    if pred.strip() == gold.strip():
        return True
    p, g = as_number(pred), as_number(gold)
    if p is not None and g is not None:  # exact arithmetic, no parser needed
        return p == g
    return sandbox.verify("\\boxed{" + gold + "}", "\\boxed{" + pred + "}", timeout=timeout)
