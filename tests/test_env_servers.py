"""Env servers (``--env-servers``, arena_envs.pool.EnvServers): episodes spread over OpenEnv servers on loopback give
the in-process rows bit for bit; a server that dies mid-rollout fails its episodes into the failure policy (the
group is retried, then dropped, and counted), one that hangs fails them at the step timeout, and a server that is
back serves the next episodes."""

from __future__ import annotations

import functools
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("openenv.core", reason="needs the [openenv] extra (openenv-core)")

import wrappers  # noqa: E402
from arena_envs.pool import EnvError, EnvServers, LocalEnvs, served_env  # noqa: E402
from arena_train.rollout import RolloutConfig, collect_rows  # noqa: E402
from integrations.openenv_server import ServerThread, make_app  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "ARL/Sokoban-Mini-v0"
CONFIG = RolloutConfig(max_turns=3, max_prompt_tokens=1024, max_response_tokens=6, temperature=1.0)


def make_env(env_id, **kwargs):
    return wrappers.make_env(env_id, history_length=1, prompt_style="compact", **kwargs)


def remote_fn():
    return functools.partial(served_env, make_env, ENV_ID)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, *flags: str, max_files: int | None = None) -> subprocess.Popen:
    """``python -m integrations.openenv_server ... flags`` on loopback, once it accepts connections; ``max_files``:
    the server's limit of open file descriptors (none: this process's)."""
    limit = None if max_files is None else functools.partial(resource.setrlimit, resource.RLIMIT_NOFILE,
                                                             (max_files, max_files))
    proc = subprocess.Popen([sys.executable, "-m", "integrations.openenv_server", "--env-id", ENV_ID, "--port",
                             str(port), *flags], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=limit)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            assert proc.poll() is None, "the server exited at start"
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not start within 60 s")


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model):
    from arena_train.models import load_model_and_tokenizer

    return load_model_and_tokenizer(tiny_model, torch.float32)


class KillAfter:
    """A backend that runs ``action`` once, right after its ``after``-th generate call (mid-rollout)."""

    def __init__(self, backend, after: int, action):
        self.backend, self.after, self.action, self.calls = backend, after, action, 0

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def generate_scored(self, *args, **kwargs):
        out = self.backend.generate_scored(*args, **kwargs)
        self.calls += 1
        if self.calls == self.after:
            self.action()
        return out


def collect(runner, model_and_tokenizer, seeds, backend_wrap=None):
    from arena_train.backends import HFBackend

    model, tokenizer = model_and_tokenizer
    rollout = wrappers.GroupRollout(runner, len(seeds), 2, env_id=ENV_ID)
    backend = HFBackend(model, tokenizer)
    torch.manual_seed(0)
    stats: dict[str, float] = defaultdict(float)
    rows, episodes = collect_rows(backend_wrap(backend) if backend_wrap else backend, tokenizer, rollout, seeds,
                                  CONFIG, stats)
    return [{k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in asdict(r).items()} for r in rows], stats


def test_servers_give_the_in_process_rows(model_and_tokenizer):
    local, _ = collect(LocalEnvs(functools.partial(make_env, ENV_ID, split="train")), model_and_tokenizer, [5, 8, 9])
    assert local and all(r["prompt_ids"] for r in local)
    with ServerThread(make_app(ENV_ID)) as a, ServerThread(make_app(ENV_ID)) as b:
        with EnvServers(remote_fn(), [a.url, b.url], 6) as servers:
            remote, stats = collect(servers, model_and_tokenizer, [5, 8, 9])
            assert servers.pid(0) != servers.pid(1)  # a worker per server
    assert remote == local and not stats["env_errors"]


def test_a_dead_or_hanging_server_fails_its_episodes_and_serves_again_once_back(model_and_tokenizer):
    port = free_port()
    proc = start_server(port)
    try:
        with ServerThread(make_app(ENV_ID)) as a, ServerThread(make_app(ENV_ID)) as c:
            urls = [a.url, f"http://127.0.0.1:{port}", c.url]  # slots 1 and 4 (groups 0 and 2) on the killed one
            with EnvServers(remote_fn(), urls, 6) as servers:
                rows, stats = collect(servers, model_and_tokenizer, [5, 8, 9],
                                      lambda b: KillAfter(b, 1, lambda: (proc.kill(), proc.wait())))
                # both of its episodes fail in the first pass (mid-rollout) and again on the retry (refused)
                assert (stats["env_errors"], stats["retried_groups"], stats["dropped_groups"]) == (4, 2, 2)
                assert rows and {r["group"] for r in rows} == {1}  # the dropped groups left no row
                proc = start_server(port)  # back: the failed slots connect again on their next reset
                rows, stats = collect(servers, model_and_tokenizer, [5, 8, 9])
                assert not stats["env_errors"] and {r["group"] for r in rows} == {0, 1, 2}

                servers.reset_many({i: {"seed": 3} for i in range(6)})
                os.kill(proc.pid, signal.SIGSTOP)  # hangs
                servers.timeout = 2
                results = servers.step_many({i: "<action>up</action>" for i in range(6)})
                assert [i for i in range(6) if isinstance(results[i], EnvError)] == [1, 4]
                assert results[1].kind == "timeout" and servers.restarts == 1
                os.kill(proc.pid, signal.SIGCONT)
                servers.timeout = None  # the restarted worker connects again (seconds on a loaded machine)
                again = servers.reset_many({i: {"seed": 3} for i in range(6)})
                assert not any(isinstance(r, EnvError) for r in again.values()), again
    finally:
        proc.kill()
        proc.wait()


def test_bad_server_urls_fail_clearly():
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        EnvServers(remote_fn(), ["localhost:8000"], 2)
    with ServerThread(make_app("ARL/Sokoban-v0")) as other:  # serves another env
        with EnvServers(remote_fn(), [other.url], 1) as servers:
            result = servers.reset_many({0: {"seed": 1}})[0]
            assert isinstance(result, EnvError) and "start it with --env-id ARL/Sokoban-Mini-v0" in result.error


def test_the_flag_puts_the_training_episodes_on_the_servers():
    from arena_train.cli import args_problem
    from arena_train.mixture import Mixture, MixtureRollout

    with ServerThread(make_app(ENV_ID)) as a:
        rollouts = MixtureRollout(Mixture.parse([ENV_ID]), make_env, num_groups=2, group_size=2, eval_episodes=1,
                                  env_servers=[a.url])
        try:
            assert isinstance(rollouts.rollout(0, 2).runner, EnvServers)
            assert isinstance(rollouts.eval_rollouts[0].runner, LocalEnvs)  # held-out episodes stay here
        finally:
            rollouts.close()
    problem = args_problem(SimpleNamespace(env_id=[ENV_ID, "ARL/WebShop-v0"], env_servers=("http://h:1",)))
    assert problem.startswith("error: --env-servers serves one env id")
    assert "http://HOST:PORT" in args_problem(SimpleNamespace(env_id=ENV_ID, env_servers=("h:1",)))
