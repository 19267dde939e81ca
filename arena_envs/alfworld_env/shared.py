"""One loaded ALFWorld game per process, whatever the number of envs playing it.

TextWorld's ``PddlEnv`` parses the game's grammar and translates its PDDL to fast_downward's SAS format (twice:
plain and optimized for replanning) on every ``load`` and again on every ``reset``, about 0.6 s each; and each
``PddlEnv`` copies fast_downward's ``libdownward.so`` (33.8 MB) into the temporary directory, because the library
keeps one task and one current state in globals. The G envs of a group play the same game, so a process that
holds them repeated the same parse and translation G times per group and held one library copy per env.

Here the parse and translation are done once per game and process (:func:`load_game`, kept for the last
:data:`GAMES_KEPT` games) and all envs of a process share one library, loaded from the installed file (no copy).
Each episode sees the library through an :class:`_EpisodeLib`: it remembers the episode's own state id and the
operators it applied, and before any call puts the library back into that state (``set_state_id`` while the
library still holds the episode's game; after another game was loaded, reload the game and replay the episode's
operators, which gives the same state: the task and the successor function are deterministic). Envs of one
process take turns on the library under :data:`LOCK` (an OpenEnv server steps its sessions in threads): a
``load``, ``reset``, ``step`` or ``replan`` holds it from its first library call to its last.

Observations, rewards, admissible commands and plans are those of the stock ``PddlEnv``, bit for bit
(tests/test_alfworld_shared.py plays interleaved episodes on both).
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Any

import fast_downward
import textworld
from fast_downward.interface import DOWNWARD_LIB_PATH
from textworld.core import GameState
from textworld.envs.pddl import PddlEnv
from textworld.envs.pddl import logic as pddl_logic
from textworld.logic import Proposition, Variable
from textworld.utils import check_flag

#: Parsed and translated games kept per process (a worker holds slots of several groups; an env keeps its own
#: game alive, this only bounds the games kept for later loads).
GAMES_KEPT = 32

#: The library's C signatures (fast_downward.load_lib's, plus the state-id pair it does not declare).
_SIGNATURES = {
    "load_sas": ([ctypes.c_char_p], None), "load_sas_replan": ([ctypes.c_char_p], None), "cleanup": ([], None),
    "get_applicable_operators_count": ([], int),
    "get_applicable_operators": ([ctypes.POINTER(fast_downward.Operator)], None),
    "get_state_size": ([], int), "get_state": ([ctypes.POINTER(fast_downward.Atom)], None),
    "apply_operator": ([ctypes.c_int, ctypes.POINTER(fast_downward.Atom)], int),
    "check_goal": ([], bool), "replan": ([ctypes.c_bool], bool), "get_last_plan_length": ([], int),
    "get_last_plan": ([ctypes.POINTER(fast_downward.Operator)], None),
    "get_state_id": ([], ctypes.c_int), "set_state_id": ([ctypes.c_int], None),
}
#: Calls that read the current state (or plan from it); ``apply_operator`` is the one that moves it.
_READS = frozenset({"get_applicable_operators_count", "get_applicable_operators", "get_state_size", "get_state",
                    "check_goal", "replan", "get_last_plan_length", "get_last_plan"})


@dataclass(eq=False)
class Game:
    """One game's parsed logic and SAS translations, shared read-only by the envs that play it."""

    data: dict
    logic: Any  # textworld.envs.pddl.logic.GameLogic
    task: Any  # fast_downward's translated task (actions, types, objects, init)
    sas: str
    sas_replan: str


_GAMES: OrderedDict[tuple, Game] = OrderedDict()
#: Held by every env operation that touches the shared library or the game cache.
LOCK = threading.RLock()


def load_game(path: str) -> Game:
    """The game at ``path``, parsed and translated once per process (until the file changes)."""
    st = os.stat(path)
    key = (str(path), st.st_mtime_ns, st.st_size)
    game = _GAMES.get(key)
    if game is None:
        with open(path) as f:
            data = json.load(f)
        logic = pddl_logic.GameLogic(domain=data["pddl_domain"], grammar=data["grammar"])
        verbose = check_flag("TW_PDDL_DEBUG")
        task, sas = fast_downward.pddl2sas(logic.domain, data["pddl_problem"], verbose=verbose)
        _, sas_replan = fast_downward.pddl2sas(logic.domain, data["pddl_problem"], verbose=verbose, optimize=True)
        game = _GAMES[key] = Game(data, logic, task, sas, sas_replan)
        while len(_GAMES) > GAMES_KEPT:
            _GAMES.popitem(last=False)
    _GAMES.move_to_end(key)
    return game


class _Library:
    """This process's fast_downward library and the game it holds; ``generation`` counts game loads."""

    def __init__(self):
        self.lib = ctypes.cdll.LoadLibrary(DOWNWARD_LIB_PATH)  # the installed file: one instance, no copy
        for name, (args, res) in _SIGNATURES.items():
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = args, res
        self.game: Game | None = None
        self.generation = 0
        self.initial_id = -1

    def hold(self, game: Game) -> None:
        if self.game is not game:
            self.lib.load_sas(game.sas.encode("utf-8"))
            self.lib.load_sas_replan(game.sas_replan.encode("utf-8"))
            self.game, self.generation, self.initial_id = game, self.generation + 1, self.lib.get_state_id()


