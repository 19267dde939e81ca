"""Every module of ``arena_envs`` imports on its own, first (an import circle fails only in that order)."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = r'''
import importlib, pkgutil, sys
import arena_envs
names = sorted(m.name for m in pkgutil.walk_packages(arena_envs.__path__, "arena_envs."))
failed = []
for name in names:
    for loaded in [m for m in sys.modules if m == "arena_envs" or m.startswith("arena_envs.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except ImportError as e:
        if "partially initialized" in str(e) or "circular" in str(e) or getattr(e, "name", "") is None:
            failed.append(f"{name}: {e}")
        elif not (getattr(e, "name", "") or "").split(".")[0] in ("alfworld", "textworld", "jericho"):
            failed.append(f"{name}: {e}")
print(len(names))
print("\n".join(failed))
'''


def test_each_module_imports_first_without_a_circle():
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    count, *failed = out.stdout.strip().split("\n")
    assert int(count) > 20 and failed == [], failed


def test_no_import_circle_among_env_modules():
    """Function-level imports included: games builds a missing slot through slots, which never imports games."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    graph = {}
    for path in (root / "arena_envs").rglob("*.py"):
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        graph[name] = {n.module for n in ast.walk(ast.parse(path.read_text()))
                       if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("arena_envs.")}

    def reaches(start: str, target: str, seen: set) -> bool:
        for dep in graph.get(start, ()):
            if dep == target or (dep not in seen and not seen.add(dep) and reaches(dep, target, seen)):
                return True
        return False

    circles = [m for m in graph if not m.endswith("__init__") and "." in m and reaches(m, m, set())
               and not any(m.startswith(p) for p in ("arena_envs.__init__",))]
    assert not [m for m in circles if "alfworld_env" in m], circles
