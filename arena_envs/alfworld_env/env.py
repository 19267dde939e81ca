"""``ARL/ALFWorld-v0``: ALFWorld's text games on the real engine, synchronous and in-process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arena_envs.alfworld_env.engine import ExpertTracker, make_engine, planner_plan
from arena_envs.alfworld_env.games import SPLITS, GeneratedGames, find_data_root, official_games, task_type_names
from arena_envs.alfworld_env.generator import TASK_TYPES
from arena_envs.base import TextEnv, int_option, require_extra


class ALFWorldEnv(TextEnv):
    """ALFWorld household tasks; observations and admissible commands exactly as ALFWorld gives them.

    Games come from the official ``json_2.1.1`` data when ``data_path`` (or ``$ALFWORLD_DATA``)
    points at it, with the standard splits ``train`` / ``valid_seen`` / ``valid_unseen`` (also
    ``eval_in_distribution`` / ``eval_out_of_distribution``); otherwise from the generated splits,
    sized like the official ones (3,553 / 140 / 134 games over the six task types; train floor plans
    for ``train``/``valid_seen``, held-out floor plans for ``valid_unseen``), each game validated by
    ALFWorld's planner and cached on first use (:class:`~arena_envs.alfworld_env.games.GeneratedGames`).
    ``reset`` picks a game with ``self.np_random`` unless ``options={"game": index}`` names one.

    ``games_per_task`` keeps the first N games of each task type (as ALFWorld's ``num_train_games`` /
    ``num_eval_games`` limit a run; small N plays only games the package ships, nothing is generated).

    ``help`` is not an admissible command (ARLArena's prompt drops it); sent anyway, it is invalid.

    Any text is passed to the engine, which answers ``Nothing happens.`` to anything it cannot
    execute; ``action_is_valid`` is whether the (stripped) text is an admissible command.
    Reward is ``success_reward`` on the winning step (ARLArena: ``10 * won``), else 0.

    ``expert="planner"``: ALFWorld's planner expert, computed on demand (the stored walkthrough
    is used while the agent follows it). ``expert="handcoded"``: ALFWorld's handcoded expert,
    which must observe every step (costs per step and needs the engine's facts).
    """

    reset_options = ("game",)

    def __init__(self, split: str = "train", data_path: str | None = None,
                 task_types=tuple(TASK_TYPES), expert: str = "planner", success_reward: float = 10.0,
                 cache_dir: str | None = None, games_per_task: int | None = None, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        require_extra("alfworld", ("alfworld", "textworld"), "ALFWorld (ARL/ALFWorld-*)")
        if expert not in ("planner", "handcoded"):
            raise ValueError(f"expert must be 'planner' or 'handcoded', got {expert!r}")
        names = task_type_names(task_types)
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLITS)}")
        if games_per_task is not None and games_per_task < 1:
            raise ValueError(f"games_per_task must be >= 1, got {games_per_task}")
        root = find_data_root(data_path)
        if root is not None:
            self.game_files = official_games(root, split, names, games_per_task)
        else:
            self.game_files = GeneratedGames(split, names, Path(cache_dir) if cache_dir else None, games_per_task)
        if not self.game_files:
            raise FileNotFoundError(f"no ALFWorld games for split={split!r}, task_types={names}")
        self.split, self.expert_type, self.success_reward = split, expert, float(success_reward)
        self.official = root is not None
        self._engine = make_engine(expert=expert == "handcoded")
        self._tracker = ExpertTracker() if expert == "handcoded" else None
        self._loaded: str | None = None
        self._state = None
        self._plan: list[str] = []
        self._task = ""
        self.gamefile = ""

    # --- TextEnv hooks --------------------------------------------------------------
    def _reset(self, options):
        index = int_option(options, "game")
        if index is None:
            index = int(self.np_random.integers(len(self.game_files)))
        self.gamefile = self.game_files[index % len(self.game_files)]
        if self._loaded != self.gamefile:  # parsed and translated once per process (alfworld_env.shared)
            self._engine.load(self.gamefile)
            self._loaded = self.gamefile
        self._state = self._engine.reset()
        obs = self._state["feedback"]
        self._task = obs.rsplit("Your task is to: ", 1)[-1].strip().rstrip(".")
        # our generated games store the validated planner plan; official walkthroughs may contain
        # the random detours of alfworld-generate's solvability check, so those are replanned
        generated_plan = self.expert_type == "planner" and not self.official
        self._plan = list(self._engine.unwrapped.walkthrough or []) if generated_plan else []
        if self._tracker is not None:
            self._tracker.reset(self.gamefile, self._state, seed=int(self.np_random.integers(2**31)))
        return obs, self._info(valid=True)

    def _step(self, action: str):
        command = action.strip()
        valid = command in self.admissible_actions()
        self._state, _, done = self._engine.step(action)
        if self._tracker is not None:
            self._tracker.update(self._state, action)
        self._plan = self._plan[1:] if (self._plan and self._plan[0] == command) else []
        won = bool(self._state["won"])
        return self._state["feedback"], self.success_reward * won, bool(done), False, self._info(valid)

    def _info(self, valid: bool) -> dict[str, Any]:
        return {"won": bool(self._state["won"]), "action_is_valid": valid, "gamefile": self.gamefile}

    def task_description(self) -> str:
        return self._task

    def admissible_actions(self) -> list[str] | None:
        if self._state is None:
            return None
        return [c for c in self._state["admissible_commands"] if c != "help"]

    def expert_action(self) -> str:
        if self._state is None:
            raise RuntimeError("call reset() before expert_action()")
        if self._tracker is not None:
            return self._tracker.next_action
        if not self._plan:
            self._plan = planner_plan(self._engine)
        return self._plan[0] if self._plan else "look"
