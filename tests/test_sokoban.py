"""Sokoban: generator, solver, dynamics, rewards and rendering."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import arena_envs  # noqa: F401
from arena_envs.sokoban import SokobanEnv
from arena_envs.sokoban_gen import MOVES, generate_room, parse_layout, reverse_distances, solve

VARIANTS = {"ARL/Sokoban-v0": 300, "ARL/Sokoban-Deep-v0": 100, "ARL/Sokoban-8x8-v0": 60}


def play_expert(env: gym.Env, seed: int) -> tuple[bool, int, int, bool]:
    """(won, steps, optimal length, terminated); a win on the last allowed step is also truncated."""
    _, info = env.reset(seed=seed)
    optimal, steps = info["optimal_solution_length"], 0
    while True:
        _, _, terminated, truncated, info = env.step(env.unwrapped.expert_action())
        steps += 1
        if terminated or truncated:
            return info["won"], steps, optimal, terminated


@pytest.mark.parametrize("env_id", list(VARIANTS))
def test_expert_solves_every_room_optimally_within_the_limit(env_id):
    env = gym.make(env_id)
    limit = env.spec.max_episode_steps
    for seed in range(VARIANTS[env_id]):
        won, steps, optimal, terminated = play_expert(env, seed)
        assert won and terminated, f"{env_id} seed {seed}: expert failed"
        assert steps == optimal <= limit
        assert optimal >= env.unwrapped.min_solution_length


def test_deep_variant_needs_longer_solutions():
    def mean_optimal(env_id):
        env = gym.make(env_id)
        return np.mean([env.reset(seed=s)[1]["optimal_solution_length"] for s in range(100)])

    assert mean_optimal("ARL/Sokoban-Deep-v0") >= 7 > mean_optimal("ARL/Sokoban-v0")


def test_generator_is_deterministic_in_the_seed():
    env_a, env_b = gym.make("ARL/Sokoban-v0"), gym.make("ARL/Sokoban-v0")
    for seed in range(50):
        assert env_a.reset(seed=seed) == env_b.reset(seed=seed)
    grids = {env_a.reset(seed=s)[0] for s in range(50)}
    assert len(grids) > 40  # seeds give different rooms
    room_a = generate_room(np.random.default_rng(7), (8, 8), 2, 3, 20)
    room_b = generate_room(np.random.default_rng(7), (8, 8), 2, 3, 20)
    assert np.array_equal(room_a.fixed, room_b.fixed) and room_a.boxes == room_b.boxes
    assert room_a.player == room_b.player


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), boxes=st.integers(1, 2))
def test_reverse_play_depth_equals_optimal_forward_length(seed, boxes):
    rng = np.random.default_rng(seed)
    room = generate_room(rng, (7, 7), boxes, 1, 12)
    width = room.width
    free = frozenset(int(i) for i in np.flatnonzero(room.fixed.ravel() != 0))
    targets = tuple(int(i) for i in np.flatnonzero(room.fixed.ravel() == 2))
    dist = reverse_distances(free, targets, width, 12)
    states = list(dist)
    for k in rng.choice(len(states), size=min(10, len(states)), replace=False):
        plan = solve(free, frozenset(targets), width, states[k])
        assert plan is not None and len(plan) == dist[states[k]]


def test_impossible_difficulty_is_a_clear_error():
    with pytest.raises(ValueError):
        SokobanEnv(min_solution_length=20, max_solution_length=15)
    with pytest.raises(RuntimeError, match="min_solution_length"):
        generate_room(np.random.default_rng(0), (4, 4), 1, 14, 15, max_tries=5)


LAYOUT = """\
######
#PXO_#
#_XO_#
#____#
######"""


def fixed(**kwargs) -> SokobanEnv:
    env = SokobanEnv(render_style="compact", **kwargs)
    env.reset(seed=0, options={"layout": LAYOUT})
    return env


def test_reward_table():
    env = fixed()
    obs0 = env.reset(seed=0, options={"layout": LAYOUT})[0]
    obs, r, term, trunc, info = env.step("jump")  # invalid: no move, -0.1
    assert (obs, r, term, info["action_is_valid"]) == (obs0, pytest.approx(-0.1), False, False)
    obs, r, term, _, info = env.step("up")  # bump into the wall: valid, no move
    assert (obs, r, info["action_is_valid"]) == (obs0, pytest.approx(-0.1), True)
    obs, r, term, _, info = env.step("right")  # box onto a target
    assert r == pytest.approx(0.9) and not term and obs.splitlines()[1] == "#_P√_#"
    obs, r, term, _, info = env.step("right")  # box off the target
    assert r == pytest.approx(-1.1) and obs.splitlines()[1] == "#__SX#"
    env.reset(seed=0, options={"layout": LAYOUT})
    env.step("right")
    for a in ("left", "down", "right"):
        obs, r, term, _, info = env.step(a)
    assert term and info["won"] and r == pytest.approx(-0.1 + 1 + 10)
    assert "X" not in obs


