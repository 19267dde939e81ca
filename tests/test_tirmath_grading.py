"""TIR-Math grading: no answer is paid on two golds of different value, and every answer is decided fast.

The property tests call ``_zygote.grade`` (the rules the sandbox child applies) in this process on text the
tests generate; the end-to-end cases go through ``is_correct`` and the env, i.e. through the sandbox.
"""

from __future__ import annotations

import threading
import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arena_envs.tirmath import Problem, TIRMathEnv, is_correct, shared_sandbox
from arena_envs.tirmath._zygote import grade
from arena_envs.tirmath.answer import costly_reason


def _ok(gold: str, pred: str) -> bool:
    return grade("\\boxed{" + gold + "}", "\\boxed{" + pred + "}")


# --- objects with a value, and the ways an answer may write them ---------------------
small = st.integers(-12, 12)
PERCENT_SIGNS = ["\\%", " \\%", "%", " \\text{\\%}", " percent"]


def _num(v: Fraction) -> st.SearchStrategy[str]:
    """LaTeX spellings of the number ``v``."""
    sign = "-" if v < 0 else ""
    a = abs(v)
    forms = [f"{sign}\\frac{{{a.numerator}}}{{{a.denominator}}}", f"{sign}\\dfrac{{{a.numerator}}}{{{a.denominator}}}"]
    if a.denominator == 1:
        forms += [str(v.numerator), f"{v.numerator} \\text{{ cm}}", f"\\text{{{v.numerator}}}"]
    if (a * 100).denominator == 1 or a.denominator in (2, 4, 5, 8, 10, 20, 25):
        dec = format(float(v), "f").rstrip("0").rstrip(".")
        forms += [dec, f"{dec} \\text{{ m}}"]
    return st.sampled_from(forms)


@st.composite
def objects(draw):
    """(kind, value) of a drawn gold/answer object: a number, a percentage (its face value, 'num'), a finite set,
    a 3-tuple, or an interval."""
    kind = draw(st.sampled_from(["num", "pct", "set", "tuple", "interval"]))
    if kind in ("num", "pct"):
        return "num", Fraction(draw(small), draw(st.sampled_from([1, 1, 2, 4, 5])))
    if kind == "set":
        return "set", frozenset(draw(st.lists(small, min_size=2, max_size=3, unique=True)))
    if kind == "tuple":
        return "tuple", tuple(draw(st.lists(small, min_size=3, max_size=3)))
    a, b = sorted(draw(st.lists(small, min_size=2, max_size=2, unique=True)))
    return "interval", (a, b, draw(st.booleans()), draw(st.booleans()))


@st.composite
def spelled(draw, obj):
    kind, v = obj
    if kind == "num":
        text = draw(_num(v))
        if v.denominator == 1 and draw(st.booleans()):  # a percentage is read at its face value
            text = str(v.numerator) + draw(st.sampled_from(PERCENT_SIGNS))
        return text
    if kind == "set":
        items = [str(x) for x in draw(st.permutations(sorted(v)))]
        return draw(st.sampled_from(["\\{" + ", ".join(items) + "\\}", ", ".join(items)]))
    if kind == "tuple":
        return "(" + ", ".join(map(str, v)) + ")"
    a, b, lo, ro = v
    return ("(" if lo else "[") + f"{a}, {b}" + (")" if ro else "]")


def _confusable(obj):
    """Objects of another value that one spelling of ``obj`` could be taken for: the number a hundred times
    smaller (``v\\%``) or a decimal off in the 7th place (6-place rounding), the same two numbers as a set,
    an open interval or a pair, the same elements as a set or a tuple."""
    kind, v = obj
    if kind == "num":
        return [("num", v / 100), ("num", v + Fraction(1, 3 * 10**7))]
    if kind == "interval":
        return [("set", frozenset(v[:2]))]
    if kind == "set":
        out = [("tuple", tuple(sorted(v)) + (0,) * (3 - len(v)))]
        if len(v) == 2:
            out.append(("interval", (*sorted(v), True, True)))
        return out
    return [("set", frozenset(v))]


def _spell_num_exactly(v: Fraction) -> str:
    if v.denominator % 10:
        return f"\\frac{{{v.numerator}}}{{{v.denominator}}}"
    return format(v.numerator / v.denominator, ".8f")


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_no_answer_is_paid_on_two_golds_of_different_value(data):
    """Draw a gold, a second gold of different value (half the time one it is easily confused with), and an
    answer spelling the first; the answer is never scored on both."""
    g1 = data.draw(objects())
    g2 = data.draw(st.one_of(st.sampled_from(_confusable(g1)), objects()).filter(lambda o: o != g1))
    pred = data.draw(spelled(g1))
    t1 = data.draw(spelled(g1))
    t2 = _spell_num_exactly(g2[1]) if g2[0] == "num" and g2[1] * 100 % 1 else data.draw(spelled(g2))
    assert not (_ok(t1, pred) and _ok(t2, pred)), (t1, t2, pred)


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_every_spelling_of_the_gold_value_is_paid(data):
    """The leniencies kept (units, ``\\text{}``, fractions/decimals, % at face value, set order and bare lists)
    still pay an answer of the gold's value: the rules above do not refuse what they should not."""
    obj = data.draw(objects())
    gold, pred = data.draw(spelled(obj)), data.draw(spelled(obj))
    assert _ok(gold, pred), (gold, pred)


