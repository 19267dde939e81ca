"""Reductions over the processes of an ``accelerate launch`` (a single process is the identity), and a free
rendezvous port and command prefix for starting one."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterable

import numpy as np
import torch


def global_mean(accelerator, values: list[float]) -> float:
    """Mean of ``values`` pooled over all processes (nan if there are none)."""
    t = torch.tensor([float(np.sum(values)) if values else 0.0, float(len(values))], device=accelerator.device)
    total, count = accelerator.reduce(t, reduction="sum").tolist()
    return total / count if count else float("nan")


def global_sum(accelerator, value: float) -> float:
    """Sum of one number over all processes."""
    return accelerator.reduce(torch.tensor(float(value), device=accelerator.device), reduction="sum").item()


def param_sync_error(accelerator, model) -> float:
    """Max |difference| of per-tensor parameter checksums between ranks (0 = in sync). Sharded parameters
    (FSDP2 DTensors) are checked as the full tensors every rank would save (gathered one at a time)."""
    from torch.distributed.tensor import DTensor

    sums = torch.stack([(p.full_tensor() if isinstance(p, DTensor) else p).detach().float().sum()
                        for p in model.parameters()])
    gathered = accelerator.gather(sums.unsqueeze(0))  # (world, n_params)
    return float((gathered - gathered[0]).abs().max())


def free_port(ports: Iterable[int] | None = None) -> int:
    """A TCP port nobody listens on now: launches side by side (pipeline seeds, tests) each need their own
    rendezvous, and accelerate's default 29500 is one for all. ``ports``: the first free one of these (below the
    kernel's ephemeral range, ports no other caller draws from are never handed out twice); None: one the kernel
    picks."""
    for port in ports if ports is not None else [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port among those given")


def cpu_launch(processes: int, port: int | None = None) -> list[str]:
    """The command prefix that starts a script on ``processes`` CPU processes (gloo) under ``accelerate launch``,
    rendezvous on ``port`` (None: accelerate's default). ``--multi_gpu`` since ``--cpu`` silently starts one
    process; the scripts' ``Accelerator`` picks the CPU when there is no GPU."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            *(["--main_process_port", str(port)] if port is not None else [])]
