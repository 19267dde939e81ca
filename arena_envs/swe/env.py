"""``ARL/SWE-Mini-v0``: fix the injected bugs of a small generated Python package, SWE-Gym style.

Each reset generates a task (:mod:`arena_envs.swe.generator`) and a fresh in-memory working copy;
actions are commands of :mod:`arena_envs.swe.commands`. Tests run in the TIR-Math sandbox
(:mod:`arena_envs.swe.runner`). ``submit`` ends the episode with the hidden tests: reward 1 when
every FAIL_TO_PASS and PASS_TO_PASS test passes, else 0 (``dense_reward=True``: the passing fraction).
Hidden tests are graded outside the sandbox: the package's return values come back as plain data
and are compared here with expected values that never enter the sandbox.
"""

from __future__ import annotations

import difflib
from typing import Any

from arena_envs.base import CHARSET, TextEnv, int_option
from arena_envs.swe import commands
from arena_envs.swe.generator import Task, generate_task
from arena_envs.swe.runner import MESSAGE_CHARS, grade_calls, run_tests

#: Task seeds of each split (disjoint ranges; a reset seed picks a task seed inside its split's range).
SPLITS = {"train": (0, 1_000_000_000), "test": (1_000_000_000, 2_000_000_000)}
#: Failures (and collection errors) listed by run_tests.
MAX_FAILURES_SHOWN = 8
#: Characters of a test id or file path quoted by run_tests (the package can write its own report).
ID_CHARS = 200
#: Longest observation (characters): ``open``'s 40 lines of at most 400 characters fit, whatever path an action takes.
MAX_OBSERVATION_CHARS = 20_000
_INSTRUCTIONS = (
    "You are in a Python repository with a bug report. One command per action:\n"
    "  ls [dir] - list files\n"
    "  open <file> [line] - show 40 numbered lines (around line)\n"
    "  search <text> - find lines containing text\n"
    "  edit <file> <start>-<end> - replace lines start..end by the lines after this one, up to a line end_of_edit\n"
    "    (end = start - 1 inserts; no new lines deletes)\n"
    "  run_tests [pattern] - run the visible tests\n"
    "  submit - finish; hidden tests decide the reward")


def _printable(text: str) -> str:
    """Observation text inside the env's charset (edits may bring in any character)."""
    return "".join(ch if ch in CHARSET else "?" for ch in text)


def _more(shown: int, total: int) -> list[str]:
    return [f"... and {total - shown} more."] if total > shown else []


