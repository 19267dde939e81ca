"""Forking a script is the README's recipe and nothing more: what docs/algorithms.md tells a fork a ``Row`` carries is
true field by field, and a copy of grpo.py under a new name is adopted by the fork-related tests with no edit to
them (blocks rule, flags, a 2-iteration smoke run and the reference-gradient check are collected for it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from conftest import ALGOS, split_blocks

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


def recipe() -> list[str]:
    """The commands of the README's "Forking a script" code block, comments dropped."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Forking a script"):]
    block = section[section.index("```bash\n") + len("```bash\n"):section.index("```\n", section.index("```bash"))]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_a_copy_of_grpo_made_by_the_readme_recipe_is_adopted_by_the_tests(tmp_path):
    """The README's recipe in a copy of the repository's scripts and tests: its fast checks pass with the fork in
    place (blocks rule, flags), and its slow ones are collected for the fork with no test edited."""
    repo = tmp_path / "repo"
    skip = shutil.ignore_patterns("__pycache__", ".pytest_cache")
    shutil.copytree(ROOT / "algos", repo / "algos", ignore=skip)
    shutil.copytree(ROOT / "tests", repo / "tests", ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", repo)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="")
    commands = recipe()
    assert commands[0] == "cp algos/grpo.py algos/mymethod.py" and sum("pytest" in c for c in commands) == 2
    collected = ""
    for command in commands:
        if command.startswith("python -m pytest"):
            command = command.replace("python", f"{sys.executable}", 1) + " -p no:cacheprovider"
            if " -k " in command:  # the slow checks: collected, not run
                command += " --collect-only"
        proc = subprocess.run(command, shell=True, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
        collected = proc.stdout
    assert "algos/mymethod.py" in (repo / "algos" / "mymethod.py").read_text()
    for test in ("test_algos_smoke.py::test_script_runs_two_iterations[mymethod]",
                 "test_reference_update.py::test_a_fork_matches_its_familys_reference[mymethod]"):
        assert test in collected, collected[-2000:]


def changed_blocks(name: str) -> list[int]:
    """The numbers of the blocks of ``algos/<name>.py`` whose text differs from grpo.py's."""
    _, grpo = split_blocks((ALGOS / "grpo.py").read_text())
    _, mine = split_blocks((ALGOS / f"{name}.py").read_text())
    return [k for k, (a, b) in enumerate(zip(grpo, mine), start=1) if a != b]


def test_the_block_numbers_in_the_docs_are_the_scripts():
    """docs/algorithms.md's block table has one row per block of grpo.py, and each method's "**Changes:** blocks
    ..." names exactly the blocks in which its script differs from grpo.py (adding a block renumbers them all)."""
    doc = DOC.read_text()
    _, blocks = split_blocks((ALGOS / "grpo.py").read_text())
    table = doc[doc.index("## Forking a script"):doc.index("What the blocks can rely on")]
    assert re.findall(r"^\| (\d+) \|", table, flags=re.M) == [str(k) for k in range(1, len(blocks) + 1)]
    sections = re.findall(r"^### [^\n]*\(`algos/(\w+)\.py`\)[^\n]*\n\n- \*\*Changes:\*\* blocks ([\d, ]+)", doc, re.M)
    assert {name for name, _ in sections} >= {"gspo", "sapo", "cispo", "gigpo", "empg", "dapo", "sampo", "rloo", "ppo"}
    for name, listed in sections:
        assert [int(k) for k in listed.split(",")] == changed_blocks(name), f"algos/{name}.py: {changed_blocks(name)}"