def test_actions_are_case_and_whitespace_insensitive_and_nothing_else():
    for action in ("right", "RIGHT", "  Right\n", "\tright "):
        env = fixed()
        assert env.step(action)[4]["action_is_valid"]
    for action in ("", "r", "move right", "right right", "<action>right</action>", "→", "rightt"):
        env = fixed()
        obs0 = env._render_text()
        obs, r, *_, info = env.step(action)
        assert not info["action_is_valid"] and obs == obs0 and r == pytest.approx(-0.1)


def test_render_styles_and_symbols():
    layout = "#####\n#S√X#\n#___#\n#####"
    rows = {}
    for style in ("verl", "compact", "spaced"):
        env = SokobanEnv(render_style=style)
        rows[style] = env.reset(seed=0, options={"layout": layout})[0].split("\n")
    assert "\n".join(rows["compact"]) == layout
    assert rows["verl"][1] == " # \t S \t √ \t X \t # \t"
    assert rows["spaced"][2] == "# _ _ _ #"
    env = SokobanEnv()
    obs, _ = env.reset(seed=1)
    cells = [c.strip() for row in obs.split("\n") for c in row.split("\t") if c]
    assert set(cells) <= set("#_OX√PS") and cells.count("P") + cells.count("S") == 1
    assert env.anchor_key(obs) == obs
    assert all(sym in env.prompt_instructions() for sym in "#_OX√PS")


def test_bad_layouts_and_kwargs_are_rejected():
    for bad in ("###\n#P#", "####\n#PX#\n####", "#####\n#PXZ#\n#####", "#####\n_PXO#\n#####"):
        with pytest.raises(ValueError):
            parse_layout(bad)
    with pytest.raises(ValueError):
        SokobanEnv(render_style="fancy")
    with pytest.raises(ValueError):
        SokobanEnv(dim_room=(3, 3))


def test_expert_in_a_deadlock_still_returns_an_action():
    env = SokobanEnv()
    env.reset(seed=0, options={"layout": "#####\n#X_O#\n#P__#\n#####"})
    assert env.expert_action() in MOVES


# --- teachers (arena_envs.sokoban_teachers) -------------------------------------------------
AROUND_THE_BOX = """\
#######
#_____#
#O_PX_#
#######"""  # pushing left needs the player behind the box: a walk around it
PUSH_UP = "#####\n#_O_#\n#_X_#\n#_P_#\n#####"


def play_teacher(env: SokobanEnv, teacher: str) -> tuple[bool, list[str]]:
    moves = []
    for _ in range(10):
        action, plan = env.teacher_plan(teacher, horizon=4)
        assert len(plan) <= 4 and (not plan or plan[0] == action) and action in MOVES
        moves.append(action)
        if env.step(action)[2]:
            return True, moves
    return False, moves


def test_teachers_mistakes_are_their_blind_spots():
    env = SokobanEnv(render_style="compact")
    env.reset(seed=0, options={"layout": AROUND_THE_BOX})
    assert env.teacher_plan("optimal", 8) == ("up", ["up", "right", "right", "down", "left", "left", "left"])
    assert env.teacher_plan("greedy") == ("down", [])  # stuck: no straight step to the push position; waits
    assert play_teacher(env, "greedy") == (False, ["down"] * 10)
    env.reset(seed=0, options={"layout": AROUND_THE_BOX})
    assert play_teacher(env, "no-up-push")[0]
    env.reset(seed=0, options={"layout": PUSH_UP})
    assert env.teacher_plan("no-up-push") == ("down", [])  # the only solution pushes up: its blind spot
    assert env.teacher_plan("greedy") == ("up", ["up"]) and play_teacher(env, "greedy") == (True, ["up"])
    with pytest.raises(ValueError, match="unknown teacher"):
        env.teacher_plan("oracle")


def test_greedy_plans_are_its_future_moves_and_no_up_push_never_pushes_up():
    env = gym.make("ARL/Sokoban-Mini-v0").unwrapped
    for seed in range(40):
        env.reset(seed=seed)
        _, plan = env.teacher_plan("greedy", horizon=4)
        for move in plan:  # the greedy teacher is memoryless: its plan is what it then does
            assert env.teacher_plan("greedy", horizon=4)[0] == move
            env.step(move)
        env.reset(seed=seed)
        for _ in range(10):
            action, _ = env.teacher_plan("no-up-push")
            boxes = env._state[1]
            _, _, done, _, _ = env.step(action)
            assert action != "up" or env._state[1] == boxes
            if done:
                break


def test_imperfect_teachers_solve_part_of_the_held_out_rooms():
    env = gym.make("ARL/Sokoban-Mini-v0", split="test").unwrapped
    rate = {}
    for teacher in ("optimal", "greedy", "no-up-push"):
        wins = []
        for seed in range(60):
            env.reset(seed=seed)
            wins.append(play_teacher(env, teacher)[0])
        rate[teacher] = np.mean(wins)
    assert rate["optimal"] == 1.0 and 0.4 < rate["greedy"] < 0.85 and 0.5 < rate["no-up-push"] < 0.95
