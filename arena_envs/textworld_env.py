"""``ARL/TextWorld-v0``: games from TextWorld's own generators, played on TextWorld's engine.

Games are made offline with ``textworld.challenges`` (``tw-simple``, ``tw-coin_collector``,
``tw-treasure_hunter``, ``tw-cooking``) or, for ``tw-custom`` (world size, objects, quest length: the
Practitioner's Guide's custom worlds), with ``textworld.generator.make_game``, and compiled with the Inform7 tool
chain that ships in the ``textworld`` wheel. A compiled game is cached on disk under a key of (kind, options,
seed), so every later reset (in any process) only starts the interpreter.

Splits use disjoint generation-seed ranges: ``train`` game ``i`` is generated from seed
``seed_offset + i``, ``test`` game ``i`` from ``seed_offset + TEST_SEED_OFFSET + i``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from arena_envs.base import TextEnv, int_option, require_extra

#: Difficulty options per challenge (the ``tw-make <challenge>`` flags) and their defaults.
CHALLENGE_DEFAULTS: dict[str, dict[str, Any]] = {
    "tw-simple": {"rewards": "dense", "goal": "detailed", "test": False},
    "tw-coin_collector": {"level": 5},
    "tw-treasure_hunter": {"level": 5},
    "tw-cooking": {"recipe": 1, "take": 1, "go": 1, "open": False, "cook": False, "cut": False,
                   "drop": False, "recipe_seed": 0, "split": "train"},
    # ``tw-make custom``: rooms, objects (a minimum: the quest's own count too), actions of the one quest
    "tw-custom": {"world_size": 5, "nb_objects": 10, "quest_length": 5, "quest_breadth": 1},
}
#: Options of the custom worlds that ``TextWorldEnv`` takes as keyword arguments.
CUSTOM_OPTIONS = ("world_size", "nb_objects", "quest_length")
MAX_GENERATION_ATTEMPTS = 20
#: Generation seeds of the ``test`` split start here (above any ``train`` game's seed).
TEST_SEED_OFFSET = 1_000_000
SPLITS = ("train", "test")
#: Observation for any text that is not an admissible command; the engine is not touched, so
#: parser meta-commands (``restart``, ``undo``, ``quit``) can never change the game.
INVALID_FEEDBACK = "Nothing happens."
#: The interpreter's input prompt closing every observation: ``>`` padded with ~120 spaces to the status bar
#: (``-= Kitchen =-0/1``: room, score/moves), or a bare ``>``.
_PROMPT_LINE = re.compile(r"(?:\A|\n)>[ \t]*(?:-= [^\n]*? =-[0-9/]*)?[ \t]*\Z")
_BLANK_RUN = re.compile(r"\n(?:[ \t]*\n){2,}")


def clean_text(text: str) -> str:
    """TextWorld's output as the model should read it: without the title art of the first turn (the leading lines
    with no letter or digit), the padded prompt and status line that ends every turn, runs of blank lines (one
    blank line is kept) and surrounding blank space. Every other line is the game's, unchanged."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if any(ch.isalnum() for ch in line)), len(lines))
    text = _PROMPT_LINE.sub("", "\n".join(lines[start:]))
    return _BLANK_RUN.sub("\n\n", text).strip("\n").rstrip()


