"""Seeded generation of SWE-Mini tasks: a small package with injected bugs, an issue and hidden tests.

The split between visible and hidden tests follows SWE-Gym: the hidden suite has every test
(``FAIL_TO_PASS``: fail with the bug, pass once fixed; ``PASS_TO_PASS``: pass either way), the
working copy ships the pass-to-pass tests plus one failing test per bug (the issue's reproduction),
so an agent can check its fix, but a fix that special-cases the reported call still fails.

Hidden tests are records (function, arguments) -> expected value, not test files: the grader sends
only the function and arguments into the sandbox and compares the returned plain data with the
expected value outside it (:func:`arena_envs.swe.runner.grade_calls`), so no code of the package
can see, forge or compare against an expected value.
"""

from __future__ import annotations

import ast
import copy
import functools
from dataclasses import dataclass

import numpy as np

from arena_envs.swe.catalogue import TEMPLATES, THEMES, Template

_PREFIXES = ("tidy", "brisk", "plain", "lumen", "acorn", "cobalt", "maple", "quill", "ember", "harbor", "pebble",
             "sable")
_SUFFIXES = ("kit", "utils", "lib", "tools", "box", "core")
_PHRASES = ("`{call}` returns `{got}`, but `{want}` is expected.",
            "Calling `{call}` gives `{got}` instead of `{want}`.",
            "I expected `{call}` to be `{want}`; it is `{got}`.")


@dataclass(frozen=True)
class InjectedBug:
    path: str
    function: str
    kind: str
    call: str  # the issue's reproduction, qualified by the module


@dataclass(frozen=True)
class HiddenTest:
    """One hidden test: ``module.function(*args, **kwargs)`` must return ``expected`` (plain data).

    ``expected`` stays in the trusted process; only ``module``, ``function``, ``args`` and ``kwargs``
    enter the sandbox."""

    test_id: str  # tests/test_<module>.py::test_<function>_<k>, as in FAIL_TO_PASS / PASS_TO_PASS
    module: str  # dotted, e.g. maplekit.numbers
    function: str
    args: tuple
    kwargs: dict
    expected: object


@dataclass(frozen=True)
class Task:
    """One generated task. ``files`` is the buggy working copy (visible tests included)."""

    seed: int
    package: str
    files: dict[str, str]
    fixed: dict[str, str]  # the gold working copy without tests/
    hidden_tests: tuple[HiddenTest, ...]
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    issue: str
    bugs: tuple[InjectedBug, ...]


def _run_call(source: str, call: str) -> tuple[bool, object]:
    namespace: dict = {}
    exec(compile(source, "<template>", "exec"), namespace)  # noqa: S102 - the catalogue's own code
    try:
        return True, eval(call, namespace)  # noqa: S307 - calls written in the catalogue
    except Exception as e:  # noqa: BLE001 - a buggy version may raise; that is its symptom
        return False, f"{type(e).__name__}: {e}"


@functools.lru_cache(maxsize=None)
def outcomes(template_index: int, bug_index: int | None) -> tuple[tuple[bool, object], ...]:
    """Result of each of the template's calls, on the correct source or with bug ``bug_index``."""
    template = TEMPLATES[template_index]
    return tuple(_run_call(bug_source(template, bug_index), call) for call in template.calls)


def bug_source(template: Template, bug_index: int | None) -> str:
    if bug_index is None:
        return template.source
    bug = template.bugs[bug_index]
    if template.source.count(bug.old) != 1:
        raise ValueError(f"bug {bug_index} of {template.name} does not match its source exactly once")
    return template.source.replace(bug.old, bug.new)


def failing_calls(template_index: int, bug_index: int) -> list[int]:
    """Indices of the calls whose result the bug changes."""
    good, bad = outcomes(template_index, None), outcomes(template_index, bug_index)
    return [i for i, (g, b) in enumerate(zip(good, bad)) if g != b]


def _arguments(call: str) -> tuple[tuple, dict]:
    """Positional and keyword arguments of a catalogue call such as ``slugify('a b', sep='_')``."""
    node = ast.parse(call, mode="eval").body
    if not isinstance(node, ast.Call) or any(k.arg is None for k in node.keywords):
        raise ValueError(f"catalogue call {call!r} is not a call with literal arguments")
    return (tuple(ast.literal_eval(a) for a in node.args),
            {k.arg: ast.literal_eval(k.value) for k in node.keywords})


def _module_text(package: str, theme: str, sources: list[str], doc: str | None = None) -> str:
    header = doc or f'"""{THEMES[theme].capitalize()} helpers of the {package} package."""'
    return header + "\n\n\n" + "\n\n".join(sources)


