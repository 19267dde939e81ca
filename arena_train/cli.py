"""The training scripts' command line: the flag groups every script shares, and parsing with a profile.

A script's ``Args`` holds the recipe (env, model, batch, optimisation, loss) and the method's own fields; the
rest comes in groups declared here — ``RunArgs`` (run folder, resume, logging), ``EngineArgs`` (rollout engine,
precision, memory, env workers) and ``EvalArgs`` (held-out evaluation) — and the collapse alarm's
``arena_train.monitor.CollapseConfig``. The groups add no prefix, so a flag is the same wherever its field lives
(``--eval-every``, ``--collapse-warmup``); ``flat_args`` gives the flat field names of ``args.json``.

Every field declares its CPU default on its own line, and ``--profile gpu`` swaps in the values of the script's
visible ``GPU_PROFILE`` table (flat names), then the chosen env's turn limit and prompt length
(``arena_envs.env_recipe``) for the fields the table leaves out. Flags always win.

Parsed values are checked before anything heavy starts, so a mistake costs one line that says what to do, not a
traceback minutes later: value ranges (``RANGES``), the env id (registered, its extra installed) and the vLLM extra.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Annotated, Any, Collection, Literal, Sequence, TypeVar

import tyro

from arena_train.flat import flat_args, replace_flat
from arena_train.rollout import VAL_TEMPERATURE, VAL_TOP_K, VAL_TOP_P

T = TypeVar("T")

#: Loss aggregation modes (ARLArena §3.1); ``--loss-agg`` is the short flag.
LossAgg = Annotated[Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"],
                    tyro.conf.arg(aliases=("--loss-agg",))]
#: Sequence masking switch (ARLArena §3.8); ``--seq-mask`` is the short flag.
SeqMask = Annotated[bool, tyro.conf.arg(aliases=("--seq-mask",))]


@tyro.conf.configure(tyro.conf.OmitArgPrefixes)  # flags keep their names
@dataclass
class RunArgs:
    """run folder, resume, logging"""

    torch_threads: int = 0
    """CPU threads per process (0 = $OMP_NUM_THREADS if set, else all available cores; 1 on a shared machine)"""
    output_dir: str = "runs"
    """runs/<run_name>/ receives metrics.jsonl, TensorBoard events, checkpoints and the final model"""
    run_name: str | None = None
    """defaults to <env>__<exp_name>__<seed>"""
    checkpoint_every: int = 10
    """save model, optimizer, RNG states every N iterations (0 = only at the end)"""
    resume: bool = False
    """continue from the latest checkpoint of run_name (verified against its manifest)"""
    resume_fallback: bool = False
    """with --resume: when the newest checkpoint is damaged, resume from the newest intact earlier one"""
    resume_override: tuple[str, ...] = ()
    """with --resume: flags (kl_coef learning_rate ...) that may differ from the run's args.json from the next
    iteration on; without it a flag given again with another value is an error (docs/runs.md "Resume")"""
    overwrite: bool = False
    """delete the run already in output_dir/run_name and start over (without this or --resume it is an error)"""
    dry_run: bool = False
    """print this run's per-GPU memory plan (policy, reference, optimizer, activations, vLLM) and exit"""
    log_episodes: int = 16
    """training episodes recorded per iteration in runs/<run_name>/episodes/ (0 = none; held-out evaluations always
    record all theirs): docs/metrics.md "Episode records", python -m eval.view"""
    track: bool = False
    """also log to Weights & Biases"""
    wandb_project: str = "arlarena"
    """W&B project"""


