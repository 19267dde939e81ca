"""Every algos/*.py copy equals grpo.py outside its ``# ALGO LOGIC`` blocks, and every script imports the
shared machinery (``arena_train``), never another script.

A fix to the shared loop must reach every copy: this test fails, with a diff, when one is missed.
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path

import pytest
from conftest import ALGOS, START, load_script, method_scripts, split_blocks

from arena_train.cli import flat_args

ROOT = ALGOS.parent
METHODS = ["gspo", "sapo", "cispo", "gigpo", "empg", "dapo", "sampo", "rloo", "ppo"]


def scripts_with_blocks() -> list[str]:
    """Every algos/*.py with ALGO LOGIC blocks except grpo.py, so that new copies are checked as well."""
    return [name for name in method_scripts() if name != "grpo"]


GRPO_OUTSIDE, GRPO_BLOCKS = split_blocks((ALGOS / "grpo.py").read_text())


def test_grpo_blocks_well_formed_and_all_methods_present():
    assert len(GRPO_BLOCKS) >= 7
    assert set(METHODS) <= set(scripts_with_blocks())


@pytest.mark.parametrize("name", sorted(set(METHODS) | set(scripts_with_blocks())))
def test_copy_equals_grpo_outside_blocks(name):
    text = (ALGOS / f"{name}.py").read_text()
    outside, blocks = split_blocks(text)
    assert len(blocks) == len(GRPO_BLOCKS), f"{name}.py has {len(blocks)} ALGO LOGIC blocks, grpo.py {len(GRPO_BLOCKS)}"
    for k, (mine, reference) in enumerate(zip(outside, GRPO_OUTSIDE)):
        if mine != reference:
            where = "before block 1" if k == 0 else f"after block {k}"
            diff = "".join(difflib.unified_diff(reference.splitlines(True), mine.splitlines(True), "grpo.py",
                                                f"{name}.py", n=2))
            pytest.fail(f"{name}.py differs from grpo.py outside the ALGO LOGIC blocks ({where}):\n{diff[:4000]}")


@pytest.mark.parametrize("name", ["grpo", *sorted(set(METHODS) | set(scripts_with_blocks()))])
def test_block_one_is_the_module_docstring(name):
    text = (ALGOS / f"{name}.py").read_text()
    assert START.match(text.splitlines()[0]), "the first line must open the docstring block"
    outside, blocks = split_blocks(text)
    docstring = ast.get_docstring(ast.parse(text), clean=False)
    assert docstring and docstring in blocks[0]
    assert f"algos/{name}.py" in docstring  # its own usage line, not grpo's


def test_split_blocks_rejects_malformed_markers():
    for bad in ["# ALGO LOGIC: a\n# ALGO LOGIC: b\n# END ALGO LOGIC\n", "# END ALGO LOGIC\n", "# ALGO LOGIC: a\nx\n"]:
        with pytest.raises(AssertionError):
            split_blocks(bad)


@pytest.mark.parametrize("name", ["grpo", *sorted(set(METHODS) | set(scripts_with_blocks()))])
def test_script_imports_as_a_module_with_its_own_args(name):
    module = load_script(name)
    args = module.Args()
    assert args.exp_name == name and args.profile == "cpu-tiny"
    assert set(module.GPU_PROFILE) <= set(flat_args(args)), "GPU_PROFILE names a field Args does not have"


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports (absolute imports, anywhere in the file)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


PROJECT_FILES = sorted(p for folder in ("algos", "eval", "benchmarks", "arena_train", "tests")
                       for p in (ROOT / folder).rglob("*.py"))


def dotted(node: ast.AST) -> str:
    """'a.b.c' for an attribute chain on a name, '' otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := dotted(node.value)):
        return f"{base}.{node.attr}"
    return ""


def attribute_uses(path: Path) -> set[str]:
    """Dotted attribute accesses (``sys.path.insert``, ``importlib.util.x``) in ``path``'s code, not its text."""
    return {d for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Attribute)
            and (d := dotted(node))}


@pytest.mark.parametrize("path", PROJECT_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_script_imports_and_no_path_hacks(path):
    """Scripts are run or forked, never imported: no file imports one, edits sys.path or loads one by path
    (except the test helper ``conftest.load_script``)."""
    scripts = {p.stem for p in ALGOS.glob("*.py")}
    assert not imported_modules(path) & scripts
    uses = attribute_uses(path)
    assert not any(u == "sys.path" or u.startswith("sys.path.") for u in uses)
    if path.name != "conftest.py":
        assert not any(u.endswith("spec_from_file_location") for u in uses)


@pytest.mark.parametrize("name", [*sorted({"grpo", *METHODS, *scripts_with_blocks()}), "sft"])
def test_scripts_import_only_the_shared_module_and_the_envs(name):
    project = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()} | {"algos"}
    assert imported_modules(ALGOS / f"{name}.py") & project <= {"arena_train", "wrappers", "arena_envs"}
