"""Where a rollout's envs run: in the trainer's process (``LocalEnvs``) or in worker processes (``EnvPool``), behind
one interface, so that ``wrappers.GroupRollout`` steps either the same way.

Both hold numbered slots, one env each, and answer ``reset_many({slot: reset kwargs})`` and
``step_many({slot: action})`` with ``{slot: result}``, where a result is what ``env.reset`` / ``env.step`` returned
or an ``EnvError``: an exception in the env, a crashed worker or a step past the timeout. A slot whose env failed
gets a fresh env (made on its next reset); nothing raises out of a batch, so one bad episode never ends a run
(``wrappers.groups`` turns the error into a failed episode).

``EnvPool`` sends a batch to every addressed worker before reading any answer, so engines step in parallel. Slot
``i`` lives on worker ``i % workers``; a worker steps its slots one after the other. ``submit_many`` sends a batch
and returns at once (a ``Pending``), ``collect`` waits for its results: the trainer generates for other episodes
meanwhile (``--overlap-turns``). A worker answers its batches in the order it received them, so several may be
pending at once; ``step_many`` is ``collect(submit_many(...))``. ``LocalEnvs`` steps at ``submit_many``.
A worker that dies (a segfault in a native engine, an OOM kill) or runs past ``timeout`` seconds per step is killed
and restarted: its pending slots fail with that error, and its other slots (their envs are gone) fail on their
next step.
Workers are daemon processes that also leave when their pipe closes, so they end with the trainer on any exit
path; ``close`` (also at interpreter exit) ends them at once.

``EnvServers`` is an ``EnvPool`` whose worker ``w`` plays its slots on the OpenEnv server at ``urls[w]`` (``python -m
integrations.openenv_server``, on this machine or another): the worker holds the client side of each slot's stack
(``wrappers.make_env("ARL/Remote-v0", url=...)``: prompts, projection, format penalty), the server the env. A
server that dies or refuses fails the worker's episodes with the client's exception, one that hangs fails them
with ``timeout`` (the worker is killed and restarted); a failed slot connects again on its next reset, so a server
that is back serves the next episodes.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing as mp
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

#: Modules the forkserver imports once, so that a worker starts in milliseconds, not seconds.
_PRELOAD = ["gymnasium", "arena_envs", "wrappers"]


@dataclass(frozen=True)
class EnvError:
    """Why a slot's reset or step failed. ``kind``: the exception's type name, ``crash`` (the worker died) or
    ``timeout``; ``error``: one line; ``traceback``: the env's traceback (exceptions only)."""

    kind: str
    error: str
    traceback: str = ""


@dataclass(eq=False)
class Pending:
    """A batch sent to the envs and not collected yet: ``results`` so far (slot -> result) and, per worker, its share
    still unanswered (``EnvPool``) with that share's deadline (monotonic seconds; None: no timeout)."""

    cmd: str
    results: dict[int, Any] = field(default_factory=dict)
    shares: dict[int, dict[int, Any]] = field(default_factory=dict)
    deadlines: dict[int, float | None] = field(default_factory=dict)


def _exception_error(exc: BaseException) -> EnvError:
    return EnvError(type(exc).__name__, f"{type(exc).__name__}: {exc}", traceback.format_exc())


class LocalEnvs:
    """Slots in this process: ``env_fn()`` per slot, made on demand (``ensure``) and kept across resets."""

    def __init__(self, env_fn: Callable[[], Any], slots: int = 0):
        self.env_fn = env_fn
        self._envs: list[Any] = []
        self.ensure(slots)

    def ensure(self, slots: int) -> None:
        """Make envs up to ``slots`` slots (an env made here that raises is an error of its maker, not a slot's)."""
        while len(self._envs) < slots:
            self._envs.append(self.env_fn())

    @property
    def envs(self) -> list[Any]:
        return self._envs

    def reset_many(self, requests: Mapping[int, dict]) -> dict[int, Any]:
        return {i: self._run(i, lambda env, kw=kw: env.reset(**kw)) for i, kw in sorted(requests.items())}

    def step_many(self, actions: Mapping[int, Any]) -> dict[int, Any]:
        return {i: self._run(i, lambda env, a=a: env.step(a)) for i, a in sorted(actions.items())}

    def submit_many(self, actions: Mapping[int, Any]) -> Pending:
        """``step_many`` now (in this process there is nothing to overlap with), its results kept for ``collect``."""
        return Pending("step", self.step_many(actions))

    def collect(self, pending: Pending) -> dict[int, Any]:
        return pending.results

    def _run(self, i: int, fn):
        try:
            if self._envs[i] is None:
                self._envs[i] = self.env_fn()
            return fn(self._envs[i])
        except Exception as exc:  # the episode fails; the slot gets a fresh env on its next use
            error = _exception_error(exc)
            self._drop(i)
            return error

    def _drop(self, i: int) -> None:
        env, self._envs[i] = self._envs[i], None
        try:
            if env is not None:
                env.close()
        except Exception:
            pass

    def close(self) -> None:
        for i in range(len(self._envs)):
            self._drop(i)


