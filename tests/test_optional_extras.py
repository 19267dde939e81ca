"""An env whose optional extra is not installed fails at ``gym.make`` with one line naming the pip command, not a
bare ``ModuleNotFoundError`` (the missing package is simulated: ``sys.modules[name] = None`` for the package and
every submodule already imported makes its import fail, as an uninstalled package does, even in a process where
another test imported it)."""

from __future__ import annotations

import importlib
import sys

import gymnasium as gym
import pytest

import arena_envs  # noqa: F401  (registers the ids)

CASES = [("ARL/Remote-v0", "openenv", "openenv", {"url": "http://127.0.0.1:9"}),
         ("ARL/ALFWorld-v0", "alfworld", "alfworld", {"games_per_task": 1}),
         ("ARL/ALFWorld-Unseen-v0", "textworld", "alfworld", {"games_per_task": 1}),  # ALFWorld's engine is TextWorld
         ("ARL/TextWorld-v0", "textworld", "textworld", {}),
         ("ARL/TextWorld-Large-v0", "textworld", "textworld", {})]


def hide(monkeypatch, package: str) -> None:
    """Make ``package`` and its submodules unimportable, and drop the project modules that import it."""
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")] + [package]:
        monkeypatch.setitem(sys.modules, name, None)
    for name in [n for n in sys.modules if n.startswith("integrations.openenv_")]:
        monkeypatch.delitem(sys.modules, name)


def assert_one_line_naming_the_extra(err: ModuleNotFoundError, extra: str) -> None:
    message = str(err)
    assert "\n" not in message and f'pip install -e ".[{extra}]"' in message, message
    assert err.__cause__ is None and err.__suppress_context__  # no bare ModuleNotFoundError chained above it


@pytest.mark.parametrize(("env_id", "missing", "extra", "kwargs"), CASES)
def test_a_missing_extra_is_one_line_with_the_pip_command(monkeypatch, env_id, missing, extra, kwargs):
    hide(monkeypatch, missing)
    with pytest.raises(ModuleNotFoundError) as caught:
        gym.make(env_id, **kwargs)
    assert_one_line_naming_the_extra(caught.value, extra)
    assert missing in str(caught.value)


def test_the_openenv_server_without_openenv_is_one_line(monkeypatch):
    hide(monkeypatch, "openenv")
    with pytest.raises(ModuleNotFoundError) as caught:
        importlib.import_module("integrations.openenv_server")
    assert_one_line_naming_the_extra(caught.value, "openenv")
