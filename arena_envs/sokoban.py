"""Text Sokoban (``ARL/Sokoban-v0`` and variants), dynamics and rewards of gym-sokoban.

Rooms come from :mod:`arena_envs.sokoban_gen` (reverse play, seeded only from
``self.np_random``); each room's optimal solution length is known and bounded by the
step limit, and :meth:`SokobanEnv.expert_action` follows an optimal BFS plan. Imperfect teachers
(:mod:`arena_envs.sokoban_teachers`, for behaviour-cloning data like real SFT data) are
:meth:`SokobanEnv.teacher_plan`.

Rewards per step: −0.1, +1 per box pushed onto a target, −1 per box pushed off one,
+10 when every box is on a target (the episode then terminates). An action other than
``up/down/left/right`` (case-insensitive, surrounding whitespace ignored) is invalid:
no move, reward −0.1, ``action_is_valid=False``. Walking into a wall is a valid
action that does not move (as in gym-sokoban).

Splits (``split="train"`` / ``"test"`` / ``"all"``): rooms are assigned to a split by a hash of
their layout (:mod:`arena_envs.splits`, one room in ten is ``test``), so held-out rooms never
appear in training whatever the seeds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from arena_envs.base import TextEnv
from arena_envs.sokoban_gen import MOVES, TARGET, WALL, Room, State, generate_room, parse_layout, solve, step_state
from arena_envs.sokoban_teachers import teacher_plan, wait_action
from arena_envs.splits import check_split, draw_in_split

ACTIONS = list(MOVES)  # ["up", "down", "left", "right"]

# Cell codes at render time (gym-sokoban): 0 wall, 1 floor, 2 target, 3 box on target,
# 4 box, 5 player, 6 player on target.
_SYMBOLS = ("#", "_", "O", "√", "X", "P", "S")

#: Render conventions. "verl": verl-agent/ARLArena `tiny_rgb_array` text (each symbol
#: space-padded and tab-terminated); "compact": RAGEN (one character per cell);
#: "spaced": cells separated by single spaces (one BPE token per cell for tiny models).
RENDER_STYLES = {
    "verl": lambda row: "".join(f" {s} \t" for s in row),
    "compact": lambda row: "".join(row),
    "spaced": lambda row: " ".join(row),
}

#: Longest ``layout`` reset option (characters): a 30x30 room; the solver's work grows with the room.
MAX_LAYOUT_CHARS = 30 * 31
STEP_REWARD, BOX_ON_REWARD, BOX_OFF_REWARD, SOLVED_REWARD = -0.1, 1.0, -1.0, 10.0

_INSTRUCTIONS = """Sokoban symbols: # wall, _ floor, O target, X box, P player, √ box on a target, S player on a target.
Goal: push every box onto a target; the puzzle is solved when no X is left.
Rules: each action (up, down, left, right) moves the player one cell. Walking into a box pushes it one cell \
if the cell behind it is free. Boxes cannot be pulled, and a box cannot be pushed into a wall or another box, \
so avoid pushing boxes into corners or along walls away from the targets."""


def room_key(room: Room) -> str:
    """The room's identity (walls, targets, boxes, player): equal keys are the same puzzle."""
    return f"{room.fixed.shape}|{room.fixed.tobytes().hex()}|{room.player}|{room.boxes}"


