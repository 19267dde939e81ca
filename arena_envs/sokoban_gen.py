"""Sokoban room generation by reverse play, and an optimal BFS solver.

Cells are flat indices ``r * width + c``. The outer ring of every room is wall, so
a move by ``±1`` / ``±width`` from a free cell never wraps around a row edge.

Generation (all randomness from the caller's ``numpy.random.Generator``):

1. carve a random-walk topology into a wall-filled room;
2. put the boxes on randomly chosen targets (the solved state);
3. *reverse play*: breadth-first search over "pull" moves from every solved state.
   A pull is the exact inverse of a push, so the BFS depth of a state is its
   **optimal forward solution length** — no heuristic "difficulty score" needed;
4. pick uniformly among the states whose optimal length lies in the requested
   range. Difficulty is therefore controlled directly by ``min_solution_length``,
   and every room is solvable within ``max_solution_length`` by construction (the
   env still re-checks this with the forward solver).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

WALL, FLOOR, TARGET = 0, 1, 2

#: Action name -> (dr, dc), in gym-sokoban / verl-agent order (1..4 = up, down, left, right).
MOVES: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

#: Carving masks for the random-walk topology (offsets from the walker's cell).
_MASKS = (
    ((0, 0),),
    ((0, 0), (0, 1)),
    ((0, 0), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
    ((0, 0), (0, 1), (1, 0), (1, 1)),
)

#: Upper bound on states a single BFS may visit (keeps memory bounded on huge rooms).
MAX_BFS_STATES = 1_000_000

State = tuple[int, tuple[int, ...]]  # (player cell, sorted box cells)


@dataclass(frozen=True)
class Room:
    """An initial Sokoban position. ``fixed`` holds WALL/FLOOR/TARGET per cell."""

    fixed: np.ndarray  # (h, w) int8
    player: int
    boxes: tuple[int, ...]
    solution_length: int  # optimal number of moves

    @property
    def width(self) -> int:
        return int(self.fixed.shape[1])


def carve_topology(rng: np.random.Generator, height: int, width: int, num_steps: int | None = None,
                   p_change_direction: float = 0.35) -> np.ndarray:
    """A wall-filled (h, w) room with floor carved by a random walk (gym-sokoban style)."""
    fixed = np.full((height, width), WALL, dtype=np.int8)
    num_steps = int(1.7 * (height + width)) if num_steps is None else num_steps
    r, c = int(rng.integers(1, height - 1)), int(rng.integers(1, width - 1))
    dr, dc = list(MOVES.values())[int(rng.integers(4))]
    for _ in range(num_steps):
        for mr, mc in _MASKS[int(rng.integers(len(_MASKS)))]:
            rr, cc = r + mr, c + mc
            if 0 < rr < height - 1 and 0 < cc < width - 1:
                fixed[rr, cc] = FLOOR
        if rng.random() < p_change_direction:
            dr, dc = list(MOVES.values())[int(rng.integers(4))]
        r = min(max(r + dr, 1), height - 2)
        c = min(max(c + dc, 1), width - 2)
    return fixed


def reverse_distances(free: frozenset[int], targets: tuple[int, ...], width: int,
                      max_depth: int) -> dict[State, int]:
    """Optimal solution length of every state within ``max_depth`` moves of solved.

    Multi-source BFS from all solved states (boxes on ``targets``, player on any
    other free cell) over reverse moves: the player steps to a free empty cell and
    may pull the box directly behind it along.
    """
    goal = tuple(sorted(targets))
    dist: dict[State, int] = {(p, goal): 0 for p in sorted(free) if p not in goal}
    frontier = list(dist)
    deltas = (-width, width, -1, 1)
    for depth in range(1, max_depth + 1):
        nxt: list[State] = []
        for player, boxes in frontier:
            for d in deltas:
                q = player + d
                if q not in free or q in boxes:
                    continue
                successors = [(q, boxes)]
                behind = player - d
                if behind in boxes:
                    successors.append((q, tuple(sorted(player if b == behind else b for b in boxes))))
                for s in successors:
                    if s not in dist:
                        dist[s] = depth
                        nxt.append(s)
            if len(dist) > MAX_BFS_STATES:
                return dist
        if not nxt:
            break
        frontier = nxt
    return dist


def step_state(free: frozenset[int], width: int, state: State, action: str) -> tuple[State, int | None]:
    """Forward dynamics. Returns (new state, index of the pushed box's new cell or None)."""
    player, boxes = state
    dr, dc = MOVES[action]
    d = dr * width + dc
    q = player + d
    if q not in free:
        return state, None
    if q in boxes:
        beyond = q + d
        if beyond not in free or beyond in boxes:
            return state, None
        return (q, tuple(sorted(beyond if b == q else b for b in boxes))), beyond
    return (q, boxes), None


def solve(free: frozenset[int], targets: frozenset[int], width: int, state: State,
          max_states: int = MAX_BFS_STATES) -> list[str] | None:
    """Optimal action sequence from ``state`` (BFS over (player, boxes)); None if unsolvable.

    Also None when the search exceeds ``max_states`` (only possible for very large rooms).
    """
    if set(state[1]) <= targets:
        return []
    parent: dict[State, tuple[State, str] | None] = {state: None}
    queue = deque([state])
    while queue:
        s = queue.popleft()
        for action in MOVES:
            t, _ = step_state(free, width, s, action)
            if t in parent:
                continue
            parent[t] = (s, action)
            if set(t[1]) <= targets:
                plan = []
                node: State = t
                while parent[node] is not None:
                    node, a = parent[node]  # type: ignore[misc]
                    plan.append(a)
                return plan[::-1]
            if len(parent) > max_states:
                return None
            queue.append(t)
    return None


def parse_layout(text: str) -> Room:
    """A Room from a compact grid (``#_OX√PS`` symbols, one row per line; outer ring must be wall).

    ``solution_length`` is the optimal length, or -1 if the layout is unsolvable.
    """
    rows = [row for row in text.strip("\n").split("\n")]
    height, width = len(rows), len(rows[0]) if rows else 0
    if height < 3 or width < 3 or any(len(r) != width for r in rows):
        raise ValueError("layout must be a rectangle of at least 3x3 cells")
    fixed = np.full((height, width), WALL, dtype=np.int8)
    player, boxes = [], []
    for i, ch in enumerate("".join(rows)):
        if ch not in "#_OX√PS":
            raise ValueError(f"unknown layout symbol {ch!r}")
        fixed.flat[i] = WALL if ch == "#" else TARGET if ch in "O√S" else FLOOR
        if ch in "PS":
            player.append(i)
        if ch in "X√":
            boxes.append(i)
    border = np.ones_like(fixed, dtype=bool)
    border[1:-1, 1:-1] = False
    if (fixed[border] != WALL).any():
        raise ValueError("the outer ring of a layout must be wall")
    targets = frozenset(int(i) for i in np.flatnonzero(fixed.ravel() == TARGET))
    if len(player) != 1 or not boxes or len(boxes) != len(targets):
        raise ValueError("a layout needs exactly one player and as many boxes as targets (at least one)")
    free = frozenset(int(i) for i in np.flatnonzero(fixed.ravel() != WALL))
    state = (player[0], tuple(sorted(boxes)))
    plan = solve(free, targets, width, state)
    return Room(fixed=fixed, player=player[0], boxes=state[1], solution_length=-1 if plan is None else len(plan))


def generate_room(rng: np.random.Generator, dim_room: tuple[int, int] = (6, 6), num_boxes: int = 1,
                  min_solution_length: int = 1, max_solution_length: int = 30,
                  max_tries: int = 200) -> Room:
    """A random room whose optimal solution takes ``min..max_solution_length`` moves.

    Deterministic given ``rng``'s state: retries (topologies that admit no such
    state, or fail the forward check) draw from the same generator.
    """
    height, width = dim_room
    lo, hi = max(1, min_solution_length), max_solution_length
    if lo > hi:
        raise ValueError(f"min_solution_length={min_solution_length} > max_solution_length={hi}")
    for _ in range(max_tries):
        fixed = carve_topology(rng, height, width)
        cells = np.flatnonzero(fixed.ravel() != WALL)
        if len(cells) < num_boxes + 2:
            continue
        targets = tuple(int(x) for x in rng.choice(cells, size=num_boxes, replace=False))
        free = frozenset(int(x) for x in cells)
        dist = reverse_distances(free, targets, width, hi)
        candidates = [s for s, d in dist.items() if lo <= d <= hi]
        if not candidates:
            continue
        player, boxes = candidates[int(rng.integers(len(candidates)))]
        plan = solve(free, frozenset(targets), width, (player, boxes))
        if plan is None or not lo <= len(plan) <= hi:  # defensive: reverse BFS guarantees it
            continue
        fixed.flat[list(targets)] = TARGET
        return Room(fixed=fixed, player=player, boxes=boxes, solution_length=len(plan))
    raise RuntimeError(
        f"no {height}x{width} room with {num_boxes} box(es) and an optimal solution of "
        f"{lo}..{hi} moves found in {max_tries} tries; relax min_solution_length or enlarge the room"
    )