@tyro.conf.configure(tyro.conf.OmitArgPrefixes)  # flags keep their names
@dataclass
class EngineArgs:
    """rollout engine, precision, memory, env workers"""

    micro_batch_size: int = 128
    """rows per forward/backward pass (gradient accumulation inside a mini-batch)"""
    micro_batch_tokens: int = 0
    """also cap a forward/backward pass at this many padded tokens (0 = rows only); rows are sorted by length"""
    rollout_backend: Literal["auto", "hf", "vllm"] = "hf"
    """'auto' (vLLM if importable and on GPU), 'vllm' or 'hf' (transformers generate)"""
    vllm_gpu_memory_utilization: float = 0.35
    """GPU memory fraction given to vLLM's engine"""
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    """Accelerate mixed precision"""
    gradient_checkpointing: bool = False
    """trade compute for memory in the update"""
    lora_rank: int = 0
    """LoRA rank on every attention/MLP projection (0 = full fine-tuning); the reference is the frozen base"""
    rollout_precision: Literal["trainer", "bf16"] = "trainer"
    """the rollout engine's precision: the trainer's own, or bfloat16 (a bf16 copy / vLLM engine fed after every
    update); another engine's log-probs differ from the trainer's: rollout_is/* logs the gap"""
    rollout_is: Literal["none", "tis", "mis"] = "none"
    """rollout/trainer mismatch correction: the trainer rescores every row and weights each token's policy loss by
    p_train/p_rollout, truncated at the cap (tis) or 0 above it (mis); none: no weights"""
    rollout_is_cap: float = 2.0
    """cap (>= 1) of the rollout importance weights"""
    chat_template: str | None = None
    """the chat template: a .jinja file or a template TRL ships (qwen3_training, llama3_1, gemma3, gptoss, ...);
    default: the tokenizer's own (docs/real_models.md)"""
    chat_template_kwargs: str = ""
    """JSON object passed to every chat-template call, e.g. '{"enable_thinking": false}' for a Qwen3 hybrid"""
    env_workers: int = -1
    """env worker processes per env (0 = step the envs in the trainer's process; -1 = auto: one per core, up to one
    per episode, for the native engines ALFWorld and TextWorld, 0 for the pure-Python envs); same rows either way"""
    env_servers: tuple[str, ...] = ()
    """OpenEnv servers (python -m integrations.openenv_server --env-id ID, on any machine) that play the training
    episodes instead, slot i on URL i % N (docs/runs.md, "Env servers"); one env id; evaluation stays local; printed
    at the start; --resume never takes them from args.json: give them again (or the flag alone: local envs)"""
    env_step_timeout: float = 300.0
    """seconds an env step or reset may take in a worker before its episode fails (workers only)"""
    max_env_failures: int = 5
    """stop the run after this many consecutive iterations whose env errors dropped a group (0 = never)"""
    episode_streams: bool = True
    """each training episode samples from its own stream (run seed, iteration, task seed, sample, turn): a row's
    tokens do not depend on the batch, env workers or processes; --no-episode-streams: the backend's one stream per
    process, the rows of the versions before the flag (docs/runs.md, "Episode streams")"""
    overlap_turns: bool = False
    """with the episode streams and env workers: two cohorts of episodes alternate, one generating while the other's
    envs step; the same tokens as the lockstep rollout ("step" rows only)"""


@tyro.conf.configure(tyro.conf.OmitArgPrefixes)  # flags keep their names
@dataclass
class EvalArgs:
    """held-out evaluation during training"""

    eval_every: int = 10
    """evaluation on the held-out split every N iterations (0 = never)"""
    eval_episodes: int = 100
    """held-out episodes per evaluation"""
    eval_split: str | None = None
    """split of the evaluation (default: the env's held-out split, arena_envs.held_out_split; never 'train')"""
    eval_greedy: bool = False
    """greedy evaluation instead of ARLArena's validation sampling (eval_temperature, eval_top_p, eval_top_k)"""
    eval_temperature: float = VAL_TEMPERATURE
    """sampling temperature of the evaluation"""
    eval_top_p: float = VAL_TOP_P
    """nucleus sampling of the evaluation"""
    eval_top_k: int = VAL_TOP_K
    """top-k sampling of the evaluation (0 = off)"""


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
                     "format_penalty", "warmup_steps", "torch_threads", "micro_batch_tokens", "max_env_failures",
                     "log_episodes"),
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
    method = args
    if dataclasses.is_dataclass(args):
        args = SimpleNamespace(**flat_args(args))
    problem = range_problem(args)
    for name in ("resume_fallback", "resume_override"):
        if problem is None and getattr(args, name, False) and not getattr(args, "resume", False):
            problem = f"error: --{name.replace('_', '-')} applies to --resume: give both"
    if problem is None and getattr(args, "env_id", None) is not None:  # one id, or a mixture (arena_train.mixture)
        from arena_train.mixture import mixture_problem

        problem = mixture_problem(args.env_id, getattr(args, "env_weights", None))
    if problem is None and getattr(args, "env_servers", None):
        from arena_envs.pool import servers_problem

        problem = servers_problem(args.env_servers, getattr(args, "env_id", ""))
    if problem is None and getattr(args, "overlap_turns", False):
        problem = overlap_problem(args)
    if problem is None and (getattr(args, "chat_template", None) or getattr(args, "chat_template_kwargs", "")):
        from arena_train.chat import template_problem

        problem = template_problem(args.chat_template, args.chat_template_kwargs)
    if problem is None and getattr(args, "rollout_is_cap", 1.0) < 1.0:
        problem = f"error: --rollout-is-cap must be >= 1 (got {args.rollout_is_cap}): an exact match must keep weight 1"
    if problem is None and hasattr(method, "method_problem"):  # a method's own combinations (its Args block)
        problem = method.method_problem()
    if problem is None and getattr(args, "top_p", 1.0) < 1.0 and getattr(args, "rollout_backend", None) in ("vllm",
                                                                                                        "auto"):
        from arena_train.backends import rollout_backend_name

        if rollout_backend_name(args.rollout_backend) == "vllm":
            problem = (f"error: --top-p {args.top_p} with vLLM rollouts: vLLM's log-probs are renormalised over the "
                       f"tokens top-p kept and the trainer's over the whole vocabulary, so rollout_is/* and "
                       f"--rollout-is would read the kept mass, not a mismatch; train with --top-p 1 (the default) "
                       f"or --rollout-backend hf")
    if problem is None and getattr(args, "rollout_backend", None) == "vllm":
        from arena_train.backends import vllm_available

        if not vllm_available():
            problem = "error: --rollout-backend vllm needs the vllm extra: pip install 'arlarena[vllm]'"
    if problem is None and getattr(args, "track", False):
        from arena_train.logger import wandb_problem

        problem = wandb_problem()
    return problem