def _attribute(env, name: str, args: tuple | None):
    """``env.unwrapped.<name>(*args)``, or the plain attribute when ``args`` is None."""
    value = getattr(env.unwrapped, name)
    return value if args is None else value(*args)


def _worker(conn, env_fn: Callable[[], Any]) -> None:
    """A worker's loop: its slots' envs, made on first use; an env that raised is dropped (fresh next time)."""
    envs: dict[int, Any] = {}

    def run(i, fn):
        try:
            if i not in envs:
                envs[i] = env_fn()
            return ("ok", fn(envs[i]))
        except Exception as exc:
            envs.pop(i, None)
            return ("error", _exception_error(exc))

    while True:
        try:
            cmd, payload = conn.recv()
        except (EOFError, OSError):
            break  # the trainer is gone
        if cmd == "reset":
            conn.send({i: run(i, lambda env, kw=kw: env.reset(**kw)) for i, kw in sorted(payload.items())})
        elif cmd == "step":
            conn.send({i: run(i, lambda env, a=a: env.step(a)) for i, a in sorted(payload.items())})
        elif cmd == "call":  # (slot, attribute name, args or None for a plain attribute)
            slot, name, args = payload
            conn.send(run(slot, functools.partial(_attribute, name=name, args=args)))
        elif cmd == "attrs":
            conn.send(run(payload, lambda env: {n: callable(getattr(env.unwrapped, n, None))
                                                for n in dir(env.unwrapped) if not n.startswith("__")}))
        elif cmd == "pid":
            conn.send(("ok", mp.current_process().pid))
        elif cmd == "close":
            for env in envs.values():
                try:
                    env.close()
                except Exception:
                    pass
            conn.send(("ok", None))
            break
    conn.close()


def _close_all(ref) -> None:
    pool = ref()
    if pool is not None:
        pool.close()