class SWEMiniEnv(TextEnv):
    """Repository-level bug fixing on generated packages.

    Args:
        num_modules: modules in the package (1-5), each with its test file.
        functions_per_module: documented functions per module.
        num_bugs: injected bugs (each in a different function).
        num_distractors: deprecated copies of modules (untested, so editing them fixes nothing).
        split: ``"train"`` or ``"test"``; their task seeds are disjoint.
        dense_reward: reward on submit = fraction of hidden tests passing instead of all-or-nothing.
        test_timeout: wall-clock limit of one test run (seconds).
    """

    max_observation_chars = MAX_OBSERVATION_CHARS
    reset_options = ("task_seed",)

    def __init__(self, num_modules: int = 3, functions_per_module: int = 5, num_bugs: int = 1,
                 num_distractors: int = 1, split: str = "train", dense_reward: bool = False,
                 test_timeout: float = 10.0, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
        self.knobs = {"num_modules": int(num_modules), "functions_per_module": int(functions_per_module),
                      "num_bugs": int(num_bugs), "num_distractors": int(num_distractors)}
        generate_task(0, **self.knobs)  # validates the knobs now rather than at the first reset
        self.split, self.dense_reward, self.test_timeout = split, bool(dense_reward), float(test_timeout)
        self.task: Task | None = None
        self.files: dict[str, str] = {}
        self._viewing: str | None = None
        self._tested = False
        self._done = False

    # --- episode ----------------------------------------------------------------------
    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        low, high = SPLITS[self.split]
        task_seed = int_option(options, "task_seed")
        if task_seed is None:
            task_seed = int(self.np_random.integers(low, high))
        elif not low <= task_seed < high:
            raise ValueError(f"reset option 'task_seed' {task_seed} is outside the {self.split} split [{low}, {high})")
        self.task = generate_task(int(task_seed), **self.knobs)
        self.files = dict(sorted(self.task.files.items()))
        self._viewing, self._tested, self._done = None, False, False
        obs = f"Repository {self.task.package}:\n{commands.ls(self.files, '')}"
        return obs, {"task_seed": int(task_seed)}

    def _step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        try:
            command = commands.parse(action)
            if command.name == "submit":
                return self._submit()
            obs = self._apply(command)
        except commands.CommandError as e:
            return _printable(str(e)), 0.0, False, False, {"action_is_valid": False}
        return _printable(obs), 0.0, False, False, {"action_is_valid": True}

    def _apply(self, command: commands.Command) -> str:
        if command.name == "ls":
            return commands.ls(self.files, command.args)
        if command.name == "open":
            self._viewing, obs = commands.open_file(self.files, command.args)
            return obs
        if command.name == "search":
            return commands.search(self.files, command.args)
        if command.name == "edit":
            self._viewing, obs = commands.edit(self.files, command)
            self._tested = False
            return obs
        self._tested = True
        return self._report(run_tests(self.files, command.args, self.test_timeout), command.args)

    def _report(self, run, pattern: str) -> str:
        """The run's summary: at most MAX_FAILURES_SHOWN collection errors and failures, ids cut at ID_CHARS and
        messages at MESSAGE_CHARS -- the report comes from the package's process, which can write any report."""
        if run.problem:
            return f"No test results: {run.problem}."
        failed = [(k, msg) for k, (ok, msg) in run.results.items() if not ok]
        errors = list(run.errors.items())
        lines = [f"{len(run.results)} test(s) ran{f' matching {pattern[:60]!r}' if pattern else ''}: "
                 f"{len(run.results) - len(failed)} passed, {len(failed)} failed."]
        lines += [f"ERROR collecting {p[:ID_CHARS]}: {m[:MESSAGE_CHARS]}" for p, m in errors[:MAX_FAILURES_SHOWN]]
        lines += _more(MAX_FAILURES_SHOWN, len(errors))
        lines += [f"FAILED {k[:ID_CHARS]} - {m[:MESSAGE_CHARS]}" for k, m in failed[:MAX_FAILURES_SHOWN]]
        lines += _more(MAX_FAILURES_SHOWN, len(failed))
        return "\n".join(" ".join(line.splitlines()) for line in lines)

    def _submit(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._done = True
        passed, total, problem = self.grade()
        won = passed == total
        reward = passed / total if self.dense_reward else float(won)
        verdict = "all hidden tests pass" if won else "some hidden tests fail"
        obs = f"Submitted: {passed}/{total} hidden tests pass ({verdict})." + (f" ({problem})" if problem else "")
        return obs, reward, True, False, {"won": won, "tests_passed": passed, "tests_total": total}

    def grade(self) -> tuple[int, int, str]:
        """(hidden tests passing, hidden tests, problem of the run) for the current working copy.

        Only the package files (no ``tests/``) and the hidden calls' inputs enter the sandbox; the
        expected values are compared here (:func:`arena_envs.swe.runner.grade_calls`)."""
        files = {p: t for p, t in self.files.items() if not p.startswith("tests/")}
        verdicts, problem = grade_calls(files, self.task.hidden_tests, self.test_timeout)
        wanted = self.task.fail_to_pass + self.task.pass_to_pass
        return sum(verdicts.get(t, False) for t in wanted), len(wanted), problem

    # --- TextEnv API --------------------------------------------------------------------
    def task_description(self) -> str:
        if self.task is None:
            return ""
        return f"Fix this issue in {self.task.package}, then submit.\n{self.task.issue}"

    def prompt_instructions(self) -> str:
        return _INSTRUCTIONS

    def expert_action(self) -> str:
        """Open the first file that differs from the fix, edit its first differing block, then test, submit."""
        if self.task is None or self._done:
            return "submit"
        for path in sorted(self.task.fixed):
            current = self.files.get(path, "").split("\n")
            target = self.task.fixed[path].split("\n")
            if current == target or path not in self.files:
                continue
            ops = difflib.SequenceMatcher(None, current, target, autojunk=False).get_opcodes()
            _tag, i1, i2, j1, j2 = next(op for op in ops if op[0] != "equal")
            if self._viewing != path:
                return f"open {path} {min(i1 + 1, len(current))}"
            return "\n".join([f"edit {path} {i1 + 1}-{i2}", *target[j1:j2], commands.END_OF_EDIT])
        return "submit" if self._tested else "run_tests"