def _test_text(package: str, module: str, tests: list[tuple[str, str, str]], names: list[str]) -> str:
    imports = f"from {package}.{module} import {', '.join(sorted(names))}"
    lines = [f'"""Tests of {package}.{module}."""', "", imports, ""]
    for test_name, call, want in tests:
        lines += ["", f"def {test_name}():", f"    result = {call}",
                  f"    assert result == {want}, f\"got {{result!r}}\"", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def generate_task(seed: int, num_modules: int = 3, functions_per_module: int = 5, num_bugs: int = 1,
                  num_distractors: int = 1) -> Task:
    """The task of ``seed``; the same arguments always give the same task."""
    themes = list(THEMES)
    if not 1 <= num_modules <= len(themes):
        raise ValueError(f"num_modules must be in 1..{len(themes)}, got {num_modules}")
    per_theme = {t: [i for i, tp in enumerate(TEMPLATES) if tp.theme == t] for t in themes}
    if not 1 <= functions_per_module <= min(len(v) for v in per_theme.values()):
        raise ValueError(f"functions_per_module must be in 1..{min(len(v) for v in per_theme.values())}")
    if not 1 <= num_bugs <= num_modules * functions_per_module:
        raise ValueError(f"num_bugs must be in 1..{num_modules * functions_per_module}, got {num_bugs}")
    if not 0 <= num_distractors <= num_modules:
        raise ValueError(f"num_distractors must be in 0..{num_modules}, got {num_distractors}")
    rng = np.random.default_rng(int(seed))
    package = f"{_PREFIXES[rng.integers(len(_PREFIXES))]}{_SUFFIXES[rng.integers(len(_SUFFIXES))]}"
    chosen_themes = sorted(rng.choice(themes, size=num_modules, replace=False).tolist(), key=themes.index)
    layout = {t: sorted(rng.choice(per_theme[t], size=functions_per_module, replace=False).tolist())
              for t in chosen_themes}
    slots = [(t, i) for t in chosen_themes for i in layout[t]]
    buggy = {slots[k][1]: int(rng.integers(len(TEMPLATES[slots[k][1]].bugs)))
             for k in sorted(rng.choice(len(slots), size=num_bugs, replace=False).tolist())}

    files = {"README.md": f"# {package}\n\nSmall utility functions: {', '.join(THEMES[t] for t in chosen_themes)}.\n"
                          "Run the tests with `run_tests`.\n",
             f"{package}/__init__.py": f'"""{package}: small utility functions."""\n'}
    fixed, hidden, f2p, p2p, bugs, symptoms = {}, [], [], [], [], []
    for theme in chosen_themes:
        module = THEMES[theme]
        path, test_path = f"{package}/{module}.py", f"tests/test_{module}.py"
        good_sources, bad_sources, visible_tests, names = [], [], [], []
        for index in layout[theme]:
            template = TEMPLATES[index]
            names.append(template.name)
            good_sources.append(template.source)
            bug_index = buggy.get(index)
            bad_sources.append(bug_source(template, bug_index))
            failing = set(failing_calls(index, bug_index)) if bug_index is not None else set()
            for k, (call, (ok, want)) in enumerate(zip(template.calls, outcomes(index, None))):
                if not ok:
                    raise ValueError(f"catalogue call {call!r} raises on the correct source: {want}")
                test = (f"test_{template.name}_{k + 1}", call, repr(want))
                test_id = f"{test_path}::{test[0]}"
                hidden.append(HiddenTest(test_id, f"{package}.{module}", template.name, *_arguments(call),
                                         copy.deepcopy(want)))  # not the cached object of ``outcomes``
                (f2p if k in failing else p2p).append(test_id)
                if k not in failing or k == min(failing):
                    visible_tests.append(test)
            if bug_index is not None:
                k = min(failing)
                got = outcomes(index, bug_index)[k]
                shown = f"raises {got[1]}" if not got[0] else repr(got[1])
                qualified = f"{package}.{module}.{template.calls[k]}"
                phrase = _PHRASES[int(rng.integers(len(_PHRASES)))]
                symptoms.append(phrase.format(call=qualified, got=shown, want=repr(outcomes(index, None)[k][1])))
                bugs.append(InjectedBug(path, template.name, template.bugs[bug_index].kind, qualified))
        files[path] = _module_text(package, theme, bad_sources)
        fixed[path] = _module_text(package, theme, good_sources)
        files[test_path] = _test_text(package, module, visible_tests, names)
    for theme in chosen_themes[:num_distractors]:
        module = THEMES[theme]
        doc = f'"""Deprecated copy of {package}.{module}, kept for old imports; not used or tested."""'
        files[f"{package}/legacy_{module}.py"] = _module_text(package, theme, [
            bug_source(TEMPLATES[i], buggy.get(i)) for i in layout[theme]], doc)
    fixed.update({p: t for p, t in files.items() if p not in fixed and not p.startswith("tests/")})
    title = "Wrong results from " + ", ".join(f"`{b.function}`" for b in bugs)
    issue = f"{title}\n\n" + "\n".join(f"- {s}" for s in symptoms)
    return Task(int(seed), package, files, dict(sorted(fixed.items())), tuple(hidden), tuple(f2p), tuple(p2p),
                issue, tuple(bugs))
