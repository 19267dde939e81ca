"""Helpers shared by the tests: the one loader of method scripts as modules, and ``accelerate launch``."""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from arena_train.dist import cpu_launch
from arena_train.dist import free_port as dist_free_port

# Property tests draw the same examples on every run (a red CI run is reproducible, never a coin toss);
# HYPOTHESIS_PROFILE=explore searches new examples on each run, for local bug hunting.
settings.register_profile("repro", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repro"))

ALGOS = Path(__file__).resolve().parents[1] / "algos"
ACCELERATE = Path(sys.executable).parent / "accelerate"
START = re.compile(r"^\s*# ALGO LOGIC:")
END = re.compile(r"^\s*# END ALGO LOGIC\s*$")


def split_blocks(text: str) -> tuple[list[str], list[str]]:
    """-> (the n+1 stretches of text outside the blocks, the n block bodies); marker lines belong to neither."""
    outside, blocks, current, inside = [], [], [], False
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if START.match(line):
            assert not inside, f"line {number}: ALGO LOGIC block opened inside another"
            outside.append("".join(current))
            current, inside = [], True
        elif END.match(line):
            assert inside, f"line {number}: END ALGO LOGIC without an open block"
            blocks.append("".join(current))
            current, inside = [], False
        else:
            current.append(line)
    assert not inside, "unterminated ALGO LOGIC block"
    outside.append("".join(current))
    return outside, blocks


def method_scripts() -> list[str]:
    """Every algos/*.py with ALGO LOGIC blocks (grpo.py and its copies, forks included), sorted: the tests that
    check a script take them from here, so a new copy is checked with no edit to them."""
    return sorted(p.stem for p in ALGOS.glob("*.py") if "# ALGO LOGIC:" in p.read_text())


def load_script(name: str):
    """``algos/<name>.py`` as a module named ``algos_<name>`` (importing a script has no side effects).

    The only place that loads a script by path: scripts import ``arena_train`` and never each other, so
    the property tests of a script's math and the block-consistency test come through here.
    """
    module_name = f"algos_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, ALGOS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses resolve their module through sys.modules
        spec.loader.exec_module(module)
    return sys.modules[module_name]

def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module named ``name`` (a benchmark run as a script imports its siblings by that
    name, so a test shares the module object with them)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ALGOS.parent / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses resolve their module through sys.modules
        spec.loader.exec_module(module)
    return sys.modules[name]


#: Skip marker for machines without the accelerate CLI.
needs_accelerate = pytest.mark.skipif(shutil.which("accelerate") is None and not ACCELERATE.exists(),
                                      reason="accelerate CLI not found")


def free_port() -> int:
    """A rendezvous port of this test process's own range: pytest-xdist workers run launches side by side, and
    ranges below the kernel's ephemeral ports (from 32768) are never handed to anyone else."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    base = 20000 + 1000 * (int(worker.removeprefix("gw")) % 12)
    start = next(_PORT_CALLS)  # two launches built before either binds get different ports
    return dist_free_port(base + (start + k) % 1000 for k in range(1000))


_PORT_CALLS = itertools.count(1)


def two_process_launch(script: Path) -> list[str]:
    """``accelerate launch`` of ``script`` on 2 CPU processes."""
    return [*cpu_launch(2, free_port()), str(script)]


def run_two_processes(source: str, folder: Path, *args: str) -> subprocess.CompletedProcess:
    """Write ``source`` to ``folder``/script.py and run it on 2 CPU processes (one thread each), output captured."""
    script = folder / "script.py"
    script.write_text(source)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([*two_process_launch(script), *args], env=env, capture_output=True, text=True, timeout=300)


#: The Accelerate files of algos/configs (ddp, fsdp2, zero3).
CONFIGS = ALGOS / "configs"


def launch_config(config: str, script: str, model: str, out: Path, *extra: str, env: dict | None = None,
                  timeout: int = 400) -> subprocess.CompletedProcess:
    """Two CPU processes of ``algos/<script>.py`` under ``algos/configs/<config>.yaml`` in float32: two short
    iterations of the tiny model, run name ``config``, no evaluation; ``extra`` arguments are appended."""
    cmd = [str(ACCELERATE), "launch", "--config_file", str(CONFIGS / f"{config}.yaml"), "--num_processes", "2",
           "--mixed_precision", "no", "--main_process_port", str(free_port()), str(ALGOS / f"{script}.py"),
           "--model-path", model, "--output-dir", str(out), "--run-name", config, "--num-iterations", "2",
           "--num-groups", "2", "--group-size", "2", "--max-turns", "2", "--max-response-tokens", "8",
           "--mini-batch-size", "2", "--micro-batch-size", "1", "--eval-every", "0", "--eval-episodes", "2",
           "--learning-rate", "1e-3", *extra]
    env = env or {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A real random tiny Qwen3 (arena_models) whose tokenizer knows the Sokoban prompt words."""
    from arena_models import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny"), corpus=["Push every box (X) onto a target (O)."]))


#: The file whose tests take longest (minutes: each recomputes optimizer steps against a naive reference).
LONGEST_FILE = "test_reference_update.py"


def pytest_collection_modifyitems(config, items):
    """The longest file first: with ``-n 2 --dist loadfile`` whole files go to the workers in collection order, and
    a long file handed out late would run alone at the end while the other core idles."""
    items.sort(key=lambda item: item.path.name != LONGEST_FILE)  # stable: the order within and of the rest is kept


def proc_children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc: the sandbox tests' view of what a call left running)."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
    return kids
