"""Command-line parsing with a profile: every ``Args`` field declares its CPU default on its own line, and
``--profile gpu`` swaps in the values of the script's visible ``GPU_PROFILE`` table, then the chosen env's turn
limit and prompt length (``arena_envs.env_recipe``) for the fields the table leaves out. Flags always win.

Parsed values are checked before anything heavy starts, so a mistake costs one line that says what to do, not a
traceback minutes later: value ranges (``RANGES``), the env id (registered, its extra installed) and the vLLM extra.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from typing import Any, Sequence, TypeVar

import tyro

T = TypeVar("T")


def requested_profile(argv: Sequence[str]) -> str | None:
    """The value of ``--profile X`` / ``--profile=X`` in ``argv`` (the last one wins, as in the parser)."""
    found = None
    for i, token in enumerate(argv):
        if token == "--profile" and i + 1 < len(argv):
            found = argv[i + 1]
        elif token.startswith("--profile="):
            found = token.split("=", 1)[1]
    return found


#: Allowed values of the fields the scripts share: field -> (low, high, low inclusive); None = unbounded.
RANGES: dict[str, tuple[float | None, float | None, bool]] = {
    **dict.fromkeys(("num_iterations", "num_groups", "group_size", "max_turns", "max_prompt_tokens",
                     "max_response_tokens", "mini_batch_size", "micro_batch_size", "update_epochs", "eval_episodes",
                     "num_episodes", "num_steps", "batch_size", "max_num_gen_batches"), (1, None, True)),
    # torch_threads 0 = default_threads(); micro_batch_tokens 0 = no token cap
    **dict.fromkeys(("history_length", "checkpoint_every", "eval_every", "weight_decay", "kl_coef",
                     "format_penalty", "warmup_steps", "torch_threads", "micro_batch_tokens", "max_env_failures"),
                    (0, None, True)),
    **dict.fromkeys(("learning_rate", "temperature", "max_grad_norm", "env_step_timeout"), (0, None, False)),
    "env_workers": (-1, None, True),  # -1 = auto
    **dict.fromkeys(("top_p", "vllm_gpu_memory_utilization"), (0, 1, False)),
    "random_action_prob": (0, 1, True),
}


def range_problem(args: Any, ranges: dict[str, tuple[float | None, float | None, bool]] = RANGES) -> str | None:
    """The first field of ``args`` outside its range in ``ranges``, as a message naming the flag, or None."""
    for key, (low, high, inclusive) in ranges.items():
        value = getattr(args, key, None)
        if value is None:
            continue
        too_low = low is not None and (value < low if inclusive else value <= low)
        if too_low or (high is not None and value > high) or value != value:  # value != value: NaN
            opening = "[" if inclusive else "("
            bound = f"{'>=' if inclusive else '>'} {low}" if high is None else f"in {opening}{low}, {high}]"
            return f"error: --{key.replace('_', '-')} must be {bound} (got {value})"
    return None


def args_problem(args: Any) -> str | None:
    """The first problem of parsed ``args`` (ranges, flags that need another, env id, the method's own
    ``method_problem()``, requested vLLM) as one message, or None."""
    problem = range_problem(args)
    if problem is None and getattr(args, "resume_fallback", False) and not getattr(args, "resume", False):
        problem = "error: --resume-fallback applies to --resume: give both"
    if problem is None and getattr(args, "env_id", None) is not None:  # one id, or a mixture (arena_train.mixture)
        from arena_train.mixture import mixture_problem

        problem = mixture_problem(args.env_id, getattr(args, "env_weights", None))
    if problem is None and hasattr(args, "on_collapse"):  # the collapse alarm's flags (arena_train.monitor)
        from arena_train.monitor import CollapseConfig

        try:
            CollapseConfig.from_flags(vars(args))
        except ValueError as e:
            problem = f"error: {e}"
    if problem is None and getattr(args, "rollout_is_cap", 1.0) < 1.0:
        problem = f"error: --rollout-is-cap must be >= 1 (got {args.rollout_is_cap}): an exact match must keep weight 1"
    if problem is None and hasattr(args, "method_problem"):  # a method's own combinations (its Args block)
        problem = args.method_problem()
    if problem is None and getattr(args, "rollout_backend", None) == "vllm":
        from arena_train.backends import vllm_available

        if not vllm_available():
            problem = "error: --rollout-backend vllm needs the vllm extra: pip install 'arlarena[vllm]'"
    return problem


def parse_args(cls: type[T], gpu_profile: dict[str, Any], argv: Sequence[str] | None = None) -> T:
    """``tyro.cli(cls)`` whose defaults are ``cls()`` (the CPU profile) or, with ``--profile gpu``, ``cls()``
    updated by ``gpu_profile``; flags given on the command line override either. Values that cannot work are
    a one-line ``SystemExit`` (``args_problem``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    default = cls()
    if gpu_profile and requested_profile(argv) == "gpu":
        default = dataclasses.replace(default, **{"profile": "gpu", **gpu_profile})
        default = dataclasses.replace(default, **env_defaults(cls, gpu_profile, tyro.cli(cls, default=default,
                                                                                        args=argv)))
    args = tyro.cli(cls, default=default, args=argv)
    problem = args_problem(args)
    if problem is not None:
        raise SystemExit(problem)
    return args


def split_passthrough(argv: Sequence[str], flag: str) -> tuple[list[str], list[str]]:
    """(``argv`` without the pass-through part, the tokens passed through). Everything after ``flag`` is passed
    through (``--rl-args --kl-coef 0 --cold-start-steps 5``; put it last); ``flag=VALUE`` starts with VALUE; a
    part that is one token is split as a shell would (``--rl-args "--kl-coef 0 --cold-start-steps 5"``); a repeated
    ``flag`` adds to what came before."""
    own = list(argv)
    starts = [i for i, token in enumerate(own) if token == flag or token.startswith(flag + "=")]
    if not starts:
        return own, []
    own, rest = own[:starts[0]], own[starts[0]:]
    parts: list[list[str]] = []
    for token in rest:
        if token == flag:
            parts.append([])
        elif token.startswith(flag + "="):
            parts.append([token[len(flag) + 1:]])
        else:
            parts[-1].append(token)
    return own, [t for part in parts for t in (shlex.split(part[0]) if len(part) == 1 else part)]


def env_defaults(cls: type, gpu_profile: dict[str, Any], parsed: Any) -> dict[str, Any]:
    """The chosen env's recipe (``arena_envs.env_recipe``: turn limit, prompt length) for the fields of ``cls``
    that the profile table does not set; flags still win, as the caller parses again with these defaults. A
    mixture (several ids) gets the largest value of its envs' recipes, and each env its own
    (``arena_train.mixture``)."""
    from arena_envs import env_recipe

    names = {f.name for f in dataclasses.fields(cls)}
    env_id = getattr(parsed, "env_id", None)
    recipes = [env_recipe(e) for e in ([env_id] if isinstance(env_id, str) else env_id or [])]
    recipe = {k: max(r[k] for r in recipes) for k in recipes[0] if all(k in r for r in recipes)} if recipes else {}
    return {k: v for k, v in recipe.items() if k in names and k not in gpu_profile}

