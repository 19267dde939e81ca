"""``ARL/TIRMath-v0``: tool-integrated math reasoning with a sandboxed Python interpreter.

Protocol (ARLArena ``recipe/math_agent`` / SimpleTIR):

* first observation = the problem text;
* each action is one model turn. If it contains a fenced ```python block, the turn is
  cut after the **first** block (ARLArena stops generation there), the code runs in the
  sandbox and the observation is ``"\\nCode execution result: {text}\\n"`` where ``text``
  is the stdout (first ``max_output_chars`` characters), or the last stderr line when
  stderr is non-empty, or ``interpreter timeout`` / a memory, output-limit, crash
  (``Killed by signal SIGSEGV (Segmentation fault)``) or exit-code note;
* the episode ends when ``\\boxed{`` appears in the (cut) turn or in the printed output
  (the last ``\\boxed{}`` is scored: reward 1 if math-verify-equivalent to the answer,
  else 0), on a turn with neither code nor answer (``action_is_valid=False``, reward 0;
  this includes ``""``), or after ``max_turns`` turns (``truncated=True``, reward 0).

Splits: ``hf:`` sources use the dataset's own splits (``split`` is passed to ``load_dataset``);
a path containing ``{split}`` is formatted with it (``gsm8k/{split}.jsonl``: one file per
split); the synthetic generator, a single file and a problem list are split by a hash of the
question (:mod:`arena_envs.splits`: ``train`` / ``test`` / ``all``), so train and test never
share a problem.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from arena_envs.base import TextEnv, int_option
from arena_envs.splits import check_split, draw_in_split, select_split
from arena_envs.tirmath.answer import extract_boxed, extract_code, first_boxed_end, is_correct
from arena_envs.tirmath.data import FAMILIES, Problem, generate_problem, load_problems
from arena_envs.tirmath.sandbox import ExecResult, Sandbox, SandboxError, clean_text, shared_sandbox, signal_text

_ACTION_OPEN = re.compile(r"<\s*action\s*>", re.IGNORECASE)
_ACTION_CLOSE = re.compile(r"</\s*action\s*>", re.IGNORECASE)
RESULT_TEMPLATE = "\nCode execution result: {}\n"
#: longest status text of a result (timeout, crash, sandbox error) or note after one (memory, output limit)
NOTE_CHARS = 64
NO_TOOL_OBS = "No ```python code block and no \\boxed{} answer in this turn; the episode is over."

INSTRUCTIONS = (
    "Solve the math problem step by step. You may run Python code written in a fenced block "
    "(```python ... ```); sympy and numpy are available. When you answer with think and action tags, the "
    "code block goes inside the <action> tags, as does the final answer: only "
    "the action's text is run and graded, and code in <think> is never run. Only the first code block of a "
    "turn is run and the turn ends with it (text after it is not read); its printed output is returned to "
    "you after 'Code execution result: ' (use print). Each run is limited in time and memory and has no "
    "network or file access outside its own folder. A turn with neither code nor a final answer ends the "
    "episode. When you know the answer, finish with \\boxed{your final answer}; the last \\boxed{} you "
    "write is graded."
)


def _question(problem: Problem) -> str:
    return problem.question


def _problem_option(value: Any) -> Problem:
    """The ``problem`` reset option: a ``Problem`` or a dict with a non-empty ``question`` and an ``answer``."""
    if isinstance(value, Problem):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"reset option 'problem' must be a Problem or a dict with 'question' and 'answer', "
                        f"got {type(value).__name__}")
    for key in ("question", "answer"):
        field = value.get(key)
        if field is None:
            raise ValueError(f"reset option 'problem' lacks {key!r} (a dict with 'question' and 'answer')")
        if isinstance(field, bool) or not isinstance(field, (str, int, float)):
            raise TypeError(f"reset option 'problem' needs {key!r} as a str, got {type(field).__name__}")
        if not str(field).strip():
            raise ValueError(f"reset option 'problem' has an empty {key!r}")
    return Problem(str(value["question"]), str(value["answer"]), "options")


class TIRMathEnv(TextEnv):
    """Multi-turn math with a Python tool; see the module docstring for the protocol.

    Args:
        data: ``"synthetic"`` (seeded sympy-checked generator, no download), a path to a
            GSM8K/MATH JSONL or ARLArena parquet file, ``"hf:<name>[:<config>]"``, or a
            sequence of ``Problem``.
        split: ``"train"`` / ``"test"`` (``"all"`` for hashed splits; any split name of an ``hf:`` source).
        families: restrict the synthetic generator to these problem families.
        max_turns: turns per episode (ARLArena: 5).
        max_output_chars: characters of stdout shown to the policy (ARLArena: 512).
        timeout, memory_mb: per-run sandbox limits (ARLArena recipe: 3 s, 2 GB).
        sandbox: a ``Sandbox``; default = one shared server per process.
    """

    reset_options = ("problem", "index")

    def __init__(self, data: str | Path | Sequence[Problem] = "synthetic", *, split: str = "train",
                 families: Sequence[str] | None = None, max_turns: int = 5, max_output_chars: int = 512,
                 timeout: float = 3.0, memory_mb: int = 2048, verify_timeout: float = 1.0,
                 sandbox: Sandbox | None = None, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        self.split = split
        if isinstance(data, (str, Path)) and str(data).startswith("hf:"):
            self._problems: list[Problem] | None = load_problems(data, split=split)
        elif isinstance(data, (str, Path)) and "{split}" in str(data):
            self._problems = load_problems(str(data).format(split=split))
        else:
            check_split(split)
            if isinstance(data, (str, Path)) and str(data) == "synthetic":
                self._problems = None
            else:
                problems = load_problems(data) if isinstance(data, (str, Path)) else list(data)
                if not problems:
                    raise ValueError("empty problem list")
                self._problems = select_split(problems, split, _question)
                if not self._problems:
                    raise ValueError(f"no problem of {len(problems)} falls in split {split!r}")
        unknown = set(families or ()) - set(FAMILIES)
        if unknown:
            raise ValueError(f"unknown synthetic families {sorted(unknown)}; choose from {sorted(FAMILIES)}")
        self._families = tuple(families) if families else None
        if max_turns < 1 or max_output_chars < 0:
            raise ValueError("max_turns must be >= 1 and max_output_chars >= 0")
        self.max_turns, self.max_output_chars = int(max_turns), int(max_output_chars)
        self.max_observation_chars = max(len(NO_TOOL_OBS), len(RESULT_TEMPLATE.format("")) + self.max_output_chars
                                         + len("...") + NOTE_CHARS)
        self.timeout, self.memory_mb, self.verify_timeout = float(timeout), int(memory_mb), float(verify_timeout)
        self._sandbox = sandbox
        self._problem: Problem | None = None
        self._turn = 0
        self._expert_value: str | None = None

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = shared_sandbox()
        return self._sandbox

    @property
    def problem(self) -> Problem | None:
        return self._problem

    # --- TextEnv hooks ----------------------------------------------------------------
    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        index = int_option(options, "index")
        if options.get("problem") is not None:
            self._problem = _problem_option(options["problem"])
        elif self._problems is None:
            self._problem = draw_in_split(self.np_random, self.split,
                                          lambda rng: generate_problem(rng, self._families), _question)
        else:
            idx = int(self.np_random.integers(len(self._problems))) if index is None else index % len(self._problems)
            self._problem = self._problems[idx]
        self._turn, self._expert_value = 0, None
        return self._problem.question, {"turn": 0, "source": self._problem.source}

    def _step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._turn += 1
        code, cut = extract_code(action)
        text, obs, status = action[:cut], "", None
        if code is not None:
            result = self.sandbox.run(code, timeout=self.timeout, memory_mb=self.memory_mb)
            if result.status == "sandbox_error":  # no outcome of the program: an env error (docs/sandbox.md)
                raise SandboxError(result.stderr)
            status, obs = result.status, self.format_result(result)
            if self._problem.expert_code is not None and code == self._problem.expert_code and result.status == "ok":
                self._expert_value = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else None
            text += "\n" + (result.stdout if result.status == "ok" else "")
        answer = extract_boxed(text) if "\\boxed" in text else None
        info: dict[str, Any] = {"turn": self._turn, "exec_status": status, "answer": answer}
        if code is None and answer is None:
            return NO_TOOL_OBS, 0.0, True, False, {**info, "action_is_valid": False}
        if answer is not None:
            won = is_correct(answer, self._problem.answer, self.sandbox, self.verify_timeout)
            return obs, float(won), True, False, {**info, "won": won}
        truncated = self._turn >= self.max_turns
        return obs, 0.0, False, truncated, info

    @staticmethod
    def turn_end(text: str) -> int | None:
        """Where a turn is complete (SimpleTIR: generation stops there); ``None`` while it is not. Raw text: the end
        of the first ```python block or of the first closed ``\\boxed{}``, whichever comes first. Text in the
        wrappers' tagged format: the end of the first ``</action>`` after a complete block or answer (the wrappers
        read nothing past it). The rollout cuts the generated tokens there, so text nobody reads is neither
        generated on into a made-up next turn nor trained on."""
        ends = []
        code, cut = extract_code(text)
        if code is not None:
            ends.append(cut)
        boxed = first_boxed_end(text)
        if boxed is not None:
            ends.append(boxed)
        if not ends:
            return None
        end = min(ends)
        if _ACTION_OPEN.search(text[:end]) is None:
            return end
        close = _ACTION_CLOSE.search(text, end)
        return close.end() if close else None

    def format_result(self, result: ExecResult) -> str:
        """The ARLArena observation for one run: program text without control or format characters (except
        newline and tab); stdout and the error line truncated to ``max_output_chars``, so an observation never
        exceeds ``max_observation_chars``."""
        if result.status == "timeout":
            text = "interpreter timeout"
        elif result.status == "memory":
            line = self._truncate(clean_text(result.last_error_line))
            text = f"{line} (memory limit of {self.memory_mb} MB exceeded)"
        elif result.status == "output_limit":
            text = self._truncate(clean_text(result.stdout)) + " [output limit exceeded; execution stopped]"
        elif result.status == "crashed":
            text = self._with_note(result.stdout, f"Killed by signal {signal_text(result.signal)}")
        elif result.status == "sandbox_error":
            text = "sandbox error: the code could not be run"
        elif result.stderr.strip():
            text = self._truncate(clean_text(result.last_error_line))
        elif result.status == "error":  # a bare exit code (``os._exit(7)``): say so, or the model reads nothing
            text = self._with_note(result.stdout, f"Exited with code {result.exit_code}")
        else:
            text = self._truncate(clean_text(result.stdout).rstrip("\n"))
        return RESULT_TEMPLATE.format(text)

    def _with_note(self, stdout: str, note: str) -> str:
        """What the program printed before it ended (cut like stdout), then how it ended: a crash or a bare exit
        code must read as one to the model, as a traceback does."""
        printed = self._truncate(clean_text(stdout).rstrip("\n"))
        return f"{printed}\n{note}" if printed else note

    def _truncate(self, s: str) -> str:
        return s if len(s) <= self.max_output_chars else s[: self.max_output_chars] + "..."

    def task_description(self) -> str:
        return self._problem.question if self._problem is not None else ""

    def admissible_actions(self) -> list[str] | None:
        return None

    def prompt_instructions(self) -> str:
        return INSTRUCTIONS

    def expert_action(self) -> str:
        """Synthetic problems: sympy code first, then ``\\boxed{}`` with the printed value.

        Loaded datasets have no reference program; the expert answers the gold directly.
        """
        p = self._problem
        if p is None:
            return ""
        if p.expert_code is not None and self._expert_value is None:
            return f"I will compute this exactly with sympy.\n```python\n{p.expert_code}\n```"
        value = self._expert_value if self._expert_value is not None else p.answer
        return f"The computation gives {value}.\nThe final answer is \\boxed{{{value}}}."
