"""arena_train's modules import each other without a circle, counting imports inside functions too: two modules in
a circle can be loaded and understood only together, and a function-level import that closes one breaks at the
first call made while either is half-initialised."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "arena_train"


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module name -> the sibling modules it imports anywhere in its source (module level, functions, classes)."""
    modules = {path.stem for path in package.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level:  # relative: from . import x, from .x import y
                names = [f"{package.name}.{node.module}"] if node.module else [
                    f"{package.name}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] if node.module != package.name else [
                    f"{package.name}.{alias.name}" for alias in node.names]
            else:
                continue
            deps |= {n.split(".")[1] for n in names if n.startswith(f"{package.name}.") and n.split(".")[1] in modules}
        graph[path.stem] = deps - {path.stem}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_arena_train_imports_form_no_circle():
    graph = import_graph()
    # the parser sees module-level and function-level imports
    assert {"backends", "weights"} <= graph["sharding"] and {"rows", "trajectory"} <= graph["rollout"]
    assert find_cycle(graph) is None


def test_the_cycle_finder_finds_module_and_function_level_circles(tmp_path):
    package = tmp_path / "arena_train"
    package.mkdir()
    (package / "a.py").write_text("from arena_train.b import f\n")
    (package / "b.py").write_text("import os\n\ndef f():\n    from arena_train import c\n")
    (package / "c.py").write_text("def g():\n    import arena_train.a\n")
    graph = import_graph(package)
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_arena_train_never_imports_eval():
    """The machinery sits below the analysis folder: no module of arena_train imports eval (the verdict's
    intervals live in arena_train.stats)."""
    offenders = []
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n == "eval" or n.startswith("eval.")]
    assert not offenders, offenders
