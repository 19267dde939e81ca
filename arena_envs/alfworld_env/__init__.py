"""ALFWorld on its real engine (TextWorld ``PddlEnv`` + ALFWorld's demangler and experts)."""

__all__ = ["ALFWorldEnv"]


def __getattr__(name):
    # lazy, so that the generator and game-file helpers import without loading the engine
    if name == "ALFWorldEnv":
        from arena_envs.alfworld_env.env import ALFWorldEnv

        return ALFWorldEnv
    raise AttributeError(name)