class EnvPool:
    """``slots`` envs in ``workers`` processes (default one per slot). ``env`` is an env id (made with
    ``gym.make(env, **env_kwargs)``) or a picklable no-argument callable (``functools.partial(wrappers.make_env,
    ...)``). ``timeout``: seconds a step or reset may take (None: no limit)."""

    #: Modules the forkserver imports (when this pool starts it: the first pool of a process does).
    preload = _PRELOAD

    def __init__(self, env: str | Callable[[], Any], slots: int, workers: int | None = None,
                 context: str = "forkserver", timeout: float | None = None, **env_kwargs):
        if isinstance(env, str):
            import gymnasium as gym

            env = functools.partial(gym.make, env, **env_kwargs)
        self.env_fn, self.slots = env, int(slots)
        self.workers = max(1, min(int(workers or self.slots), self.slots)) if self.slots else 1
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout}")
        self.timeout, self.restarts = timeout, 0
        self._ctx = mp.get_context(context)
        if context == "forkserver":
            self._ctx.set_forkserver_preload(self.preload)
        self._procs: list = [None] * self.workers
        self._conns: list = [None] * self.workers
        self._queues: list[deque[Pending]] = [deque() for _ in range(self.workers)]  # sent, unanswered, in order
        self._lost: dict[int, EnvError] = {}  # slots whose env died with its worker, until their next reset
        self._attrs: dict[str, bool] | None = None
        self._proxies = [SlotProxy(self, i) for i in range(self.slots)]
        for w in range(self.workers):
            self._start(w)
        atexit.register(_close_all, weakref.ref(self))

    def ensure(self, slots: int) -> None:
        if slots > self.slots:
            raise ValueError(f"this pool has {self.slots} slots, {slots} were asked for")

    def worker_of(self, slot: int) -> int:
        return slot % self.workers

    def _worker_env_fn(self, w: int) -> Callable[[], Any]:
        """What worker ``w`` makes its slots' envs with."""
        return self.env_fn

    def _start(self, w: int) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(child, self._worker_env_fn(w)), daemon=True)
        proc.start()
        child.close()
        self._procs[w], self._conns[w] = proc, parent

    def _restart(self, w: int, error: EnvError) -> None:
        """Kill worker ``w`` and start a fresh one; its slots' envs are gone (``_lost`` until reset), and every batch
        share still pending on it fails with ``error``."""
        self._conns[w].close()
        if self._procs[w].is_alive():
            self._procs[w].kill()
        self._procs[w].join()
        self.restarts += 1
        for slot in range(w, self.slots, self.workers):
            self._lost[slot] = error
        while self._queues[w]:
            pending = self._queues[w].popleft()
            for slot in pending.shares.pop(w):
                pending.results[slot] = error
        self._start(w)

    def submit_many(self, actions: Mapping[int, Any], cmd: str = "step") -> Pending:
        """Send each worker its share of ``actions`` (``cmd`` "step", or "reset" with reset kwargs) and return
        without waiting; ``collect`` gives the results."""
        pending = Pending(cmd)
        shares: dict[int, dict[int, Any]] = {}
        for slot, value in actions.items():
            if not 0 <= slot < self.slots:
                raise ValueError(f"slot {slot} out of range (pool of {self.slots})")
            if cmd == "step" and slot in self._lost:
                pending.results[slot] = self._lost[slot]
                continue
            shares.setdefault(self.worker_of(slot), {})[slot] = value
        now = time.monotonic()
        for w, share in shares.items():
            try:
                self._conns[w].send((cmd, share))
            except (BrokenPipeError, ConnectionResetError, OSError):
                error = self._crash_error(w)
                self._restart(w, error)
                pending.results.update(dict.fromkeys(share, error))
                continue
            pending.shares[w] = share
            if self.timeout is None:
                pending.deadlines[w] = None
            else:  # the worker starts on this share when the ones queued before it are answered
                queued = [p.deadlines[w] for p in self._queues[w]]
                pending.deadlines[w] = max([now, *queued]) + self.timeout * len(share)
            self._queues[w].append(pending)
        return pending

    def collect(self, pending: Pending) -> dict[int, Any]:
        """Wait for every share of ``pending`` (answers to batches sent before it are kept for their own
        ``collect``): results or ``EnvError`` per slot. A worker that dies, or passes a share's deadline, is
        restarted and its pending shares fail (``crash``, ``timeout``)."""
        while pending.shares:
            conns = {self._conns[w]: w for w in pending.shares}
            heads = [self._queues[w][0].deadlines[w] for w in conns.values()]
            wait_s = None if None in heads else max(0.0, min(heads) - time.monotonic())
            ready = wait(list(conns), timeout=wait_s)
            for conn in ready:
                w = conns[conn]
                try:
                    answers = conn.recv()
                except (EOFError, ConnectionResetError, OSError):
                    self._restart(w, self._crash_error(w))
                    continue
                head = self._queues[w].popleft()
                head.shares.pop(w)
                for slot, (status, value) in answers.items():
                    head.results[slot] = value
                    if head.cmd == "reset" and status == "ok":
                        self._lost.pop(slot, None)
            if not ready:  # past a deadline: that worker hangs
                now = time.monotonic()
                for w in list(conns.values()):
                    deadline = self._queues[w][0].deadlines[w] if self._queues[w] else None
                    if deadline is not None and now >= deadline:
                        self._restart(w, EnvError("timeout", f"no answer within --env-step-timeout "
                                                             f"{self.timeout:g} s per step (worker {w} killed)"))
        return pending.results

    def _batch(self, cmd: str, payload: Mapping[int, Any]) -> dict[int, Any]:
        """Send each worker its share of ``payload`` at once, then gather: results or ``EnvError`` per slot."""
        return self.collect(self.submit_many(payload, cmd))

    def _crash_error(self, w: int) -> EnvError:
        self._procs[w].join(timeout=1)
        return EnvError("crash", f"worker {w} died (exit code {self._procs[w].exitcode})")

    def reset_many(self, requests: Mapping[int, dict]) -> dict[int, Any]:
        return self._batch("reset", requests)

    def step_many(self, actions: Mapping[int, Any]) -> dict[int, Any]:
        return self._batch("step", actions)

    def _call(self, w: int, cmd: str, payload: Any):
        while self._queues[w]:  # the worker answers in order: its pending batches first
            self.collect(self._queues[w][0])
        try:
            self._conns[w].send((cmd, payload))
            status, value = self._conns[w].recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            error = self._crash_error(w)
            self._restart(w, error)
            raise RuntimeError(error.error) from None
        if status == "error":
            raise RuntimeError(f"{value.error}\n{value.traceback}")
        return value

    def call(self, slot: int, name: str, *args):
        """Call method ``name`` of slot ``slot``'s unwrapped env with ``args`` (e.g. ``expert_action``)."""
        return self._call(self.worker_of(slot), "call", (slot, name, args))

    def get(self, slot: int, name: str):
        """Attribute ``name`` of slot ``slot``'s unwrapped env."""
        return self._call(self.worker_of(slot), "call", (slot, name, None))

    def attrs(self, slot: int = 0) -> dict[str, bool]:
        """The public attributes of an unwrapped env (name -> callable), read once from ``slot``'s env."""
        if self._attrs is None:
            self._attrs = self._call(self.worker_of(slot), "attrs", slot)
        return self._attrs

    def pid(self, slot: int) -> int:
        """Process id of the worker holding ``slot``."""
        return self._call(self.worker_of(slot), "pid", None)

    @property
    def envs(self) -> list[SlotProxy]:
        """Stand-ins of the slots' envs whose ``unwrapped`` reaches the env in its worker (``env.unwrapped.expert_
        action()`` works as in-process; stepping goes through ``step_many``)."""
        return self._proxies

    # the single-slot calls of the pool's first version (benchmarks, tests)
    def reset(self, slot: int, seed: int | None = None, options: dict | None = None):
        """Reset one slot; raises on an error."""
        result = self.reset_many({slot: {"seed": seed, "options": options}})[slot]
        if isinstance(result, EnvError):
            raise RuntimeError(f"{result.error}\n{result.traceback}")
        return result

    def step(self, actions: Mapping[int, Any]) -> dict[int, Any]:
        return self.step_many(actions)

    def close(self) -> None:
        """End every worker (idempotent)."""
        for w in range(self.workers):
            proc, conn = self._procs[w], self._conns[w]
            if proc is None:
                continue
            if proc.is_alive():
                try:
                    conn.send(("close", None))
                    if conn.poll(5):
                        conn.recv()
                except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
                    pass
                proc.join(timeout=5)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
            conn.close()
            self._procs[w] = self._conns[w] = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def served_env(make_env: Callable[..., Any], env_id: str, url: str):
    """``make_env("ARL/Remote-v0", url=url)`` (the client-side stack of a served env), checked to serve ``env_id``."""
    env = make_env("ARL/Remote-v0", url=url)
    served = env.unwrapped.served_id
    if served != env_id:
        env.close()
        raise ValueError(f"{url} serves {served}, not {env_id}: start it with --env-id {env_id}")
    return env


