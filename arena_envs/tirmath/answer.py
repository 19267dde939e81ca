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
#: CPU seconds one symbolic check may take in the sandbox (its wall clock: ``sandbox.VERIFY_WALL_FACTOR`` times more)
VERIFY_BUDGET = 1.0
#: deepest bracket nesting (``(``, ``[``, ``{``) a checked answer may have
MAX_NESTING = 16
#: largest integer literal in an exponent, and in the argument of a factorial, binomial or Gamma
MAX_EXPONENT, MAX_COMBINATORIAL = 10**5, 10**4
_GROWTH = re.compile(r"\\(?:[dt]?binom|choose|Gamma|exp|operatorname)|\^|!")
_FUNCTION_ARG = re.compile(r"\\(?:[dt]?binom|Gamma|exp)\s*")
_INT = re.compile(r"\d+")


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


def _group_end(text: str, i: int) -> int:
    """End of the argument starting at ``i``: a balanced ``{...}``/``(...)``/``[...]`` group, a ``\\command``,
    or one character (digits and letters of a number or name run together: ``99999999``)."""
    n = len(text)
    while i < n and text[i] == " ":
        i += 1
    if i >= n:
        return n
    pairs = {"{": "}", "(": ")", "[": "]"}
    if text[i] in pairs:
        depth, j = 0, i
        while j < n:
            if text[j] == "\\":
                j += 2
                continue
            if text[j] in pairs:
                depth += 1
            elif text[j] in pairs.values():
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return n
    j = i + 1
    if text[i] == "\\":
        while j < n and text[j].isalpha():
            j += 1
        return j
    while j < n and (text[j].isalnum() or text[j] == "."):
        j += 1
    return j


def _group_start(text: str, end: int) -> int:
    """Start of the argument that ends just before ``end`` (for a postfix ``!``)."""
    closing = {"}": "{", ")": "(", "]": "["}
    i = end - 1
    while i >= 0 and text[i] == " ":
        i -= 1
    if i < 0:
        return 0
    if text[i] in closing:
        depth = 0
        while i >= 0:
            if text[i] in closing:
                depth += 1
            elif text[i] in closing.values():
                depth -= 1
                if depth == 0:
                    return i
            i -= 1
        return 0
    while i > 0 and (text[i - 1].isalnum() or text[i - 1] == "."):
        i -= 1
    return i


def _explodes(arg: str, limit: int) -> bool:
    """An argument that may denote a number too large to compute: another power, factorial, binomial, Gamma or
    exponential inside it (a tower), or an integer literal above ``limit``."""
    return bool(_GROWTH.search(arg)) or any(len(m) > 7 or int(m) > limit for m in _INT.findall(arg))


def costly_reason(text: str) -> str | None:
    """Why checking ``text`` symbolically could take unbounded time, or ``None``: a bounded pre-check, linear in
    the text, before math-verify (whose parser evaluates ``9^{9^{9}}``, ``99999999!``, ``\\Gamma(10^{8})`` in
    full, and recurses through deep nesting). Such an answer is decided by its text alone: wrong unless it is
    the gold answer verbatim. Deliberately coarse: a tower such as ``2^{2^{3}}`` is refused too."""
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    if deepest > MAX_NESTING:
        return f"nesting deeper than {MAX_NESTING}"
    for i, ch in enumerate(text):
        if ch == "^":
            end = _group_end(text, i + 1)
            if (_explodes(text[i + 1:end], MAX_EXPONENT) or text[end:].lstrip().startswith("^")
                    or "^" in text[_group_start(text, i):i]):  # a^b^c, {a^b}^c: towers too
                return "a tower of powers or a huge exponent"
        if ch == "!" and _explodes(text[_group_start(text, i):i], MAX_COMBINATORIAL):
            return "the factorial of a large or nested argument"
    for m in _FUNCTION_ARG.finditer(text):
        end = _group_end(text, m.end())
        if m.group().startswith(("\\binom", "\\dbinom", "\\tbinom")):
            end = _group_end(text, end)
        if _explodes(text[m.end():end], MAX_COMBINATORIAL):
            return f"{m.group().strip()} of a large or nested argument"
    return None


def is_correct(pred: str | None, gold: str, sandbox: Sandbox, timeout: float = VERIFY_BUDGET) -> bool:
    """math-verify equivalence of two answers (contents of ``\\boxed{}``, LaTeX or plain), under the grading
    rules of ``_zygote.grade`` (percentages at face value, intervals/sets/tuples never mixed, exact decimals).

    Identical strings and plain numbers/fractions are decided here, and so is an answer ``costly_reason``
    refuses; everything else goes through ``Sandbox.verify`` (``timeout`` CPU seconds at most) because math-verify's
    expression parser evaluates its input and its own timeouts rely on ``signal.alarm`` (main thread only), so
    the time limit is enforced by the sandbox.
    """
    if pred is None or not pred.strip() or len(pred) > MAX_ANSWER_CHARS:
        return False
    if pred.strip() == gold.strip():
        return True
    p, g = as_number(pred), as_number(gold)
    if p is not None and g is not None:  # exact arithmetic, no parser needed
        return p == g
    if costly_reason(pred) is not None:
        return False
    return sandbox.verify("\\boxed{" + gold + "}", "\\boxed{" + pred + "}", timeout=timeout)
