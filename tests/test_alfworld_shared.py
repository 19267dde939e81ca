"""One loaded ALFWorld game per process: the envs of a group share the parse, the translation and one fast_downward
library, and play exactly as TextWorld's stock ``PddlEnv`` (one translation and one library copy per env)."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("alfworld", reason="ALFWorld needs the [alfworld] extra")

import fast_downward  # noqa: E402
from fast_downward.interface import DOWNWARD_LIB_PATH  # noqa: E402

from arena_envs.alfworld_env import ALFWorldEnv  # noqa: E402
from arena_envs.alfworld_env import shared as shared_mod  # noqa: E402
from arena_envs.pool import EnvPool  # noqa: E402


def stock_engine(expert: bool):
    """The engine before sharing: TextWorld's own ``PddlEnv`` under ALFWorld's wrappers."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.envs.pddl import PddlEnv

    class StockPddlEnv(PddlEnv):
        def replan(self):  # what engine.planner_plan called on it
            return self._pddl_state.replan(self._entity_infos)

    infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=expert, extras=["gamefile"])
    return AlfredInfos(AlfredDemangler(StockPddlEnv(infos), shuffle=False))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("alfworld-cache"))


#: (turn, env) pairs that ask the planner (0.7 s a replan, so a few): after other envs moved or switched games
REPLANS = {(2, 0), (4, 2), (5, 1)}


def play_interleaved(envs, seeds, turns=6):
    """Reset env k with seeds[k], then step the envs in turn, the last one every third turn only (so the others
    take turns on one loaded game, then the last one's game is loaded in between); each env plays admissible
    commands and junk text from its own seeded stream, and the planner's action at ``REPLANS``."""
    out = []
    for env, seed in zip(envs, seeds):
        out.append(env.reset(seed=seed))
    rngs = [random.Random(k) for k in range(len(envs))]
    for t in range(turns):
        for k, (env, rng) in enumerate(zip(envs, rngs)):
            if k == len(envs) - 1 and t % 3 != 2:
                continue
            if (t, k) in REPLANS:
                action = env.expert_action()
                out.append(("expert", action))
            elif rng.random() < 0.15:
                action = "dance with the fridge"
            else:
                action = rng.choice(env.admissible_actions())
            out.append(env.step(action))
    return out


def test_shared_games_play_exactly_like_the_stock_engine(cache):
    # two envs of one game (a group), then one of another, stepped in turn: state switches within a game and replays
    seeds = [3, 3, 1]
    stock = [ALFWorldEnv(split="valid_seen", cache_dir=cache, games_per_task=1) for _ in seeds]
    for env in stock:
        env._engine = stock_engine(expert=False)
    shared = [ALFWorldEnv(split="valid_seen", cache_dir=cache, games_per_task=1) for _ in seeds]
    assert stock[0].reset(seed=3)[1]["gamefile"] != stock[2].reset(seed=1)[1]["gamefile"]  # two different games
    assert play_interleaved(shared, seeds) == play_interleaved(stock, seeds)


def test_a_group_translates_its_game_once(cache, monkeypatch):
    calls = []
    translate = fast_downward.pddl2sas
    monkeypatch.setattr(fast_downward, "pddl2sas", lambda *a, **k: calls.append(1) or translate(*a, **k))
    monkeypatch.setattr(shared_mod, "_GAMES", type(shared_mod._GAMES)())  # nothing translated yet
    group = [ALFWorldEnv(split="valid_unseen", cache_dir=cache, games_per_task=1) for _ in range(4)]
    first = [env.reset(seed=7) for env in group]
    assert len(calls) == 2  # plain and optimized (replanning) translation, for the whole group
    assert all(r == first[0] for r in first)
    group[0].reset(seed=7)
    assert len(calls) == 2


def libdownward_maps(pid: int) -> set[str]:
    """Paths of the libdownward files mapped into process ``pid`` (a deleted temporary copy ends in ``(deleted)``)."""
    with open(f"/proc/{pid}/maps") as f:
        return {line.split(None, 5)[5].strip() for line in f if "libdownward" in line}


def test_one_library_per_worker_process_and_no_temporary_copy(cache):
    with EnvPool("ARL/ALFWorld-v0", 6, workers=2, split="valid_seen", cache_dir=cache, games_per_task=1) as pool:
        pool.reset_many({i: {"seed": 1 + 2 * (i // 3)} for i in range(6)})  # two groups, two games
        pool.step_many({i: "look" for i in range(6)})
        for w in range(2):
            assert libdownward_maps(pool.pid(w)) == {DOWNWARD_LIB_PATH}


def test_envs_stepped_from_threads_play_as_when_stepped_in_turn(cache):
    # an OpenEnv server steps its sessions in threads: the shared library is taken in turns (shared.LOCK)
    def play(env, seed):
        rng = random.Random(seed)
        out = [env.reset(seed=seed)]
        for _ in range(5):
            out.append(env.step(rng.choice(env.admissible_actions())))
        return out

    seeds = [3, 1, 3]
    envs = [ALFWorldEnv(split="valid_seen", cache_dir=cache, games_per_task=1) for _ in seeds]
    expected = [play(env, seed) for env, seed in zip(envs, seeds)]
    with ThreadPoolExecutor(len(envs)) as pool:
        assert list(pool.map(play, envs, seeds)) == expected
