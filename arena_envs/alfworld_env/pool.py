"""Text envs in worker processes, for rollout throughput with slow engines (ALFWorld, TextWorld).

Each worker owns one env made by ``gym.make(env_id, **kwargs)``; a batch of ``step`` calls is
sent to all addressed workers before any answer is read, so engines run in parallel. A worker
that dies (segfault in a native engine, OOM kill) is restarted with a fresh env and its episode
is reported as ended — ``truncated=True`` and ``info["worker_crashed"]=True`` — never lost;
the next call for that slot must be ``reset``.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from typing import Any, Mapping

from arena_envs.base import INFO_KEYS


def _worker(conn, env_id: str, kwargs: dict) -> None:
    import gymnasium as gym

    import arena_envs  # noqa: F401  (registers the ids)

    env = gym.make(env_id, **kwargs)
    while True:
        try:
            cmd, payload = conn.recv()
        except EOFError:
            break
        try:
            if cmd == "reset":
                conn.send(("ok", env.reset(**payload)))
            elif cmd == "step":
                conn.send(("ok", env.step(payload)))
            elif cmd == "call":
                conn.send(("ok", getattr(env.unwrapped, payload)()))
            elif cmd == "pid":
                conn.send(("ok", mp.current_process().pid))
            elif cmd == "close":
                env.close()
                conn.send(("ok", None))
                break
        except Exception:
            conn.send(("error", traceback.format_exc()))
    conn.close()


class WorkerCrashed(RuntimeError):
    pass


class EnvPool:
    """``n`` copies of ``env_id`` in worker processes, addressed by slot index."""

    def __init__(self, env_id: str, n: int, context: str = "spawn", **env_kwargs):
        self.env_id, self.n, self.env_kwargs = env_id, int(n), env_kwargs
        self._ctx = mp.get_context(context)
        self._procs: list = [None] * self.n
        self._conns: list = [None] * self.n
        self.restarts = 0
        for i in range(self.n):
            self._start(i)

    def _start(self, i: int) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(child, self.env_id, self.env_kwargs), daemon=True)
        proc.start()
        child.close()
        self._procs[i], self._conns[i] = proc, parent

    def _restart(self, i: int) -> None:
        self._conns[i].close()
        self._procs[i].join(timeout=1)
        if self._procs[i].is_alive():
            self._procs[i].kill()
            self._procs[i].join()
        self.restarts += 1
        self._start(i)

    def _send(self, i: int, cmd: str, payload: Any) -> bool:
        try:
            self._conns[i].send((cmd, payload))
            return True
        except (BrokenPipeError, ConnectionResetError, OSError):
            return False

    def _recv(self, i: int):
        try:
            status, value = self._conns[i].recv()
        except (EOFError, ConnectionResetError, OSError):
            raise WorkerCrashed(f"worker {i} died") from None
        if status == "error":
            raise RuntimeError(f"worker {i} raised:\n{value}")
        return value

    def _call(self, i: int, cmd: str, payload: Any = None):
        if not self._send(i, cmd, payload):
            raise WorkerCrashed(f"worker {i} died")
        return self._recv(i)

    def pid(self, i: int) -> int:
        return self._call(i, "pid")

    def reset(self, i: int, seed: int | None = None, options: dict | None = None):
        """Reset slot ``i``; a dead worker is restarted first (one retry)."""
        try:
            return self._call(i, "reset", {"seed": seed, "options": options})
        except WorkerCrashed:
            self._restart(i)
            return self._call(i, "reset", {"seed": seed, "options": options})

    def step(self, actions: Mapping[int, str]) -> dict[int, tuple]:
        """Step the given slots in parallel; crashed slots come back truncated and restarted."""
        sent = {i: self._send(i, "step", a) for i, a in actions.items()}
        out = {}
        for i, ok in sent.items():
            try:
                if not ok:
                    raise WorkerCrashed(f"worker {i} died")
                out[i] = self._recv(i)
            except WorkerCrashed:
                self._restart(i)
                info = {k: None for k in INFO_KEYS}
                info.update(won=False, action_is_valid=False, task="", worker_crashed=True)
                out[i] = ("", 0.0, False, True, info)
        return out

    def call(self, i: int, method: str):
        """Call a no-argument method of slot ``i``'s unwrapped env (e.g. ``expert_action``)."""
        return self._call(i, "call", method)

    def close(self) -> None:
        for i in range(self.n):
            if self._procs[i] is not None and self._procs[i].is_alive():
                if self._send(i, "close", None):
                    try:
                        self._recv(i)
                    except (WorkerCrashed, RuntimeError):
                        pass
                self._procs[i].join(timeout=5)
                if self._procs[i].is_alive():
                    self._procs[i].kill()
            if self._conns[i] is not None:
                self._conns[i].close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

