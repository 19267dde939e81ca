"""CI's vLLM leg cannot pass by skipping: with ``ARL_REQUIRE_VLLM=1`` a vLLM that does not import (here a broken
install: a ``vllm`` package whose import raises, first on the path) makes ``tests/test_vllm_backend.py`` an
error; without the variable the same file is collected and skipped, as on machines without vLLM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def collect(tmp_path: Path, required: bool) -> subprocess.CompletedProcess:
    broken = tmp_path / "site" / "vllm"
    broken.mkdir(parents=True, exist_ok=True)
    (broken / "__init__.py").write_text("raise ImportError('a vLLM build for another torch')\n")
    env = {k: v for k, v in os.environ.items() if k != "ARL_REQUIRE_VLLM"}
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(ROOT)]), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", **({"ARL_REQUIRE_VLLM": "1"} if required else {}))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                           "tests/test_vllm_backend.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_required_vllm_that_does_not_import_is_an_error(tmp_path):
    proc = collect(tmp_path, required=True)
    assert proc.returncode != 0
    assert "ARL_REQUIRE_VLLM=1 but vLLM does not import: ImportError: a vLLM build for another torch" in proc.stdout


def test_without_the_variable_the_file_is_skipped(tmp_path):
    proc = collect(tmp_path, required=False)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "tests collected" in proc.stdout
