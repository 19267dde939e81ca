"""Env servers and their clients against each other's worst: connections that send half a request, reset options
outside the served catalogue, a server that sends a 20 MB observation and hostile info, a server that pays a NaN
reward. Every server listens on 127.0.0.1 only; every loop is bounded in count and time."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv.core", reason="needs the [openenv] extra (openenv-core)")

from test_env_failures import first_task_seed  # noqa: E402
from test_env_servers import free_port, start_server  # noqa: E402

import wrappers  # noqa: E402
from arena_envs.base import MAX_OBSERVATION_CHARS, TRUNCATION_NOTE  # noqa: E402
from integrations import openenv_server  # noqa: E402
from integrations.openenv_client import (  # noqa: E402
    MAX_INFO_CHARS,
    RemoteEnv,
    ServerReplyError,
    served_info,
    served_reward,
)
from integrations.openenv_server import ServerThread, main, make_app  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HOSTILE_ID = "hostile_env:Hostile-v0"  # tests/hostile_env.py, imported by gym.make
#: The served limits of the half-sent test: a cap and a file limit far below the connections that the test opens.
CAP, REQUEST_TIMEOUT_S, MAX_FILES, HALF_SENT = 16, 2.0, 96, 100


def half_sent(port: int) -> socket.socket:
    """A connection that sends half a request line and then nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"GET /health HT")
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(0.01)
    try:
        return sock.recv(16) == b""
    except TimeoutError:
        return False
    except OSError:  # reset by the server
        return True


def test_half_sent_requests_leave_a_trainer_served():
    """100 half-sent requests against a server with 96 descriptors: without a cap they take every descriptor and a
    trainer's handshake waits in the listen queue until its timeout; with the cap the newest connections take the
    places of the oldest half-sent ones, the rest are closed at the request timeout, and a session outlives it."""
    port = free_port()
    proc = start_server(port, "--max-sessions", "2", "--limit-concurrency", str(CAP), "--request-timeout",
                        str(REQUEST_TIMEOUT_S), max_files=MAX_FILES)
    stuck: list[socket.socket] = []
    try:
        stuck = [half_sent(port) for _ in range(HALF_SENT)]
        began = time.monotonic()
        env = RemoteEnv(f"http://127.0.0.1:{port}", connect_timeout_s=5, message_timeout_s=10)
        obs, _ = env.reset(seed=1)
        assert obs and time.monotonic() - began < 5
        deadline = time.monotonic() + REQUEST_TIMEOUT_S + 10
        while not all(map(closed_by_server, stuck)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(map(closed_by_server, stuck))
        time.sleep(max(0.0, began + REQUEST_TIMEOUT_S + 0.5 - time.monotonic()))
        assert env.step("up")[0]  # the session is no request: no deadline ends it
        env.close()
    finally:
        for sock in stuck:
            sock.close()
        proc.kill()
        proc.wait()


def test_limits_have_flags_with_defaults(monkeypatch):
    import uvicorn

    with pytest.raises(SystemExit):  # an env without a catalogue has no new games to allow
        main(["--env-id", "ARL/Sokoban-Mini-v0", "--allow-new-games"])
    seen = {}
    monkeypatch.setattr(openenv_server, "make_app", lambda env_id, sessions, **kwargs: seen.update(app=kwargs))
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: seen.update(run=options))
    main(["--env-id", "ARL/TextWorld-v0", "--allow-new-games"])
    assert seen["app"] == {"new_games": True}
    assert [seen["run"][k] for k in ("limit_concurrency", "backlog", "timeout_keep_alive")] == [128, 128, 5.0]
    assert seen["run"]["http"].keywords == {"request_timeout_s": 10.0}
    with pytest.raises(SystemExit):  # each session holds a connection: the cap must leave room for a handshake
        main(["--env-id", "ARL/Sokoban-Mini-v0", "--max-sessions", "8", "--limit-concurrency", "8"])


