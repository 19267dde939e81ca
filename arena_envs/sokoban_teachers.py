"""Sokoban teachers: policies that write a plan of their next moves, some with systematic mistakes.

Real SFT data comes from an imperfect source, so behaviour cloning converges to that source and only RL can
go past it. Each teacher maps a state to its plan (its next moves, first move = its action; ``[]`` when it
is solved or stuck) and is deterministic, so imitation reproduces its mistakes instead of averaging them away:

- ``optimal``: the BFS solver's shortest plan (the env's expert).
- ``greedy``: a heuristic without lookahead — pick the push that most reduces a box's Manhattan distance to
  its nearest target (ties: the nearer push position, then ``up, down, left, right``) and step straight
  towards its push position. It never walks around a wall or a box, pushes boxes into corners and cannot
  take a box around an obstacle.
- ``no-up-push``: the optimal planner with a blind spot — it never pushes a box upwards, so a room whose
  every solution needs an upward push is beyond it.

A stuck teacher (no plan) bumps into a wall, a no-op: it waits, as an agent with no idea would.
"""

from __future__ import annotations

from collections import deque

from arena_envs.sokoban_gen import MAX_BFS_STATES, MOVES, State, step_state

TEACHERS = ("optimal", "greedy", "no-up-push")


def _solved(state: State, targets: frozenset[int]) -> bool:
    return set(state[1]) <= targets


def _bfs_plan(free: frozenset[int], targets: frozenset[int], width: int, state: State,
              allowed) -> list[str] | None:
    """Shortest plan over (player, boxes) using only the moves ``allowed(state, action, pushed)`` accepts."""
    if _solved(state, targets):
        return []
    parent: dict[State, tuple[State, str] | None] = {state: None}
    queue = deque([state])
    while queue and len(parent) <= MAX_BFS_STATES:
        s = queue.popleft()
        for action in MOVES:
            t, pushed = step_state(free, width, s, action)
            if t in parent or not allowed(action, pushed):
                continue
            parent[t] = (s, action)
            if _solved(t, targets):
                plan, node = [], t
                while parent[node] is not None:
                    node, a = parent[node]  # type: ignore[misc]
                    plan.append(a)
                return plan[::-1]
            queue.append(t)
    return None


def _manhattan(a: int, b: int, width: int) -> int:
    return abs(a // width - b // width) + abs(a % width - b % width)


def _greedy_move(free: frozenset[int], targets: frozenset[int], width: int, state: State) -> str | None:
    """The greedy teacher's next move, or None when it is stuck (no improving push, or its walk is blocked)."""
    player, boxes = state
    best: tuple[int, int, int, int, str] | None = None
    for order, (action, (dr, dc)) in enumerate(MOVES.items()):
        d = dr * width + dc
        for box in boxes:
            if box in targets and len(boxes) > 1:
                continue  # a placed box stays (with one box, the room is solved anyway)
            behind, beyond = box - d, box + d
            if beyond not in free or beyond in boxes or behind not in free or behind in boxes:
                continue
            gain = (min(_manhattan(beyond, t, width) for t in targets)
                    - min(_manhattan(box, t, width) for t in targets))
            key = (gain, _manhattan(player, behind, width), order, behind, action)
            if gain < 0 and (best is None or key[:3] < best[:3]):
                best = key
    if best is None:
        return None
    behind, push = best[3], best[4]
    if player == behind:
        return push
    for action, (dr, dc) in MOVES.items():  # one step that gets closer, never around an obstacle
        nxt = player + dr * width + dc
        if nxt in free and nxt not in boxes and _manhattan(nxt, behind, width) < _manhattan(player, behind, width):
            return action
    return None


def _greedy_plan(free: frozenset[int], targets: frozenset[int], width: int, state: State,
                 horizon: int) -> list[str]:
    plan: list[str] = []
    while len(plan) < horizon and not _solved(state, targets):
        action = _greedy_move(free, targets, width, state)
        if action is None:
            break
        plan.append(action)
        state = step_state(free, width, state, action)[0]
    return plan


def _no_up_push(action: str, pushed: int | None) -> bool:
    return not (action == "up" and pushed is not None)


def teacher_plan(name: str, free: frozenset[int], targets: frozenset[int], width: int, state: State,
                 horizon: int = 64) -> list[str]:
    """The first ``horizon`` moves ``name`` plans from ``state`` ([] when solved or stuck)."""
    if name == "optimal":
        plan = _bfs_plan(free, targets, width, state, lambda a, p: True)
    elif name == "no-up-push":
        plan = _bfs_plan(free, targets, width, state, _no_up_push)
    elif name == "greedy":
        plan = _greedy_plan(free, targets, width, state, horizon)
    else:
        raise ValueError(f"unknown teacher {name!r}; choose from {TEACHERS}")
    return (plan or [])[:horizon]


def wait_action(free: frozenset[int], width: int, state: State) -> str:
    """A move into a wall (no effect) for a stuck teacher; a move that pushes nothing if no wall is adjacent."""
    player, boxes = state
    for action, (dr, dc) in MOVES.items():
        if player + dr * width + dc not in free:
            return action
    for action in MOVES:
        if step_state(free, width, state, action)[1] is None:
            return action
    return next(iter(MOVES))