def overlap_problem(args: Any) -> str | None:
    """Why ``--overlap-turns`` cannot apply to the flat ``args``, or None: its rows are the lockstep rollout's only
    with per-episode streams, it overlaps generation with env workers (or servers) only, and it plays the "step"
    row layout."""
    from arena_envs import auto_env_workers

    if not getattr(args, "episode_streams", False):
        return ("error: --overlap-turns needs the episode streams: drop --no-episode-streams (without them a row's "
                "tokens depend on the cohorts)")
    env_ids = getattr(args, "env_id", None) or []
    workers = getattr(args, "env_workers", 0)
    if workers < 0:  # auto: workers for the native engines only (every env of a mixture must have them)
        ids = [env_ids] if isinstance(env_ids, str) else list(env_ids)
        workers = min((auto_env_workers(e, 2) for e in ids), default=0)
    if workers == 0 and not getattr(args, "env_servers", ()):
        return "error: --overlap-turns needs env workers (--env-workers N >= 1) or --env-servers to step the envs in"
    if getattr(args, "row_layout", "step") != "step":
        return "error: --overlap-turns plays the 'step' row layout only (--row-layout step)"
    return None


def gpu_warning(args: Any) -> str | None:
    """A warning for ``--profile gpu`` (ARLArena's recipe: a 4B model, long prompts) on a machine without a GPU,
    where one iteration takes hours; None otherwise, and for ``--dry-run`` (planning a GPU run here is its use)."""
    import torch

    flat = flat_args(args) if dataclasses.is_dataclass(args) else vars(args)
    if flat.get("profile") != "gpu" or flat.get("dry_run") or torch.cuda.is_available():
        return None
    return ("warning: --profile gpu on a machine without a GPU: ARLArena's recipe runs on the CPU here, hours per "
            "iteration; the default profile (cpu-tiny) is the one for a CPU")


#: Short flags users type from other trainers -> the scripts' own (given only where the script has that flag).
ALIASES = {"--lr": "--learning-rate", "--model": "--model-path", "--env": "--env-id"}


def expand_aliases(argv: Sequence[str], options: Collection[str]) -> list[str]:
    """``argv`` with every ``ALIASES`` key (``--lr 1e-5``, ``--lr=1e-5``) written as its flag, where ``options``
    (the script's option strings) has that flag and not the alias itself."""
    out = []
    for token in argv:
        name, sep, value = token.partition("=")
        target = ALIASES.get(name)
        out.append(target + sep + value if target in options and name not in options else token)
    return out


def parse_args(cls: type[T], gpu_profile: dict[str, Any], argv: Sequence[str] | None = None) -> T:
    """``tyro.cli(cls)`` whose defaults are ``cls()`` (the CPU profile) or, with ``--profile gpu``, ``cls()``
    updated by ``gpu_profile``; flags given on the command line override either; ``ALIASES`` stand for their flags.
    With ``--resume`` the run's ``args.json`` gives every value not given (``arena_train.resume``). Values that
    cannot work are a one-line ``SystemExit`` (``args_problem``)."""
    from arena_train.resume import flag_fields, resume_args

    argv = expand_aliases(list(sys.argv[1:] if argv is None else argv), flag_fields(cls()))
    default = cls()
    if gpu_profile and requested_profile(argv) == "gpu":
        default = replace_flat(default, **{"profile": "gpu", **gpu_profile})
        default = replace_flat(default, **env_defaults(default, gpu_profile, tyro.cli(cls, default=default, args=argv)))
    args = tyro.cli(cls, default=default, args=argv)
    problem = args_problem(args)
    if problem is None and getattr(getattr(args, "run", None), "resume", False):
        args = resume_args(args, argv)
        problem = args_problem(args)
    if problem is not None:
        raise SystemExit(problem)
    warning = gpu_warning(args)
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)
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


def env_defaults(default: Any, gpu_profile: dict[str, Any], parsed: Any) -> dict[str, Any]:
    """The chosen env's recipe (``arena_envs.env_recipe``: turn limit, prompt length) for the fields of
    ``default`` (flat names) that the profile table does not set; flags still win, as the caller parses again with
    these defaults. A mixture (several ids) gets the largest value of its envs' recipes, and each env its own
    (``arena_train.mixture``)."""
    from arena_envs import env_recipe

    names = set(flat_args(default))
    env_id = getattr(parsed, "env_id", None)
    recipes = [env_recipe(e) for e in ([env_id] if isinstance(env_id, str) else env_id or [])]
    recipe = {k: max(r[k] for r in recipes) for k in recipes[0] if all(k in r for r in recipes)} if recipes else {}
    return {k: v for k, v in recipe.items() if k in names and k not in gpu_profile}