@pytest.mark.parametrize("pct", [5, 12, 50, 75])
def test_a_percentage_is_paid_at_face_value_only(pct):
    """The issue's case: ``\\boxed{50\\%}`` was paid on gold ``50`` and on gold ``\\frac{1}{2}``."""
    box = shared_sandbox()
    frac = Fraction(pct, 100)
    assert is_correct(f"{pct}\\%", str(pct), box)
    assert not is_correct(f"{pct}\\%", f"\\frac{{{frac.numerator}}}{{{frac.denominator}}}", box)
    assert not is_correct(f"{pct}\\%", format(float(frac), "g"), box)
    assert is_correct(f"{pct}\\%", f"{pct}\\%", box) and is_correct(str(pct), f"{pct}\\%", box)


def test_an_open_interval_is_not_a_pair_or_a_set():
    """``(1, 3)`` was paid on the set ``\\{1, 3\\}`` and on the open interval ``(1, 3)``; a set was paid on a
    tuple of the same elements (``\\{5, 2\\}`` on ``(5, 2)``)."""
    box = shared_sandbox()
    assert is_correct("(1, 3)", "(1,3)", box)
    assert not is_correct("(1, 3)", "\\{1, 3\\}", box)
    assert not is_correct("\\{1, 3\\}", "(1, 3)", box)
    assert not is_correct("1, 3", "(1, 3)", box)
    assert not is_correct("\\{5, 2\\}", "(5, 2)", box) and not is_correct("(5, 2)", "\\{2, 5\\}", box)
    assert is_correct("3, 1", "\\{1, 3\\}", box)


def test_a_decimal_is_the_number_it_writes():
    """math-verify rounded both sides to 6 places: ``0.333333 \\text{ cm}`` was paid on ``\\frac{1}{3}`` though
    the in-process check refuses the bare ``0.333333``; both are exact now."""
    box = shared_sandbox()
    assert not is_correct("0.333333", "\\frac{1}{3}", box)
    assert not is_correct("0.333333 \\text{ cm}", "\\frac{1}{3}", box)
    assert not is_correct("99.9999996 \\text{ m}", "100", box)
    assert is_correct("1.5 \\text{ cm}", "\\frac{3}{2}", box)


@pytest.mark.parametrize("pred,gold", [
    ("5 \\text{ cm}", "5"), ("\\text{5}", "5"), ("٥", "5"), ("٣/٤", "\\frac{3}{4}"), ("５０", "50"),
    ("x = 5", "5"), ("\\{3\\}", "3"), ("1,000", "1000"), ("30^\\circ", "30"), ("\\{2, 1\\}", "1, 2"),
])
def test_deliberate_leniencies_are_kept(pred, gold):
    """Units, ``\\text{}``, decimal digits of other scripts, ``x = v``, a singleton set, thousands separators,
    degrees, set order (docs/environments.md lists them)."""
    assert is_correct(pred, gold, shared_sandbox())


def test_through_env_steps():
    env = TIRMathEnv(data=[Problem("q?", "\\frac{1}{2}", "t")])
    try:
        for gold, reward in (("\\frac{1}{2}", 0.0), ("50", 1.0)):
            env.reset(seed=0, options={"problem": Problem("What share?", gold, "t")})
            assert env.step("So \\boxed{50\\%}")[1] == reward
    finally:
        env.close()


# --- every answer is decided fast ----------------------------------------------------
HOSTILE = ["9^{9^{9}}", "e^{e^{e^{e^{e}}}}", "99999999!", "\\binom{10^{9}}{10^{5}}", "\\Gamma(10^{8})",
           "(" * 400 + "1" + ")" * 400, "10^{10^{10}}", "9^9^9", "2^{99999999}", "(10^{9})!",
           "\\exp(\\exp(\\exp(\\exp(10))))", "\\prod_{k=1}^{99999999} k", "\\frac{" * 30 + "1" + "}{2}" * 30]


@pytest.mark.parametrize("answer", HOSTILE, ids=range(len(HOSTILE)))
def test_each_costly_answer_is_decided_in_under_a_second(answer):
    start = time.monotonic()
    assert not is_correct(answer, "7", shared_sandbox())
    assert time.monotonic() - start < 1.0
    assert costly_reason(answer) is not None


@pytest.mark.parametrize("answer", ["x^{2}+1", "2^{2023}", "\\frac{\\sqrt{3}}{2}", "5!", "(n+1)!", "\\binom{10}{3}",
                                    "\\Gamma(5)", "e^{2x}", "30^\\circ", "\\sum_{k=1}^{n} k^{2}", "10^{100}"])
def test_ordinary_answers_pass_the_pre_check(answer):
    assert costly_reason(answer) is None


def test_synthetic_golds_pass_the_pre_check():
    import numpy as np

    from arena_envs.tirmath import generate_problem

    assert not [p.answer for s in range(100) for p in [generate_problem(np.random.default_rng(s))]
                if costly_reason(p.answer)]


def test_one_slow_check_does_not_delay_another():
    """A check that uses its whole budget (sent straight to the sandbox, past the pre-check) runs beside an
    ordinary one, which answers before it instead of queueing behind it (calls were serialised)."""
    box = shared_sandbox()  # warm already (the checks above); it keeps the second server it starts here
    slow_end: list[float] = []

    def slow():
        box.verify("\\boxed{7}", "\\boxed{9^{9^{9}}}")
        slow_end.append(time.monotonic())

    assert box.verify("\\boxed{1}", "\\boxed{1}")
    with box._lock:  # while the first server is busy, a check starts (or uses) a second one
        assert box.verify("\\boxed{1}", "\\boxed{1}")
    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.2)
    assert box.verify("\\boxed{\\frac{1}{2}}", "\\boxed{\\sqrt{\\frac{1}{4}}}")
    fast_end = time.monotonic()
    t.join()
    assert fast_end < slow_end[0], (fast_end, slow_end)
