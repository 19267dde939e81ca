"""ARLArena text environments, registered in the ``ARL`` gymnasium namespace.

``import arena_envs`` registers every id; engine-heavy modules (alfworld, textworld)
are imported only when their env is made, so the package imports without the extras.

Every env takes ``split`` (``gym.make(id, split=...)``); training uses ``"train"`` and
evaluation the id's held-out split (:func:`held_out_split`), which never shares a task with it.
"""

from __future__ import annotations

import importlib

import gymnasium as gym

from arena_envs.base import CHARSET, INFO_KEYS, EnvStateError, EpisodeGuard, TextEnv, text_space

__all__ = ["CHARSET", "INFO_KEYS", "TextEnv", "text_space", "ENV_IDS", "ENGINE_EXTRAS", "EnvStateError",
           "EpisodeGuard", "missing_extra", "env_recipe", "held_out_split", "auto_env_workers"]

# id -> (entry point, max_episode_steps, kwargs)
_SPECS: dict[str, tuple[str, int, dict]] = {
    "ARL/Sokoban-v0": ("arena_envs.sokoban:SokobanEnv", 15, {}),
    "ARL/Sokoban-Deep-v0": ("arena_envs.sokoban:SokobanEnv", 15, {"min_solution_length": 7}),
    "ARL/Sokoban-Mini-v0": ("arena_envs.sokoban:SokobanEnv", 10, {"min_solution_length": 3, "max_solution_length": 10,
                                                                   "render_style": "spaced"}),
    "ARL/Sokoban-8x8-v0": ("arena_envs.sokoban:SokobanEnv", 30,
                           {"dim_room": (8, 8), "num_boxes": 2, "max_solution_length": 30}),
    "ARL/TIRMath-v0": ("arena_envs.tirmath:TIRMathEnv", 5, {}),
    "ARL/WebShop-v0": ("arena_envs.webshop:WebShopEnv", 15, {}),
    "ARL/ALFWorld-v0": ("arena_envs.alfworld_env:ALFWorldEnv", 50, {}),
    "ARL/ALFWorld-Unseen-v0": ("arena_envs.alfworld_env:ALFWorldEnv", 50, {}),
    "ARL/TextWorld-v0": ("arena_envs.textworld_env:TextWorldEnv", 8, {}),
    # CPU-scale studies (docs/practitioner.md): 20 games per split; the cooking game as above, and the
    # Practitioner's Guide's custom worlds w2-o3-q4, w4-o6-q8, w8-o12-q16, with 2x the quest's length in turns
    "ARL/TextWorld-Mini-v0": ("arena_envs.textworld_env:TextWorldEnv", 8, {"num_games": 20}),
    "ARL/TextWorld-Small-v0": ("arena_envs.textworld_env:TextWorldEnv", 8,
                               {"world_size": 2, "nb_objects": 3, "quest_length": 4, "num_games": 20}),
    "ARL/TextWorld-Medium-v0": ("arena_envs.textworld_env:TextWorldEnv", 16,
                                {"world_size": 4, "nb_objects": 6, "quest_length": 8, "num_games": 20}),
    "ARL/TextWorld-Large-v0": ("arena_envs.textworld_env:TextWorldEnv", 32,
                               {"world_size": 8, "nb_objects": 12, "quest_length": 16, "num_games": 20}),
    "ARL/SWE-Mini-v0": ("arena_envs.swe:SWEMiniEnv", 20, {}),
}

#: Held-out split per id where it is not ``"test"``: ALFWorld evaluates on valid_seen (ARLArena's
#: eval_in_distribution); the Unseen id trains on the same games and evaluates on unseen floor plans.
_HELD_OUT = {"ARL/ALFWorld-v0": "valid_seen", "ARL/ALFWorld-Unseen-v0": "valid_unseen"}

#: Every registered id (variants included).
ENV_IDS: list[str] = list(_SPECS)
#: Env module -> the packages its engine imports, all installed by the extra of the same name as the first.
ENGINE_EXTRAS: dict[str, tuple[str, ...]] = {"arena_envs.alfworld_env": ("alfworld", "textworld"),
                                             "arena_envs.textworld_env": ("textworld",)}


def missing_extra(env_id: str) -> str | None:
    """The name of the pip extra ``env_id`` needs and lacks here (``pip install 'arlarena[<extra>]'``), or None."""
    packages = ENGINE_EXTRAS.get(_SPECS[env_id][0].split(":")[0], ())
    for package in packages:
        try:
            importlib.import_module(package)
        except ImportError:
            return packages[0]
    return None


#: The paper's prompt budget in tokens for the envs whose prompts need more than DEFAULT_PROMPT_TOKENS.
_PROMPT_TOKENS: dict[str, int] = {"ARL/WebShop-v0": 4096}
DEFAULT_PROMPT_TOKENS = 2048


def env_recipe(env_id: str) -> dict[str, int]:
    """The paper's per-env rollout budget for the GPU profile: ``max_turns`` (the registration's
    ``max_episode_steps``: ALFWorld 50, WebShop 15, Sokoban 15, TIR-Math 5) and ``max_prompt_tokens`` (WebShop
    4,096, others 2,048). ``{}`` for an id gymnasium does not know (its error comes when the env is made)."""
    try:
        spec = gym.spec(env_id)
    except gym.error.Error:
        return {}
    recipe = {"max_prompt_tokens": _PROMPT_TOKENS.get(env_id, DEFAULT_PROMPT_TOKENS)}
    if spec.max_episode_steps is not None:
        recipe["max_turns"] = int(spec.max_episode_steps)
    return recipe


def auto_env_workers(env_id: str, episodes: int) -> int:
    """``--env-workers -1`` (auto): for an env on a native engine (ALFWorld, TextWorld: tens of ms per step,
    docs/benchmarks.md), one worker process per core up to one per episode; 0 (in the trainer's process) for the
    pure-Python envs, whose steps cost less than a round trip to a worker."""
    import os

    entry = _SPECS.get(env_id, ("",))[0].split(":")[0]
    if entry not in ENGINE_EXTRAS:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, episodes))


def held_out_split(env_id: str) -> str:
    """The split an env id is evaluated on (disjoint from its ``"train"`` split)."""
    if env_id not in _SPECS:
        raise ValueError(f"unknown ARLArena env id {env_id!r}; expected one of {ENV_IDS}")
    return _HELD_OUT.get(env_id, "test")


#: Applied by ``gym.make`` above its ``TimeLimit``: a step after the step limit's truncation raises EnvStateError.
_GUARD = gym.envs.registration.WrapperSpec("EpisodeGuard", "arena_envs.base:EpisodeGuard", {})


def _register_all() -> None:
    for env_id, (entry_point, max_steps, kwargs) in _SPECS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, max_episode_steps=max_steps, kwargs=kwargs,
                         additional_wrappers=(_GUARD,))


_register_all()

# A served env (integrations.openenv_server) played over OpenEnv; not in ENV_IDS: it is a client, made with url=...
if "ARL/Remote-v0" not in gym.registry:
    gym.register(id="ARL/Remote-v0", entry_point="integrations.openenv_client:RemoteEnv", additional_wrappers=(_GUARD,))
