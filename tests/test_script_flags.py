"""Every script keeps every command-line flag it had: the option strings its ``--help`` lists, aliases and
``--no-`` forms included, equal a recorded set (tests/data/script_flags.json). Grouping the flags (run, engine,
evaluation, collapse alarm) must not rename one: sweeps, docs and users' shell histories name them.

A script without a record (a fork: ``cp algos/grpo.py algos/mymethod.py``) is checked with no edit here: its flags
are grpo.py's shared flags (those of the ``Args`` fields outside the ALGO LOGIC blocks) plus its own (those of the
fields inside its blocks), and nothing else.

Regenerate the record only for a deliberate change of the command line:
``python tests/test_script_flags.py > tests/data/script_flags.json``.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
from pathlib import Path

import pytest
import tyro
from conftest import ALGOS, END, START, load_script

RECORD = Path(__file__).resolve().parent / "data" / "script_flags.json"
SCRIPTS = sorted(p.stem for p in ALGOS.glob("*.py") if p.stem != "sft")
RECORDED = sorted(json.loads(RECORD.read_text()))
#: A help entry's first line: its option strings, each with its metavar, separated by ", " (indented less than
#: the description lines under it).
ENTRY = re.compile(r"^(\W{0,2})(-{1,2}[A-Za-z].*)$")
#: Help width: wide enough for one entry head per line, narrow enough for tyro to stack the groups' boxes in one
#: column (it puts them side by side from 130 columns on).
WIDTH = "129"


def help_entries(name: str) -> list[set[str]]:
    """The option strings of each entry of ``algos/<name>.py --help`` (one entry per field: its name, aliases and
    ``--no-`` forms)."""
    module = load_script(name)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", WIDTH)
        with contextlib.suppress(SystemExit):
            tyro.cli(module.Args, args=["--help"])
    return [{part.split()[0] for part in match.group(2).split(", ") if part.startswith("-")}
            for line in out.getvalue().splitlines() if (match := ENTRY.match(line))]


def help_options(name: str) -> list[str]:
    """Every option string in ``algos/<name>.py --help``, sorted."""
    return sorted(set().union(*help_entries(name)))


def own_fields(name: str) -> set[str]:
    """The ``Args`` fields that ``algos/<name>.py`` declares inside its ALGO LOGIC blocks."""
    text = (ALGOS / f"{name}.py").read_text()
    inside, lines = False, set()
    for number, line in enumerate(text.splitlines(), start=1):
        inside = bool(START.match(line)) or (inside and not END.match(line))
        if inside:
            lines.add(number)
    args = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "Args")
    fields = [n for n in args.body if isinstance(n, ast.AnnAssign)]
    # a shared field that a block declares again (a method default, PPO's num_iterations) stays a shared flag
    return {n.target.id for n in fields if n.lineno in lines} - {n.target.id for n in fields if n.lineno not in lines}


def split_options(name: str) -> tuple[set[str], set[str]]:
    """(shared, own): the option strings of the fields outside and inside the script's ALGO LOGIC blocks."""
    own_names = own_fields(name)
    shared, own = set(), set()
    for entry in help_entries(name):
        names = {option.lstrip("-").removeprefix("no-").replace("-", "_") for option in entry}
        (own if names & own_names else shared).update(entry)
    return shared, own


@pytest.mark.parametrize("name", [s for s in SCRIPTS if s in RECORDED])
def test_help_lists_the_recorded_flags(name):
    record = json.loads(RECORD.read_text())
    got = help_options(name)
    missing, new = sorted(set(record[name]) - set(got)), sorted(set(got) - set(record[name]))
    assert not missing and not new, f"{name}.py: flags lost {missing}, flags added {new}"


@pytest.mark.parametrize("name", SCRIPTS)
def test_flags_are_grpos_shared_flags_plus_the_scripts_own(name):
    """Every script, recorded or a fork: grpo.py's shared flags, all of them, and its own fields' flags."""
    shared, own = split_options(name)
    grpo_shared, _ = split_options("grpo")
    lost, added = sorted(grpo_shared - shared), sorted(shared - grpo_shared)
    assert not lost and not added, (f"{name}.py: outside its ALGO LOGIC blocks it lost flags {lost} and added "
                                    f"{added}; method flags belong in its Args block")
    assert set(help_options(name)) == shared | own


def test_own_flags_are_the_block_fields():
    shared, own = split_options("grpo")
    assert {"--clip-ratio-low", "--loss-agg", "--loss-agg-mode", "--seq-mask", "--no-use-seq-mask"} <= own
    assert {"--num-groups", "--learning-rate", "--micro-batch-size", "--seed"} <= shared and not shared & own


def test_help_parser_finds_aliases_and_negations():
    options = help_options("grpo")
    assert {"--loss-agg", "--loss-agg-mode", "--seq-mask", "--no-seq-mask", "-h", "--help"} <= set(options)
    assert len(options) > 90


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(json.dumps({name: help_options(name) for name in SCRIPTS}, indent=1))
