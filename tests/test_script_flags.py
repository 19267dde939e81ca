"""Every script keeps every command-line flag it had: the option strings its ``--help`` lists, aliases and
``--no-`` forms included, equal a recorded set (tests/data/script_flags.json). Grouping the flags (run, engine,
evaluation, collapse alarm) must not rename one: sweeps, docs and users' shell histories name them.

Regenerate the record only for a deliberate change of the command line:
``python tests/test_script_flags.py > tests/data/script_flags.json``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

import pytest
import tyro
from conftest import ALGOS, load_script

RECORD = Path(__file__).resolve().parent / "data" / "script_flags.json"
SCRIPTS = sorted(p.stem for p in ALGOS.glob("*.py") if p.stem != "sft")
#: A help entry's first line: its option strings, each with its metavar, separated by ", " (indented less than
#: the description lines under it).
ENTRY = re.compile(r"^(\W{0,2})(-{1,2}[A-Za-z].*)$")
#: Help width: wide enough for one entry head per line, narrow enough for tyro to stack the groups' boxes in one
#: column (it puts them side by side from 130 columns on).
WIDTH = "129"


def help_options(name: str) -> list[str]:
    """Every option string in ``algos/<name>.py --help``, sorted."""
    module = load_script(name)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", WIDTH)
        with contextlib.suppress(SystemExit):
            tyro.cli(module.Args, args=["--help"])
    found = set()
    for line in out.getvalue().splitlines():
        if match := ENTRY.match(line):
            found.update(part.split()[0] for part in match.group(2).split(", ") if part.startswith("-"))
    return sorted(found)


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_lists_the_recorded_flags(name):
    record = json.loads(RECORD.read_text())
    got = help_options(name)
    missing, new = sorted(set(record[name]) - set(got)), sorted(set(got) - set(record[name]))
    assert not missing and not new, f"{name}.py: flags lost {missing}, flags added {new}"


def test_help_parser_finds_aliases_and_negations():
    options = help_options("grpo")
    assert {"--loss-agg", "--loss-agg-mode", "--seq-mask", "--no-seq-mask", "-h", "--help"} <= set(options)
    assert len(options) > 90


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(json.dumps({name: help_options(name) for name in SCRIPTS}, indent=1))
