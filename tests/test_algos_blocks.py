"""Every algos/*.py copy equals grpo.py outside its ``# ALGO LOGIC`` blocks, and every script imports the
shared machinery (``arena_train``), never another script.

A fix to the shared loop must reach every copy: this test fails, with a diff, when one is missed.
"""

from __future__ import annotations

import ast
import difflib
import re
import textwrap
from pathlib import Path

import pytest
from conftest import ALGOS, START, load_script, method_scripts, split_blocks

import arena_train.batching
import arena_train.update
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


SCRIPTS = sorted({"grpo", *METHODS, *scripts_with_blocks()})


def nested_imports(tree: ast.AST) -> list[int]:
    """Lines of the import statements below module level (in a function, loop, ``if`` or ``with``)."""
    top = {id(node) for node in getattr(tree, "body", [])}
    return sorted(node.lineno for node in ast.walk(tree)
                  if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_import_sits_at_the_top_of_the_script(name):
    """A method's own imports go in its imports block at the top, never into a function or the loop: the text
    outside the blocks is grpo.py's, so an import a method needs has exactly one place."""
    lines = nested_imports(ast.parse((ALGOS / f"{name}.py").read_text()))
    assert not lines, f"{name}.py imports inside a function or the loop at lines {lines}: move them into its " \
                      "'# ALGO LOGIC: imports' block"


def test_nested_imports_are_found():
    """The check above sees an import in a function and in a loop, and none at the top."""
    tree = ast.parse("import os\ndef f():\n    import sys\nfor _ in ():\n    from math import pi\n")
    assert nested_imports(tree) == [3, 5]


def block_fields(text: str) -> set[str]:
    """The ``Args`` fields declared only inside ALGO LOGIC blocks (a method's own hyper-parameters). A shared field
    that a block declares again gets a method default there (PPO's ``num_iterations``); deleting that line leaves the
    shared field, so reading it outside the blocks is safe."""
    outside, blocks = split_blocks(text)
    shared = set(re.findall(r"^    (\w+): ", "".join(outside), flags=re.MULTILINE))
    return {node.target.id for block in blocks for node in ast.walk(ast.parse(textwrap.dedent(block)))
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)} - shared


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_skeleton_reads_no_field_of_a_method(name):
    """Outside its blocks a script reads only the shared fields of ``Args``: a fork may delete any field of its
    hyper-parameter block (a method that does not clip has no clip fields) and the loop still runs."""
    text = (ALGOS / f"{name}.py").read_text()
    outside, _ = split_blocks(text)
    read = set(re.findall(r"\bargs\.(\w+)", "".join(outside))) & block_fields(text)
    assert not read, f"the loop outside the blocks reads method fields {sorted(read)}"


@pytest.mark.parametrize("name", SCRIPTS)
def test_one_temperature_source(name):
    """The training temperature is read once, into ``sampling``: generation and every log-prob (scoring, the
    update, a method's own passes) take ``sampling.temperature``, so they cannot drift apart."""
    text = (ALGOS / f"{name}.py").read_text()
    assert text.count("args.temperature") == 1 and "temperature=args.temperature" in text
    calls = [node for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Call)
             and dotted(node.func) in ("sequence_logprobs", "score_rows")]
    assert calls
    for call in calls:
        positional = call.args[2:3] if dotted(call.func) == "sequence_logprobs" else []  # (model, batch, temp)
        given = [ast.unparse(a) for a in positional] + [ast.unparse(k.value) for k in call.keywords
                                                        if k.arg == "temperature"]
        assert given == ["sampling.temperature"], f"line {call.lineno}: {ast.unparse(call)[:120]}"


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_hidden_optimizer_hooks(name):
    """Every gradient step is visible in the loop: no script hooks the optimizer or a tensor (PPO clips its
    critic's gradient in the block before ``optimizer.step()``)."""
    hooks = {u for u in attribute_uses(ALGOS / f"{name}.py") if ".register_" in u and "hook" in u}
    assert not hooks, hooks


@pytest.mark.parametrize("name", SCRIPTS)
def test_names_do_not_collide(name):
    """``metrics`` is the micro-batch's dict and ``update`` the ``Update`` (its iteration's metrics come from
    ``update.iteration_metrics``); ``evaluation`` is not a script's name (``EvalArgs`` is ``args.eval``)."""
    text = (ALGOS / f"{name}.py").read_text()
    assert "update.metrics(" not in text
    assigned = {t.id for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    assert "evaluation" not in assigned


def test_mb_is_a_mini_batch_everywhere():
    """``mb`` names a mini-batch in the scripts (``for mb in update.minibatches``); the shared module's micro-batches
    are ``micro``, never ``mb``."""
    for module in (arena_train.batching, arena_train.update):
        names = {node.id for node in ast.walk(ast.parse(Path(module.__file__).read_text()))
                 if isinstance(node, ast.Name)}
        assert "mb" not in names, module.__name__


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_lengths(name):
    """A script reads in one sitting: grpo.py at most 400 lines, a method at most 500."""
    assert len((ALGOS / f"{name}.py").read_text().splitlines()) <= (400 if name == "grpo" else 500)