class SokobanEnv(TextEnv):
    """One Sokoban puzzle per episode; the observation is the rendered grid.

    Args:
        dim_room: (height, width) including the outer wall ring.
        num_boxes: number of boxes (= targets).
        search_depth: depth of the reverse-play search; caps the optimal solution length.
        min_solution_length: reject rooms solvable in fewer moves (difficulty knob).
        max_solution_length: reject rooms needing more moves (capped by ``search_depth``).
            Keep it <= the episode's step limit so every room is solvable in time; the
            default 15 is ARLArena's limit and each registered id sets it to its own.
        render_style: "verl" (default, ARLArena's exact text), "compact" or "spaced".
        split: "train", "test" (held-out rooms, by layout hash) or "all".
    """

    reset_options = ("layout",)

    def __init__(self, dim_room: tuple[int, int] = (6, 6), num_boxes: int = 1, search_depth: int = 30,
                 min_solution_length: int = 1, max_solution_length: int = 15,
                 render_style: str = "verl", split: str = "train", render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        self.split = check_split(split)
        height, width = (int(x) for x in dim_room)
        if height < 3 or width < 3 or (height - 2) * (width - 2) < num_boxes + 2:
            raise ValueError(f"dim_room={dim_room} too small for {num_boxes} box(es)")
        if num_boxes < 1:
            raise ValueError(f"num_boxes must be >= 1, got {num_boxes}")
        if render_style not in RENDER_STYLES:
            raise ValueError(f"render_style must be one of {sorted(RENDER_STYLES)}, got {render_style!r}")
        self.dim_room = (height, width)
        self.num_boxes = int(num_boxes)
        self.search_depth = int(search_depth)
        self.min_solution_length = int(min_solution_length)
        self.max_solution_length = min(int(max_solution_length), self.search_depth)
        if not 1 <= self.min_solution_length <= self.max_solution_length:
            raise ValueError(f"need 1 <= min_solution_length <= max_solution_length (capped by search_depth), got "
                             f"{min_solution_length}, {max_solution_length}, search_depth={search_depth}")
        self.render_style = render_style
        self._room: Room | None = None
        self._state: State = (0, ())
        self._plan: list[str] = []
        self._plan_state: State | None = None

    # --- episode -------------------------------------------------------------------
    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """``options={"layout": "<compact grid>"}`` plays a fixed puzzle instead of a generated one."""
        layout = options.get("layout")
        if layout is not None:
            if not isinstance(layout, str):
                raise TypeError(f"reset option 'layout' must be a str (a compact grid), got {type(layout).__name__}")
            if len(layout) > MAX_LAYOUT_CHARS:
                raise ValueError(f"reset option 'layout' is longer than {MAX_LAYOUT_CHARS} characters")
            try:
                self._room = parse_layout(layout)
            except ValueError as err:
                raise ValueError(f"reset option 'layout': {err}") from None
        else:
            self._room = draw_in_split(self.np_random, self.split, self._generate, room_key)
        self._free = frozenset(int(i) for i in np.flatnonzero(self._room.fixed.ravel() != WALL))
        self._targets = frozenset(int(i) for i in np.flatnonzero(self._room.fixed.ravel() == TARGET))
        self._state = (self._room.player, self._room.boxes)
        self._plan, self._plan_state = [], None
        return self._render_text(), {"won": False, "optimal_solution_length": self._room.solution_length}

    def _step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        move = action.strip().lower()
        if move not in MOVES:
            return self._render_text(), STEP_REWARD, False, False, {"won": self._solved(), "action_is_valid": False}
        before = self._boxes_on_target()
        self._state, _ = step_state(self._free, self._room.width, self._state, move)
        after = self._boxes_on_target()
        reward = STEP_REWARD + BOX_ON_REWARD * max(after - before, 0) + BOX_OFF_REWARD * max(before - after, 0)
        won = after == len(self._state[1])
        if won:
            reward += SOLVED_REWARD
        return self._render_text(), reward, won, False, {"won": won, "action_is_valid": True}

    # --- helpers -------------------------------------------------------------------
    def _generate(self, rng: np.random.Generator) -> Room:
        return generate_room(rng, self.dim_room, self.num_boxes, self.min_solution_length, self.max_solution_length)

    def _boxes_on_target(self) -> int:
        return sum(b in self._targets for b in self._state[1])

    def _solved(self) -> bool:
        return self._room is not None and self._boxes_on_target() == len(self._state[1])

    def _grid_codes(self) -> np.ndarray:
        codes = self._room.fixed.astype(np.int8).ravel().copy()
        player, boxes = self._state
        for b in boxes:
            codes[b] = 3 if codes[b] == TARGET else 4
        codes[player] = 6 if codes[player] == TARGET else 5
        return codes.reshape(self._room.fixed.shape)

    def _render_text(self) -> str:
        fmt = RENDER_STYLES[self.render_style]
        return "\n".join(fmt([_SYMBOLS[c] for c in row]) for row in self._grid_codes())

    # --- TextEnv API ---------------------------------------------------------------
    def task_description(self) -> str:
        return "Push every box (X) onto a target (O)."

    def admissible_actions(self) -> list[str]:
        return list(ACTIONS)

    def expert_action(self) -> str:
        """Next move of an optimal plan (BFS); "up" if the state is unsolvable (deadlock)."""
        if self._room is None:
            return ACTIONS[0]
        if self._plan_state != self._state or not self._plan:
            self._plan = solve(self._free, self._targets, self._room.width, self._state) or []
            self._plan_state = self._state
        if not self._plan:
            return ACTIONS[0]
        action = self._plan.pop(0)
        self._plan_state = step_state(self._free, self._room.width, self._state, action)[0]
        return action

    def teacher_plan(self, teacher: str, horizon: int = 4) -> tuple[str, list[str]]:
        """(next action, the first ``horizon`` moves of its plan) of a teacher of
        :mod:`arena_envs.sokoban_teachers`; a stuck teacher's plan is empty and its action a wall bump."""
        if self._room is None:
            return ACTIONS[0], []
        plan = teacher_plan(teacher, self._free, self._targets, self._room.width, self._state, max(horizon, 1))
        action = plan[0] if plan else wait_action(self._free, self._room.width, self._state)
        return action, plan[:horizon]

    def anchor_key(self, obs: str) -> str:
        """The grid text itself: identical grids are identical states."""
        return obs

    def prompt_instructions(self) -> str:
        return _INSTRUCTIONS