_LIBRARY: _Library | None = None


def library() -> _Library:
    """The process's library, loaded on first use."""
    global _LIBRARY
    if _LIBRARY is None:
        _LIBRARY = _Library()
    return _LIBRARY


class _EpisodeLib:
    """One episode's view of the shared library, standing where ``PddlState`` keeps its own library."""

    def __init__(self, game: Game):
        self._game = game
        self._ops: list[int] = []
        self._generation = -1
        self._state_id = -1

    def _activate(self):
        shared = library()
        shared.hold(self._game)
        if self._generation != shared.generation:  # a fresh episode, or another game was loaded since
            shared.lib.set_state_id(shared.initial_id)
            for op in self._ops:
                shared.lib.apply_operator(op, None)
            self._generation, self._state_id = shared.generation, shared.lib.get_state_id()
        else:
            shared.lib.set_state_id(self._state_id)
        return shared.lib

    def apply_operator(self, op_id: int, effects) -> int:
        lib = self._activate()
        count = lib.apply_operator(op_id, effects)
        self._ops.append(int(op_id))
        self._state_id = lib.get_state_id()
        return count

    def __getattr__(self, name: str):
        if name not in _READS:
            raise AttributeError(f"{name} is not available to an episode of the shared fast_downward library")
        fn = getattr(library().lib, name)

        def call(*args):
            self._activate()
            return fn(*args)

        return call


class SharedPddlState(pddl_logic.PddlState):
    """``PddlState`` on a shared :class:`Game`: what its ``__init__`` computes, minus the translation and the load."""

    def __init__(self, game: Game):  # not super().__init__: that translates the PDDL again
        self._facts = defaultdict(set)
        self._vars_by_name = {}
        self._vars_by_type = defaultdict(set)
        self._var_counts = Counter()
        self._logic = game.logic
        self.downward_lib = _EpisodeLib(game)
        self.pddl_problem = game.data["pddl_problem"]
        self.task, self.sas, self.sas_replan = game.task, game.sas, game.sas_replan
        self._actions = {a.name: a for a in self.task.actions}
        for type_ in self.task.types:
            try:
                self._logic.types.add(textworld.logic.Type(type_.name, type_.supertype_names))
            except ValueError:  # already known (as in PddlState)
                pass
        self.name2type = {o.name: o.type_name for o in self.task.objects}

        def _atom2proposition(atom):
            if isinstance(atom, fast_downward.translate.pddl.conditions.Atom):
                if atom.predicate == "=":
                    return None
                return Proposition(atom.predicate, [Variable(arg, self.name2type[arg]) for arg in atom.args])
            if isinstance(atom, fast_downward.translate.pddl.f_expression.Assign):
                if atom.fluent.symbol == "total-cost":
                    return None
                name = f"{atom.expression.value}"
                if str.isdigit(name):  # distance relations
                    return None
                return Proposition(name, [Variable(arg, self.name2type[arg]) for arg in atom.fluent.args])
            return None

        self.add_facts(list(filter(None, (_atom2proposition(atom) for atom in self.task.init))))
        state_size = self.downward_lib.get_state_size()
        atoms = (pddl_logic.Atom * state_size)()
        self.downward_lib.get_state(atoms)
        self.add_facts([f for f in (atom.get_fact(self.name2type) for atom in atoms) if not f.is_negation])


class SharedPddlEnv(PddlEnv):
    """TextWorld's ``PddlEnv`` on the process's shared games and library (loads from a game file path only)."""

    def __init__(self, infos: textworld.EnvInfos | None = None):  # not PddlEnv.__init__: that copies the library
        textworld.Environment.__init__(self, infos)
        self.downward_lib = None

    def load(self, filename: str) -> None:
        with LOCK:
            self._game = load_game(filename)
            self._game_file = filename
            self._game_data = self._game.data
            self.walkthrough = self._game_data.get("walkthrough", None)
            self._logic = self._game.logic
            self._pddl_state = SharedPddlState(self._game)
            self._entity_infos = self._get_entity_infos()  # per env: ALFWorld's demangler renames them in place

    def reset(self):
        """``PddlEnv.reset`` with the episode's state built from the shared game."""
        with LOCK:
            self._pddl_state = SharedPddlState(self._game)
            self.prev_state = None
            self.state = GameState()
            self._last_action = None
            self._moves = 0
            context = {"state": self._pddl_state, "facts": list(self._pddl_state.facts), "variables": {},
                       "mapping": {}, "entity_infos": self._entity_infos}
            self.state.feedback = self._logic.grammar.derive("#intro#", context)
            self.state.raw = self.state.feedback
            self._gather_infos()
            if "walkthrough" in self.request_infos.extras:
                self.state["extra.walkthrough"] = self.walkthrough or self._pddl_state.replan(self._entity_infos)
            return self.state

    def step(self, command: str):
        with LOCK:
            return super().step(command)

    def replan(self) -> list[str]:
        """The planner's commands from the current state (what ``PddlEnv`` computes for ``policy_commands``)."""
        with LOCK:
            return self._pddl_state.replan(self._entity_infos)
