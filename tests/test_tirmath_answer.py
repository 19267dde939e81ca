"""Properties of answer/code extraction and answer checking for TIR-Math."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arena_envs.tirmath.answer import as_number, extract_boxed, extract_boxed_all, extract_code, gsm8k_final

# text without braces/backslashes (so it cannot open, close or escape a group) incl. unicode
plain = st.text(st.characters(blacklist_characters="{}\\", blacklist_categories=("Cs",)), max_size=12)


@st.composite
def balanced(draw, depth=3):
    """Brace-balanced LaTeX-ish content, nested up to ``depth`` levels, with escaped braces."""
    parts = draw(st.lists(st.one_of(plain, st.sampled_from(["\\{", "\\}", "\\frac", "\\\\", "x^{2}"])),
                          max_size=4))
    if depth > 0 and draw(st.booleans()):
        parts.append("{" + draw(balanced(depth=depth - 1)) + "}")
    return "".join(parts)


@given(balanced(), plain, plain)
def test_boxed_roundtrip_any_nesting(content, before, after):
    assert extract_boxed(f"{before}\\boxed{{{content}}}{after}") == content


@given(st.lists(balanced(), min_size=1, max_size=4), plain)
def test_last_of_several_boxed(contents, sep):
    text = sep.join(f"\\boxed{{{c}}}" for c in contents)
    assert extract_boxed_all(text) == contents
    assert extract_boxed(text) == contents[-1]


@given(plain)
def test_missing_answer(text):
    assert extract_boxed(text) is None
    assert extract_boxed(text + "\\boxed{" + text) is None  # unclosed group is not an answer


@given(balanced(), balanced())
def test_unclosed_last_falls_back_to_previous(first, second):
    assert extract_boxed(f"\\boxed{{{first}}} then \\boxed{{{second}") == first


@given(st.text(max_size=200))
def test_extraction_never_raises(text):
    extract_boxed(text)
    code, cut = extract_code(text)
    assert 0 <= cut <= len(text) and (code is None or code in text)


def test_concrete_cases():
    assert extract_boxed("so \\boxed{\\frac{\\sqrt{3}}{2}} and \\boxed {5}") == "5"
    assert extract_boxed("\\boxed{\\{1, 2\\}}") == "\\{1, 2\\}"
    assert extract_boxed("答案是 \\boxed{π²}") == "π²"
    assert extract_code("a\n```python\nprint(1)\n```\nb ```py\nprint(2)\n```") == ("print(1)", 24)
    assert extract_code("```\nx = 1\n```")[0] == "x = 1"
    assert extract_code("no fence")[0] is None
    assert gsm8k_final("so 1,234 eggs\n#### 1,234") == "1234"


@given(st.integers(-10**6, 10**6), st.integers(1, 10**4))
def test_as_number_fractions(num, den):
    value = Fraction(num, den)
    sign = "-" if num < 0 else ""
    assert as_number(f"{sign}\\frac{{{abs(num)}}}{{{den}}}") == value
    assert as_number(f"{num}/{den}") == value


@settings(max_examples=20, deadline=None)
@given(st.integers(-50, 50), st.integers(1, 12), st.integers(-2, 2))
def test_numeric_shortcut_agrees_with_math_verify(num, den, shift):
    """The in-process exact comparison of numbers gives math-verify's verdict (run in the sandbox)."""
    from arena_envs.tirmath import shared_sandbox

    gold = ("-" if num < 0 else "") + f"\\frac{{{abs(num)}}}{{{den}}}"
    pred = f"{num + shift}/{den}"
    assert as_number(gold) is not None and as_number(pred) is not None
    assert (as_number(gold) == as_number(pred)) == shared_sandbox().verify("\\boxed{" + gold + "}",
                                                                           "\\boxed{" + pred + "}")


@pytest.mark.parametrize("pred,gold,ok", [
    ("3\\sqrt{13}", "\\sqrt{117}", True), ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("p - q", "-q+p", True), ("6", "5", False), (None, "5", False), ("", "5", False),
    ("__import__('os').system('false')", "0", False),
])
def test_is_correct_symbolic(pred, gold, ok):
    from arena_envs.tirmath import is_correct, shared_sandbox

    assert is_correct(pred, gold, shared_sandbox()) is ok