def servers_problem(urls, env_ids) -> str | None:
    """Why ``--env-servers`` cannot serve this run (a URL without its scheme, a mixture), or None."""
    bad = [u for u in urls if not u.startswith(("http://", "https://", "ws://", "wss://"))]
    if bad:
        return f"error: --env-servers takes URLs such as http://HOST:PORT, got {' '.join(bad)}"
    if urls and not isinstance(env_ids, str) and len(env_ids) != 1:
        return "error: --env-servers serves one env id (a server plays one); run a mixture's envs locally"
    return None


class EnvServers(EnvPool):
    """``slots`` envs on the OpenEnv servers at ``urls``: one worker process per server (fewer if there are fewer
    slots), slot ``i`` on ``urls[i % len(urls)]``. ``make_env(url)`` builds one env connected to ``url`` (e.g.
    ``functools.partial(served_env, functools.partial(wrappers.make_env, ...), env_id)``; it must pickle).
    ``timeout``: seconds a step or reset may take, as for ``EnvPool``."""

    preload = [*_PRELOAD, "integrations.openenv_client"]  # the OpenEnv client imports for seconds

    def __init__(self, make_env: Callable[[str], Any], urls: list[str], slots: int, timeout: float | None = None,
                 context: str = "forkserver"):
        problem = "error: no env server URL" if not urls else servers_problem(urls, "")
        if problem:
            raise ValueError(problem.removeprefix("error: "))
        self.urls = list(urls)
        super().__init__(make_env, slots, workers=len(self.urls), context=context, timeout=timeout)

    def _worker_env_fn(self, w: int) -> Callable[[], Any]:
        return functools.partial(self.env_fn, self.urls[w])


class SlotProxy:
    """One ``EnvPool`` slot seen as an env: ``unwrapped`` forwards attribute reads and method calls."""

    def __init__(self, pool: EnvPool, slot: int):
        self.pool, self.slot = pool, slot
        self.unwrapped = _Unwrapped(pool, slot)


class _Unwrapped:
    def __init__(self, pool: EnvPool, slot: int):
        self._pool, self._slot = pool, slot

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        attrs = self._pool.attrs(self._slot)
        if name not in attrs:
            raise AttributeError(f"the env has no attribute {name!r}")
        if attrs[name]:
            return functools.partial(self._pool.call, self._slot, name)
        return self._pool.get(self._slot, name)
