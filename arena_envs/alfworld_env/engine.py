"""The ALFWorld text engine, assembled synchronously from ALFWorld's own parts.

``PddlEnv`` (TextWorld) → ``AlfredDemangler`` (``apple 1`` instead of mangled ids) →
``AlfredInfos`` — the wrapper stack of ``AlfredTWEnv.init_env`` minus the async gym layer,
so tests and single envs run in-process. ``ExpertTracker`` drives ALFWorld's handcoded expert
the way ``AlfredExpert`` does, but never raises into the env and draws its tie-breaking
randomness from a seed instead of the global ``random`` state.

The ``PddlEnv`` is :class:`~arena_envs.alfworld_env.shared.SharedPddlEnv`: the envs of a process share each
game's parsed logic and PDDL→SAS translation (the slow part of a reset, done once per game and process, not
once per env) and one fast_downward library (not a 33.8 MB temporary copy per env).
"""

from __future__ import annotations

import random
from contextlib import contextmanager


def make_engine(expert: bool):
    """A loadable ALFWorld engine; ``expert`` adds the facts the handcoded expert reads."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    from arena_envs.alfworld_env.shared import SharedPddlEnv

    infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=expert, extras=["gamefile"])
    return AlfredInfos(AlfredDemangler(SharedPddlEnv(infos), shuffle=False))


@contextmanager
def _seeded_global_random(seed: int):
    saved = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(saved)


class ExpertTracker:
    """ALFWorld's handcoded expert (``HandCodedTWAgent``) following an episode step by step.

    The expert is stateful (it remembers which receptacles it has seen), so it must observe
    every transition. If it gives up (timeout/failure, e.g. after the agent moved objects
    around) it suggests ``look``, which is what ``AlfredExpert`` reports in that case.
    """

    def __init__(self, max_steps: int = 200):
        self.max_steps = max_steps
        self.next_action = "look"
        self._agent = None
        self._seed = 0
        self._t = 0

    def reset(self, gamefile: str, state, seed: int) -> None:
        from alfworld.agents.expert import HandCodedTWAgent

        self._agent = HandCodedTWAgent(max_steps=self.max_steps)
        self._agent.reset(gamefile)
        self._agent.observe(state["feedback"])
        self._seed, self._t = seed, 0
        self.next_action = "look"

    def update(self, state, command: str) -> None:
        self._t += 1
        action = None
        if self._agent is not None:
            try:
                with _seeded_global_random(self._seed + self._t):
                    action = self._agent.act(state, 0, state["won"], command)
            except Exception:  # the heuristic expert gave up (HandCodedAgentFailed/Timeout or worse)
                self._agent = None
        self.next_action = action if action in state["admissible_commands"] else "look"


def planner_plan(engine) -> list[str]:
    """ALFWorld's planner expert (fast-downward) from the current state: the same call
    ``PddlEnv`` makes for ``policy_commands``, but only when asked instead of every step."""
    return engine.unwrapped.replan()