def test_reset_options_stay_in_the_served_catalogue(tmp_path):
    """A client asks a TextWorld server for game 654321 of a 100-game catalogue: refused, nothing generated."""
    pytest.importorskip("textworld", reason="TextWorld needs the [textworld] extra")
    with ServerThread(make_app("ARL/TextWorld-v0", max_sessions=1, cache_dir=str(tmp_path)), timeout_s=60) as server:
        env = RemoteEnv(server.url)
        with pytest.raises(ValueError, match=r"'game' must be in \[0, 100\)"):
            env.reset(options={"game": 654321})
        env.close()
    assert not list(tmp_path.iterdir())  # no game was generated or cached


def test_new_games_only_when_allowed(monkeypatch, tmp_path):
    pytest.importorskip("textworld", reason="TextWorld needs the [textworld] extra")
    from arena_envs import textworld_env

    def no_generation(kind, settings, seed, cache_dir):
        raise LookupError(f"would generate the game of seed {seed}")

    monkeypatch.setattr(textworld_env, "cached_game", no_generation)
    allowed = textworld_env.TextWorldEnv(num_games=1, new_games=True, cache_dir=str(tmp_path))
    with pytest.raises(LookupError, match="seed 654321"):
        allowed.reset(options={"game": 654321})
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        textworld_env.TextWorldEnv(num_games=1, cache_dir=str(tmp_path)).reset(options={"game": 1})


def test_a_servers_observation_and_info_are_bounded_and_cleaned():
    """20 MB observations starting with U+202E and hostile info (5,000 admissible actions of 1,000 characters, a lone
    surrogate, NaN): every observation as an in-process env's (cleaned, at most MAX_OBSERVATION_CHARS), the info
    bounded and JSON-safe, and a prompt with a history of 2 stays bounded over 3 steps."""
    with ServerThread(make_app(HOSTILE_ID, max_sessions=2, mode="huge")) as server:
        raw = RemoteEnv(server.url, message_timeout_s=120)
        with pytest.raises(ValueError) as refused:  # the server's error message goes to the run's log
            raw.reset(options={"fail": True})
        assert len(str(refused.value)) <= MAX_OBSERVATION_CHARS and "\u202e" not in str(refused.value)
        replies = [raw.reset(seed=1), raw.step("up")[::4]]
        raw.close()
        for obs, info in replies:
            assert len(obs) == MAX_OBSERVATION_CHARS and obs.endswith(TRUNCATION_NOTE) and "\u202e" not in obs
            assert info["task"] == "push the box" and info["score"] is None  # bidi controls gone, NaN as None
            assert len(json.dumps(info, ensure_ascii=False, allow_nan=False).encode()) < 4 * MAX_INFO_CHARS
        env = wrappers.make_env("ARL/Remote-v0", url=server.url, history_length=2, prompt_style="compact")
        lengths = [sum(len(m["content"]) for m in env.reset(seed=1)[1]["messages"])]
        for _ in range(3):
            lengths.append(sum(len(m["content"]) for m in env.step(wrappers.format_response("up"))[4]["messages"]))
        env.close()
    assert max(lengths) < 4 * (MAX_OBSERVATION_CHARS + MAX_INFO_CHARS), lengths


@pytest.mark.parametrize("reward", [math.nan, math.inf, -math.inf, 1e300, 10 ** 400, "1.0", True, None, [1]],
                         ids=["nan", "inf", "-inf", "1e300", "10**400", "str", "bool", "None", "list"])
def test_a_reward_that_is_no_finite_number_is_refused(reward):
    with pytest.raises(ServerReplyError):
        served_reward(reward)


