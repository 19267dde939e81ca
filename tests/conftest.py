"""Helpers shared by the tests that launch training scripts under ``accelerate launch``."""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

import pytest

ACCELERATE = Path(sys.executable).parent / "accelerate"

#: Skip marker for machines without the accelerate CLI.
needs_accelerate = pytest.mark.skipif(shutil.which("accelerate") is None and not ACCELERATE.exists(),
                                      reason="accelerate CLI not found")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_process_launch(script: Path) -> list[str]:
    """``accelerate launch`` of ``script`` on 2 CPU processes.

    ``--cpu`` silently starts one process; ``--multi_gpu`` with ``Accelerator(cpu=True)`` in the script gives two.
    """
    return [str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), str(script)]
