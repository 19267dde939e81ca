"""ALFWorld on the real engine: contract, determinism, experts, generated and official data."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re

import pytest

pytest.importorskip("alfworld", reason="ALFWorld needs the [alfworld] extra")

import gymnasium as gym  # noqa: E402
from gymnasium.utils.env_checker import check_env  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import arena_envs  # noqa: E402,F401
from arena_envs.alfworld_env import ALFWorldEnv  # noqa: E402
from arena_envs.alfworld_env.build import build_game  # noqa: E402
from arena_envs.alfworld_env.games import OFFICIAL_SIZES, GeneratedGames, read_committed, write_trial  # noqa: E402
from arena_envs.alfworld_env.generator import TASK_TYPES, floor_plans, generate, load_scene  # noqa: E402
from arena_envs.alfworld_env.slots import validate_bounded  # noqa: E402

MAX_STEPS = 50

#: The full expert validation takes minutes; run it with ARENA_FULL_VALIDATION=1.
FULL_VALIDATION = pytest.mark.skipif(not os.environ.get("ARENA_FULL_VALIDATION"),
                                     reason="set ARENA_FULL_VALIDATION=1 for the full expert validation")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("alfworld-cache"))


@pytest.fixture(scope="module")
def env(cache):
    e = ALFWorldEnv(split="valid_seen", cache_dir=cache, games_per_task=1)  # committed games only
    yield e
    e.close()


def first_game_per_task(env):
    """Index of the first game (slot 0, committed for every split) of each task type of a generated split."""
    seen = {}
    for i in range(len(env.game_files)):
        seen.setdefault(env.game_files.task_type(i), i)
    return seen


def committed_indices(games: GeneratedGames) -> list[int]:
    return [i for i, slot in enumerate(games.slots) if slot in games.committed()]


def play_expert(env, index, first_action=None):
    obs, info = env.reset(seed=0, options={"game": index})
    assert not info["won"], "goal already true at the start"
    if first_action is not None:
        env.step(first_action)
    for t in range(MAX_STEPS):
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
        assert info["action_is_valid"]
        if terminated:
            assert info["won"] and reward == 10.0
            return t + 1
    pytest.fail(f"expert did not win {env.gamefile} in {MAX_STEPS} steps")


def test_check_env(env):
    check_env(env, skip_render_check=True)


def test_registered_ids_make_real_games():
    for env_id in ("ARL/ALFWorld-v0", "ARL/ALFWorld-Unseen-v0"):
        e = gym.make(env_id)
        assert e.spec.max_episode_steps == MAX_STEPS
        obs, info = e.reset(seed=3, options={"game": 0})
        assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
        assert f"Your task is to: {info['task']}." in obs
        assert "look" in info["admissible_actions"] and any(a.startswith("go to ") for a in info["admissible_actions"])
        e.close()


def test_generated_splits_are_sized_like_the_official_ones():
    sizes = {split: len(ALFWorldEnv(split=split).game_files) for split in OFFICIAL_SIZES}
    assert sizes == {"train": 3553, "valid_seen": 140, "valid_unseen": 134}
    assert len(ALFWorldEnv(split="train", games_per_task=2).game_files) == 12
    unseen = ALFWorldEnv(split="valid_unseen", task_types=[2, 6]).game_files
    assert len(unseen) == 18 + 17 and {unseen.task_type(i) for i in range(len(unseen))} == {
        "look_at_obj_in_light", "pick_two_obj_and_place"}


def test_committed_records_fill_their_slots_and_keep_splits_apart():
    """valid_seen and valid_unseen are shipped in full, train's first slots of every task type; train and
    valid_seen share floor plans but never a game (disjoint seed ranges), valid_unseen uses only held-out floor
    plans."""
    scenes, seeds = {}, {}
    for split in ("train", "valid_seen", "valid_unseen"):
        recs = read_committed(split)
        slots = {tuple(r["slot"]) for r in recs}
        assert len(slots) == len(recs)
        for task_type, n in OFFICIAL_SIZES[split].items():
            ks = sorted(k for t, k in slots if t == task_type)
            assert ks == list(range(len(ks))) and 1 <= len(ks) <= n  # a prefix, never empty
            assert split == "train" or len(ks) == n
        assert all(r["traj_data"]["task_type"] == r["slot"][0] for r in recs)
        assert all(0 < len(r["walkthrough"]) <= MAX_STEPS for r in recs)
        scenes[split] = {r["traj_data"]["scene"]["scene_num"] for r in recs}
        seeds[split] = {r["traj_data"]["scene"]["random_seed"] for r in recs}
    assert scenes["train"] | scenes["valid_seen"] <= set(floor_plans("train"))
    assert scenes["valid_unseen"] <= set(floor_plans("unseen"))
    assert not set(floor_plans("train")) & set(floor_plans("unseen"))
    assert max(seeds["train"]) < min(seeds["valid_seen"]) <= max(seeds["valid_seen"]) < min(seeds["valid_unseen"])
    problems = [r["problem"] for s in ("train", "valid_seen") for r in read_committed(s)]
    assert len(set(problems)) == len(problems), "valid_seen repeats a train game"


def test_scenes_hold_every_object_type_of_the_floor_plan():
    """ALFRED's scene initialisation, not a capped subset: every object type of the floor plan that a receptacle
    can hold, 1-3 instances each (the target 1-4)."""
    import alfworld.gen.constants as c

    from arena_envs.alfworld_env.generator import _holders

    sizes = []
    for rec in read_committed("valid_seen"):
        scene = load_scene(rec["traj_data"]["scene"]["scene_num"])
        types = re.findall(r"\(objectType [^?\s]\S* (\w+)Type\)", rec["problem"])  # not the goal's ?o
        counts = {t: types.count(t) for t in set(types)}
        target = rec["traj_data"]["pddl_params"]["object_target"]
        lamps = c.VAL_ACTION_OBJECTS["Toggleable"]
        assert {t for t in scene.object_types if t not in lamps and _holders(scene, t)} <= set(counts)
        assert all(1 <= n <= c.MAX_NUM_OF_OBJ_INSTANCES for t, n in counts.items() if t != target)
        assert 1 <= counts[target] <= c.PICKUP_REPEAT_MAX
        sizes.append(len(types))
    assert sum(sizes) / len(sizes) > 15  # the previous generator: at most 3 distractor types, about 6 objects


def test_uncommitted_slot_is_generated_validated_and_cached(tmp_path):
    games = GeneratedGames("train", ["pick_and_place_simple"], tmp_path)
    k = sum(t == "pick_and_place_simple" for t, _ in games.committed())  # the first slot not in the package
    path = games[k]
    rec = build_game("train", "pick_and_place_simple", k)
    with open(path) as f:
        game = json.load(f)
    assert game["pddl_problem"] == rec["problem"] and game["walkthrough"] == rec["walkthrough"] and game["solvable"]
    mtime = os.path.getmtime(path)
    assert GeneratedGames("train", ["pick_and_place_simple"], tmp_path)[k] == path and os.path.getmtime(path) == mtime


def _plan_in_a_daemon(path, queue):
    try:
        queue.put(validate_bounded(path, timeout_s=240))
    except Exception as error:  # multiprocessing's "daemonic processes are not allowed to have children"
        queue.put(repr(error))


def test_a_game_is_validated_inside_a_daemonic_env_worker(tmp_path):
    """Env workers are daemonic processes, where an uncached game of a rollout gets generated: the planner's bounded
    check must run there (multiprocessing refuses a daemon's children), and a check out of time is None."""
    path = str(GeneratedGames("train", ["pick_and_place_simple"], tmp_path)[0])
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    worker = ctx.Process(target=_plan_in_a_daemon, args=(path, queue), daemon=True)
    worker.start()
    plan = queue.get(timeout=300)
    worker.join()
    with open(path) as f:
        assert plan and plan == json.load(f)["walkthrough"]
    assert validate_bounded(path, timeout_s=0.01) is None


def test_help_is_not_admissible(env):
    _, info = env.reset(seed=0)
    assert "help" not in info["admissible_actions"] and "look" in info["admissible_actions"]
    obs, _, _, _, info = env.step("help")
    assert not info["action_is_valid"] and "help" not in info["admissible_actions"]


@pytest.mark.parametrize("split", ["train", "valid_unseen"])
def test_expert_wins_one_game_per_task_type(split, cache):
    e = ALFWorldEnv(split=split, cache_dir=cache)
    per_task = first_game_per_task(e)
    assert set(per_task) == set(TASK_TYPES.values())
    for index in per_task.values():
        play_expert(e, index)


def test_planner_replans_after_the_agent_deviates(env):
    index = first_game_per_task(env)["pick_heat_then_place_in_recep"]
    obs, info = env.reset(seed=0, options={"game": index})
    detour = next(a for a in info["admissible_actions"] if a.startswith("go to ") and a != env.expert_action())
    assert play_expert(env, index, first_action=detour) >= 1


@FULL_VALIDATION
@pytest.mark.parametrize("split", ["train", "valid_seen", "valid_unseen"])
def test_expert_wins_every_committed_game(split, cache):
    e = ALFWorldEnv(split=split, cache_dir=cache)
    for index in committed_indices(e.game_files):
        play_expert(e, index)


def test_handcoded_expert_follows_the_episode(cache):
    e = ALFWorldEnv(split="train", task_types=[1], expert="handcoded", cache_dir=cache)
    obs, info = e.reset(seed=1, options={"game": 0})
    for _ in range(MAX_STEPS):
        action = e.expert_action()
        assert action in info["admissible_actions"]
        obs, reward, terminated, truncated, info = e.step(action)
        if terminated:
            break
    assert info["won"]


def trace(env, seed, n=6):
    obs, info = env.reset(seed=seed)
    out = [obs, info["task"], info["gamefile"]]
    for t in range(n):
        acts = env.admissible_actions()
        action = env.expert_action() if t % 2 else acts[int(env.np_random.integers(len(acts)))]
        obs, r, term, trunc, info = env.step(action)
        out += [action, obs, r, term, info["won"], info["admissible_actions"]]
    return out


def test_seeded_runs_are_identical(cache):
    a = ALFWorldEnv(split="valid_unseen", cache_dir=cache, games_per_task=1)
    b = ALFWorldEnv(split="valid_unseen", cache_dir=cache, games_per_task=1)
    assert trace(a, 11) == trace(b, 11)


def test_generator_is_deterministic_and_never_starts_in_a_goal_state(tmp_path, env):
    engine = env._engine
    for i, task_type in enumerate(TASK_TYPES.values()):
        scene = [1, 201, 1, 1, 1, 301][i]
        game = generate(scene, task_type, seed=5)
        assert game == generate(scene, task_type, seed=5)
        problem, traj = game
        assert traj["task_type"] == task_type and not traj["pddl_params"]["object_sliced"]
        path = write_trial(tmp_path / task_type, problem, traj, None)
        engine.load(str(path))
        state = engine.reset()
        assert not state["won"]
        assert traj["scene"]["floor_plan"] == f"FloorPlan{scene}"
    env._loaded = None  # the shared engine now holds another game


def test_scene_without_the_needed_appliance_yields_no_game():
    bathroom = next(n for n in floor_plans("train") if n > 400 and "Microwave" not in load_scene(n).receptacle_types)
    assert generate(bathroom, "pick_heat_then_place_in_recep", seed=0) is None


def test_invalid_actions_are_engine_no_ops(env):
    obs, info = env.reset(seed=2)
    before = (env.admissible_actions(), env.expert_action())
    for action in ["", "   ", "GO TO FRIDGE 1", "open the pod bay doors", "x" * 10_000]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs == "Nothing happens." and not info["action_is_valid"] and reward == 0.0 and not terminated
    assert (env.admissible_actions(), env.expert_action()) == before
    obs, reward, terminated, truncated, info = env.step("  " + before[1] + " \n")
    assert info["action_is_valid"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_arbitrary_text_never_raises(env, text):
    if env._state is None:
        env.reset(seed=0)
    admissible = env.admissible_actions()
    obs, reward, terminated, truncated, info = env.step(text)
    assert isinstance(obs, str) and isinstance(reward, float)
    assert info["action_is_valid"] == (text.strip() in admissible)
    if not info["action_is_valid"]:
        assert obs == "Nothing happens." and env.admissible_actions() == admissible
    if terminated:
        env.reset(seed=0)


# --- official data layout -------------------------------------------------------------
@pytest.fixture(scope="module")
def official_root(tmp_path_factory):
    """A tiny ``json_2.1.1`` tree in the official layout, written from committed games."""
    root = tmp_path_factory.mktemp("alfworld-data") / "json_2.1.1"
    for split, source in (("train", "train"), ("valid_seen", "valid_seen"), ("valid_unseen", "valid_unseen")):
        recs = read_committed(source)
        for rec in [recs[0], recs[-1]]:
            td = rec["traj_data"]
            task_dir = f"{td['task_type']}-{td['pddl_params']['object_target']}-None-{td['scene']['scene_num']}"
            write_trial(root / split / task_dir / td["task_id"], rec["problem"], td, rec["walkthrough"])
    # games AlfredTWEnv skips: movable-receptacle and sliced trials, unsolvable games
    rec = read_committed("train")[1]
    for name in ("pick_and_place_with_movable_recep-X", "pick_and_place_simple-AppleSliced-X"):
        write_trial(root / "train" / name / "trial_x", rec["problem"], rec["traj_data"], rec["walkthrough"])
    write_trial(root / "train" / "unsolvable" / "trial_u", rec["problem"], rec["traj_data"], None)
    return root


def test_official_layout_selects_games_like_alfredtwenv(official_root):
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    config = {"env": {"goal_desc_human_anns_prob": 0, "task_types": list(TASK_TYPES)},
              "dataset": {"data_path": str(official_root / "train"),
                          "eval_id_data_path": str(official_root / "valid_seen"),
                          "eval_ood_data_path": str(official_root / "valid_unseen"),
                          "num_train_games": -1, "num_eval_games": -1}}
    for split, train_eval in (("train", "train"), ("valid_seen", "eval_in_distribution"),
                              ("valid_unseen", "eval_out_of_distribution")):
        ours = ALFWorldEnv(split=split, data_path=str(official_root.parent))
        theirs = AlfredTWEnv(config, train_eval=train_eval)
        assert ours.official and ours.game_files == sorted(theirs.game_files)
        assert len(ours.game_files) == 2
        first = ALFWorldEnv(split=split, data_path=str(official_root.parent), games_per_task=1).game_files
        types = [json.loads(open(os.path.join(os.path.dirname(f), "traj_data.json")).read())["task_type"]
                 for f in ours.game_files]
        assert set(first) <= set(ours.game_files) and len(first) == len(set(types))  # one game per task type


def test_official_data_from_environment_variable(official_root, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(official_root.parent))
    e = ALFWorldEnv(split="eval_out_of_distribution")
    assert e.official and all("/valid_unseen/" in f for f in e.game_files)
    play_expert(e, 0)


def test_bad_arguments_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError):
        ALFWorldEnv(data_path=str(tmp_path))
    with pytest.raises(ValueError):
        ALFWorldEnv(split="test")
    with pytest.raises(ValueError):
        ALFWorldEnv(task_types=[9])
    with pytest.raises(ValueError):
        ALFWorldEnv(expert="oracle")
    with pytest.raises(ValueError, match="games_per_task"):
        ALFWorldEnv(games_per_task=0)


def _write_same_trial(args) -> str:
    folder, rec, times = args
    for _ in range(times):
        write_trial(folder, rec["problem"], rec["traj_data"], rec["walkthrough"])
    return (folder / "game.tw-pddl").read_text()


def test_processes_writing_the_same_game_at_once_never_collide(tmp_path):
    """Env workers and test workers fill one cache side by side: each writer stages its files under its own
    name, so none loses its file to another's rename, and every file ends whole."""
    import multiprocessing

    rec = read_committed("valid_seen")[0]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        games = pool.map(_write_same_trial, [(tmp_path / "trial", rec, 150)] * 4)
    assert all(json.loads(g)["walkthrough"] == rec["walkthrough"] for g in games)
    assert json.loads((tmp_path / "trial" / "traj_data.json").read_text()) == rec["traj_data"]
    assert sorted(p.name for p in (tmp_path / "trial").iterdir()) == ["game.tw-pddl", "initial_state.pddl",
                                                                     "traj_data.json"]