def test_contract_info_keys_keep_their_types():
    for info in ({"won": "yes"}, {"action_is_valid": 1}, {"task": 3}, {"admissible_actions": [1, 2]},
                 {"admissible_actions": "up"}):
        with pytest.raises(ServerReplyError):
            served_info(info)
    hostile = {"won": True, "a": {"b": [math.inf, "x\ud800y\u2066"]}}  # JSON's "\\ud800" decodes to a lone surrogate,
    assert served_info(hostile) == {"won": True, "a": {"b": [None, "xy"]}}  # which no episode file could encode


class LiteralNaN:
    """ASGI middleware: the WebSocket replies' ``"reward":null`` (how OpenEnv's pydantic writes a NaN) sent as JSON's
    ``NaN`` instead, which Python's ``json`` reads as a float NaN: what a server written otherwise sends."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        async def send_nan(message):
            if message["type"] == "websocket.send" and message.get("text"):
                message = {**message, "text": message["text"].replace('"reward":null', '"reward":NaN')}
            await send(message)

        await self.app(scope, receive, send_nan)


def test_a_nan_reward_is_an_env_error(tiny_model, tmp_path):
    """A server pays NaN on the first step of the first group's task seed: that step is an env error, the group is
    replayed, then dropped and counted; the other group trains, both iterations run and log their episodes."""
    nan_seed = first_task_seed(1)
    app = LiteralNaN(make_app(HOSTILE_ID, max_sessions=16, mode="nan", seeds=[nan_seed], step=1))
    with ServerThread(app) as server:
        cmd = [sys.executable, str(ROOT / "algos" / "grpo.py"), "--model-path", tiny_model, "--output-dir",
               str(tmp_path / "runs"), "--run-name", "r", "--env-id", HOSTILE_ID, "--env-servers", server.url,
               "--eval-split", "test", "--num-groups", "2", "--group-size", "3", "--max-turns", "3",
               "--max-response-tokens", "8", "--eval-every", "0", "--torch-threads", "1", "--mini-batch-size", "8",
               "--micro-batch-size", "3", "--num-iterations", "2"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
               "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ServerReplyError: the server sent a reward outside" in proc.stderr, proc.stderr[-3000:]  # printed once
    run = tmp_path / "runs" / "r"
    first, second = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert (first["rollout/env_errors"], first["rollout/retried_groups"], first["rollout/dropped_groups"]) == (6, 1, 1)
    assert first["actor/skipped_updates"] == 0 and math.isfinite(first["rollout/episode_return"])
    assert second["rollout/env_errors"] == 0
    for name in ("train_000001.jsonl", "train_000002.jsonl"):
        records = [json.loads(line) for line in (run / "episodes" / name).read_text().splitlines()]
        assert records and all(math.isfinite(r["episode_return"]) for r in records)


def test_a_training_run_against_a_server_of_20_mb_observations_keeps_training(tiny_model, tmp_path):
    """After an honest first observation, every observation the server sends is 20 MB starting with U+202E: the
    run trains on prompts as bounded and clean as an in-process env's (cut to the prompt budget, counted in
    truncated_prompts), and no env error (the client cleans, it does not fail)."""
    with ServerThread(make_app(HOSTILE_ID, max_sessions=16, mode="huge_steps")) as server:
        cmd = [sys.executable, str(ROOT / "algos" / "grpo.py"), "--model-path", tiny_model, "--output-dir",
               str(tmp_path / "runs"), "--run-name", "r", "--env-id", HOSTILE_ID, "--env-servers", server.url,
               "--eval-split", "test", "--num-groups", "1", "--group-size", "2", "--max-turns", "2",
               "--max-response-tokens", "4", "--eval-every", "0",
               "--torch-threads", "1", "--num-iterations", "1", "--log-episodes", "2"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
               "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "r"
    (metrics,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics["rollout/env_errors"] == 0 and metrics["actor/skipped_updates"] == 0
    assert metrics["rollout/truncated_prompts"] > 0
    text = (run / "episodes" / "train_000001.jsonl").read_text()
    assert "\u202e" not in text and len(text) < 40 * MAX_OBSERVATION_CHARS
