"""Forking a script is the README's recipe and nothing more: what docs/algorithms.md tells a fork a ``Row`` carries is
true field by field, and a copy of grpo.py under a new name is adopted by the fork-related tests with no edit to
them (blocks rule, flags, a 2-iteration smoke run and the reference-gradient check are collected for it)."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from arena_train.rows import Row

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "algorithms.md"
ROW_FIELDS = {f.name for f in fields(Row)}


def documented_row_fields(doc: str) -> list[str]:
    """The names in backticks of the fork section's "a `Row` carries ..." (to its first ";" or full stop; the
    remarks in parentheses left out)."""
    text = " ".join(doc.split())
    start = text.index("What the blocks can rely on: a `Row` carries ") + len("What the blocks can rely on: a `Row` ")
    sentence = re.split(r";|\. ", re.sub(r"\([^)]*\)", "", text[start:]), maxsplit=1)[0]
    return [name.strip() for quoted in re.findall(r"`([^`]+)`", sentence) for name in quoted.split(",")]


def test_the_fork_section_names_every_row_field_and_only_those():
    named = documented_row_fields(DOC.read_text())
    assert not set(named) - ROW_FIELDS, f"docs/algorithms.md names Row fields that do not exist: " \
                                        f"{sorted(set(named) - ROW_FIELDS)}"
    assert not ROW_FIELDS - set(named), f"docs/algorithms.md leaves out Row fields {sorted(ROW_FIELDS - set(named))}"


def test_every_row_dot_field_in_the_docs_exists():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        missing = {name for name in re.findall(r"\bRow\.(\w+)", path.read_text()) if name not in ROW_FIELDS}
        assert not missing, f"{path.name} names Row.{sorted(missing)}, not fields of arena_train.rows.Row"
