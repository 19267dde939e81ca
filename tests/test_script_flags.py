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
import sys
from pathlib import Path

import pytest
import tyro
from conftest import ALGOS, load_script

RECORD = Path(__file__).resolve().parent / "data" / "script_flags.json"
SCRIPTS = sorted(p.stem for p in ALGOS.glob("*.py") if p.stem != "sft")
#: A help entry's first line: the box border, then its option strings, each with its metavar, separated by ", ".
ENTRY = re.compile(r"^[^\w-]*(-{1,2}[A-Za-z].*)$")


def help_options(name: str) -> list[str]:
    """Every option string in ``algos/<name>.py --help``, sorted."""
    module = load_script(name)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", "400")  # one line per entry head, whatever the terminal
        with contextlib.suppress(SystemExit):
            tyro.cli(module.Args, args=["--help"])
    found = set()
    for line in out.getvalue().splitlines():
        if match := ENTRY.match(line.rstrip(" │|")):
            found.update(part.split()[0] for part in match.group(1).split(", ") if part.startswith("-"))
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
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(json.dumps({name: help_options(name) for name in SCRIPTS}, indent=1))