def default_cache_dir() -> Path:
    root = os.environ.get("ARENA_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "arlarena")
    return Path(root) / "textworld"


def game_settings(kind: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Full, validated settings for ``kind``: defaults overridden by ``options``."""
    if kind not in CHALLENGE_DEFAULTS:
        raise ValueError(f"unknown TextWorld challenge {kind!r}; expected one of {sorted(CHALLENGE_DEFAULTS)}")
    unknown = set(options or {}) - set(CHALLENGE_DEFAULTS[kind])
    if unknown:
        raise ValueError(f"unknown options for {kind}: {sorted(unknown)}")
    settings = {**CHALLENGE_DEFAULTS[kind], **(options or {})}
    if kind == "tw-custom":
        bad = {k: v for k, v in settings.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1}
        if bad:
            raise ValueError(f"tw-custom options must be positive integers, got {bad}")
    return settings


def make_custom_game(settings: dict[str, Any], options):
    """A ``tw-make custom`` game: TextWorld's own generator (``textworld.generator.make_game``) on a world of
    ``world_size`` rooms with at least ``nb_objects`` objects and one quest of ``quest_length`` actions."""
    import textworld

    options.nb_rooms = settings["world_size"]
    options.nb_objects = settings["nb_objects"]
    options.quest_length = settings["quest_length"]
    options.quest_breadth = settings["quest_breadth"]
    return textworld.generator.make_game(options)


def _attempt_seed(seed: int, attempt: int) -> int:
    """Seed of generation attempt ``attempt`` (0 = the seed itself), deterministic and distinct."""
    if attempt == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed), attempt]).generate_state(1)[0] % (2**31 - 1))


def cached_game(kind: str, options: dict[str, Any] | None, seed: int, cache_dir: str | Path | None = None) -> Path:
    """Path of the compiled game (kind, options, seed), generating and caching it if needed.

    A seed whose generation fails (e.g. ``QuestGenerationError``) retries with the next seed of
    a fixed sequence, so the same key always yields the same game.
    """
    settings = game_settings(kind, options)
    key = hashlib.sha1(json.dumps([kind, settings], sort_keys=True).encode()).hexdigest()[:12]
    folder = Path(cache_dir or default_cache_dir()) / f"{kind}-{key}"
    game_file = folder / f"seed{int(seed)}.z8"
    if game_file.exists():
        return game_file
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "settings.json").write_text(json.dumps({"kind": kind, "settings": settings}, sort_keys=True))

    import textworld
    from textworld.challenges import CHALLENGES

    make = make_custom_game if kind == "tw-custom" else CHALLENGES[kind][1]
    errors = []
    for attempt in range(MAX_GENERATION_ATTEMPTS):
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            opts = textworld.GameOptions()
            opts.seeds = _attempt_seed(seed, attempt)
            opts.path = os.path.join(tmp, "game.z8")
            opts.file_ext = ".z8"
            opts.force_recompile = True
            try:
                game = make(dict(settings), opts)
                with warnings.catch_warnings():  # compile_game replays the walkthrough on jericho
                    warnings.filterwarnings("ignore", message=".*is not fully supported.*")
                    compiled = textworld.generator.compile_game(game, opts)
                if kind == "tw-custom" and not walkthrough_wins(compiled):
                    raise RuntimeError("the walkthrough does not win (an ambiguous object name)")
            except Exception as e:  # generators raise several error types for an unlucky seed
                errors.append(f"{type(e).__name__}: {e}")
                continue
            # json first, z8 last: the z8 file's presence marks a complete cache entry
            os.replace(os.path.splitext(compiled)[0] + ".json", folder / f"seed{int(seed)}.json")
            staged = folder / f"seed{int(seed)}.z8.{os.getpid()}.tmp"  # one per writer: processes generating the
            shutil.move(compiled, str(staged))  # same game side by side never collide
            os.replace(staged, game_file)
            return game_file
    raise RuntimeError(f"{kind} seed {seed}: generation failed {MAX_GENERATION_ATTEMPTS} times: {errors[-3:]}")


def walkthrough_wins(path: str | Path) -> bool:
    """Whether the game's own walkthrough wins it on the engine. A custom world can name two objects so that
    Inform7's parser asks "Which do you mean, the locker or the type 0 locker?" and the quest cannot be done."""
    import textworld

    infos = textworld.EnvInfos(won=True, extras=["walkthrough"])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is not fully supported.*")
        env = textworld.start(str(path), request_infos=infos)
        try:
            state = env.reset()
            for command in state.get("extra.walkthrough") or []:
                state, _, done = env.step(command)
                if done:
                    break
            return bool(state["won"])
        finally:
            env.close()


def _normalize(command: str) -> str:
    # Inform7's parser ignores case and repeated blanks, so the admissible check does too
    return " ".join(command.lower().split())


class TextWorldEnv(TextEnv):
    """A TextWorld challenge as a text env.

    ``reset`` plays game ``options["game"]`` if given, else one of the split's ``num_games`` games
    drawn with ``self.np_random``; game ``i`` is generated from seed ``seed_offset + i`` (``train``)
    or ``seed_offset + TEST_SEED_OFFSET + i`` (``test``). ``options["game"]`` must be one of the ``num_games``
    (the catalogue) unless ``new_games=True`` (any index below ``TEST_SEED_OFFSET``): each new index generates
    and caches a game (seconds of CPU, hundreds of KB of disk), which a client of a served env must not be able
    to ask for at will (``integrations.openenv_server --allow-new-games`` sets it).
    Rewards: ``"dense"`` = change of TextWorld's cumulative score on every turn; ``"sparse"`` =
    the final score on the step that ends the game (won or lost), 0 before. With
    ``normalize=True`` rewards are divided by the game's max score (an episode sums to ≤ 1, as
    in the Practitioner's Guide). ``expert_action`` follows the game's walkthrough and falls
    back to TextWorld's own expert (``policy_commands``) once the agent deviates.

    ``world_size``, ``nb_objects``, ``quest_length`` (any of them) select the Practitioner's Guide's custom
    worlds (``kind="tw-custom"``, the rest from ``CHALLENGE_DEFAULTS``), generated by TextWorld's own generator.

    Observations are :func:`clean_text` of TextWorld's output (no title art, no padded status line: the first
    observations of the registered ids are 600-1,200 characters instead of 2,000-2,600); ``raw_text=True`` returns
    TextWorld's text exactly as it prints it.
    """

    reset_options = ("game",)

    def __init__(self, kind: str = "tw-cooking", game_options: dict[str, Any] | None = None,
                 num_games: int = 100, seed_offset: int = 0, rewards: str = "dense", normalize: bool = False,
                 cache_dir: str | None = None, split: str = "train", render_mode: str | None = None,
                 world_size: int | None = None, nb_objects: int | None = None, quest_length: int | None = None,
                 raw_text: bool = False, new_games: bool = False):
        super().__init__(render_mode=render_mode)
        require_extra("textworld", ("textworld",), "TextWorld (ARL/TextWorld-*)")
        self.raw_text, self.new_games = bool(raw_text), bool(new_games)
        custom = {k: v for k, v in zip(CUSTOM_OPTIONS, (world_size, nb_objects, quest_length)) if v is not None}
        if custom:
            if kind not in ("tw-cooking", "tw-custom"):
                raise ValueError(f"world_size, nb_objects and quest_length make tw-custom worlds, not {kind}")
            kind, game_options = "tw-custom", {**(game_options or {}), **custom}
        if rewards not in ("dense", "sparse"):
            raise ValueError(f"rewards must be 'dense' or 'sparse', got {rewards!r}")
        if not 1 <= num_games <= TEST_SEED_OFFSET:
            raise ValueError(f"num_games must be in [1, {TEST_SEED_OFFSET}], got {num_games}")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.split = split
        self.kind, self.settings = kind, game_settings(kind, game_options)
        self.num_games, self.seed_offset = int(num_games), int(seed_offset)
        self.rewards, self.normalize = rewards, bool(normalize)
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self._env = None
        self._loaded: Path | None = None
        self._state = None
        self._plan: list[str] = []
        self._score = 0
        self.game_file: Path | None = None

    def _start(self, path: Path) -> None:
        import textworld

        if self._env is not None:
            self._env.close()
        infos = textworld.EnvInfos(admissible_commands=True, objective=True, won=True, lost=True, score=True,
                                   max_score=True, policy_commands=True, extras=["walkthrough"])
        with warnings.catch_warnings():  # jericho only knows commercial games; TextWorld tracks the score itself
            warnings.filterwarnings("ignore", message=".*is not fully supported.*")
            self._env = textworld.start(str(path), request_infos=infos)
        self._loaded = path

    # --- TextEnv hooks --------------------------------------------------------------
    def _reset(self, options):
        index = int_option(options, "game", 0, TEST_SEED_OFFSET if self.new_games else self.num_games)
        if index is None:
            index = int(self.np_random.integers(self.num_games))
        self.game_file = cached_game(self.kind, self.settings, self.game_seed(int(index)), self.cache_dir)
        if self._loaded != self.game_file:
            self._start(self.game_file)
        with warnings.catch_warnings():  # jericho warns on every load of a non-commercial game
            warnings.filterwarnings("ignore", message=".*is not fully supported.*")
            self._state = self._env.reset()
        self._plan = list(self._state.get("extra.walkthrough") or [])
        self._score = 0
        return self._text(self._state["feedback"]), self._info(valid=True, score=0)

    def game_seed(self, index: int) -> int:
        """Generation seed of the split's game ``index`` (the train and test ranges never meet)."""
        if not 0 <= index < TEST_SEED_OFFSET:
            raise ValueError(f"game index must be in [0, {TEST_SEED_OFFSET}), got {index}")
        return self.seed_offset + (TEST_SEED_OFFSET if self.split == "test" else 0) + index

    def _step(self, action: str):
        command = _normalize(action)
        # custom worlds name objects with capitals ("type D locker"): compare both sides normalized
        if command not in {_normalize(c) for c in self._state["admissible_commands"]}:
            return INVALID_FEEDBACK, 0.0, False, False, self._info(valid=False, score=self._score)
        self._state, score, done = self._env.step(command)
        self._plan = self._plan[1:] if (self._plan and _normalize(self._plan[0]) == command) else []
        delta, self._score = score - self._score, score
        if self.rewards == "dense":
            reward = float(delta)
        else:
            reward = float(score) if done else 0.0
        if self.normalize:
            reward /= max(1, self._state["max_score"])
        return self._text(self._state["feedback"]), reward, bool(done), False, self._info(valid=True, score=score)

    def _text(self, feedback: str) -> str:
        return feedback if self.raw_text else clean_text(feedback)

    def _info(self, valid: bool, score: int) -> dict[str, Any]:
        return {"won": bool(self._state["won"]), "action_is_valid": valid, "score": int(score),
                "max_score": int(self._state["max_score"]), "lost": bool(self._state["lost"])}

    def task_description(self) -> str:
        return self._state["objective"] if self._state is not None else ""

    def admissible_actions(self) -> list[str] | None:
        return list(self._state["admissible_commands"]) if self._state is not None else None

    def expert_action(self) -> str:
        if self._state is None:
            raise RuntimeError("call reset() before expert_action()")
        if self._plan:
            return self._plan[0]
        policy = self._state.get("policy_commands") or []
        return policy[0] if policy else "look"

    def close(self):
        if self._env is not None:
            self._env.close()
            self._env = None
            self._loaded = None
        super().close()
