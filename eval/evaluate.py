"""Evaluate a checkpoint on an env over N task seeds, beside the env's expert and a random policy.

``python -m eval.evaluate --model PATH_OR_ID --env-id ARL/Sokoban-v0 --num-seeds 100
[--decoding greedy sampled] [--samples 4] [--k 1 4] [--baselines expert random] [--out r.json]``

``python -m eval.evaluate --run runs/<name>`` evaluates that run's final model (or ``--model`` a folder inside a run
folder) with the run's own settings from its ``args.json``: env id(s), prompt style, history, token and turn limits,
held-out episodes, seed and evaluation decoding, so it reproduces the run's own held-out evaluation on the same
seeds. A flag given that differs from the run's is printed with both values; a model with no run record takes the
training scripts' ``cpu-tiny`` defaults (``algos/grpo.py``'s ``Args``). The settings used are printed.
``--episodes FILE`` writes every policy episode as an episode record (``arena_train.episodes``, docs/metrics.md).

Several ``--env-id`` (a mixture run's envs) give one table per env, each on its own held-out split and the same
seeds; ``--out`` then holds every env's results (each result names its ``env_id``).

Importable: ``evaluate_policy(env_id, policy, seeds)`` plays every episode through
``wrappers.GroupRollout.run`` (one batched policy call per turn over all active
episodes); ``policy`` is any ``list[messages] -> list[str]`` callable, e.g.
``hf_policy(model, tokenizer)``, or ``"expert"`` / ``"random"`` for the baselines
(the random policy picks uniformly among admissible actions; envs with an open action
set, e.g. TIR-Math, report it as n/a).

Intervals are 95 %. Success is a proportion and its interval a Wilson interval, inside [0, 100]: over episodes
with one episode per seed; with several samples per seed (not independent) at the effective sample size
(``arena_train.stats.clustered_proportion_ci``). Every other metric uses a Student-t interval over per-seed means
(over episodes with one sample), and the table names the seeds. pass@k is the unbiased estimator over
the samples of each seed. Episodes are played on the env's held-out split
(``arena_envs.held_out_split``: ALFWorld ``valid_seen``, the others ``test``), which shares no task
with the ``train`` split the training scripts roll out on; ``--split`` picks another. Default seeds
are ``EVAL_SEED_OFFSET`` + 0, 1, ... as in the training scripts' evaluation. The default decoding
is ARLArena's validation sampling (T=0.6, top-p 0.95, top-k 20); ``--decoding greedy`` is the option.
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import gymnasium as gym
import numpy as np
import tyro

from arena_envs import ENV_IDS, auto_env_workers, held_out_split
from arena_train.mixture import env_id_problem
from arena_train.models import model_path_problem
from arena_train.rollout import EVAL_SEED_OFFSET
from arena_train.stats import Estimate, clustered_proportion_ci, mean_ci, pass_at_k, proportion_ci
from arena_train.streams import episode_sampling_seeds

DEFAULT_MAX_TURNS = 50

Messages = list[dict[str, str]]
Policy = Callable[[list[Messages]], list[str]]


class EvalError(ValueError):
    """Unknown env, unloadable model or inconsistent settings."""


# --- policies --------------------------------------------------------------------------
def hf_policy(model, tokenizer, greedy: bool = True, temperature: float = 1.0, top_p: float = 1.0,
              top_k: int = 0, max_new_tokens: int = 256, max_prompt_tokens: int = 4096,
              batch_size: int = 64, seed: int | None = None) -> Policy:
    """The training scripts' generation (``arena_train``'s ``encode_prompts`` and ``HFBackend``: chat template,
    left padding, batched ``generate`` with KV cache, stop at the end token) as a messages -> text policy.

    Long prompts keep their last ``max_prompt_tokens`` tokens (the current state is at the end).
    ``seed``, for sampled decoding: ``evaluate_policy`` passes the policy one seed per episode and turn (keyword
    ``seeds``: ``arena_train.streams.episode_sampling_seeds`` of this seed), and each response draws from its own
    stream, so an episode's tokens do not depend on the episodes batched with it; a call without ``seeds`` draws
    from torch's global stream, seeded once with ``seed``.
    """
    import torch

    from arena_train.backends import HFBackend
    from arena_train.rollout import encode_prompts

    if seed is not None:
        torch.manual_seed(seed)
    backend = HFBackend(model, tokenizer, batch_size=batch_size, top_k=top_k)

    def policy(batch: list[Messages], seeds: list[int] | None = None) -> list[str]:
        encoded = encode_prompts(tokenizer, batch, max_prompt_tokens)
        prompts = [ids for ids, _ in encoded]
        responses = backend.generate(prompts, max_new_tokens, temperature, top_p, greedy, seeds=seeds)
        policy.last_stops = ["context_overflow" if cut else reason  # type: ignore[attr-defined]
                             for (_, cut), reason in zip(encoded, backend.last_stop_reasons)]
        policy.stop_counts.update(policy.last_stops)  # type: ignore[attr-defined]
        return tokenizer.batch_decode(responses, skip_special_tokens=True)

    policy.stop_counts = Counter()  # type: ignore[attr-defined]  # why each response ended (rows.TURN_STOPS)
    policy.sampling_seed = None if greedy else seed  # type: ignore[attr-defined]  # evaluate_policy's streams
    return policy


def _baseline(kind: str, rollout, rng: np.random.Generator) -> Policy:
    """The expert or random-admissible policy, reading the state of each active env of ``rollout``."""
    from wrappers import format_response

    def choose(episode: int) -> str:
        env = rollout.envs[episode].unwrapped
        if kind == "expert":
            return env.expert_action()
        actions = env.admissible_actions()
        return str(actions[rng.integers(len(actions))]) if actions else ""  # "" = an invalid action

    return lambda batch: [format_response(choose(i)) for i in rollout.active()]


# --- evaluation ------------------------------------------------------------------------
@dataclass
class EvalResult:
    """Metrics of one policy on one env; ``available=False`` with a ``note`` for n/a baselines."""

    name: str
    env_id: str
    num_seeds: int
    samples_per_seed: int
    available: bool = True
    note: str = ""
    success: Estimate | None = None
    score: Estimate | None = None  # env return (no format penalty): the paper's "Score"
    episode_return: Estimate | None = None  # training return, format penalties included
    length: Estimate | None = None
    valid_format: Estimate | None = None  # per-episode fraction of well-formed responses
    valid_action: Estimate | None = None  # per-episode fraction of valid actions
    pass_at_k: dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0
    failed_episodes: int = 0  # ended by an env error; left out of every metric above
    stops: dict[str, float] = field(default_factory=dict)  # stop/<reason>, stop/episode/<reason> fractions

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _interval(values_by_seed: dict[int, list[float]], per_seed: bool) -> Estimate:
    if per_seed:
        return mean_ci([float(np.mean(v)) for v in values_by_seed.values()])
    return mean_ci([x for v in values_by_seed.values() for x in v])


def summarize(name: str, env_id: str, episodes: Sequence, samples: int, k_values: Sequence[int] = (1,),
              seconds: float = 0.0, turn_stops: Counter | None = None) -> EvalResult:
    """Turn ``wrappers.EpisodeStats`` (``samples`` per task seed) into an ``EvalResult``. Episodes that ended on
    an env error are left out of every metric and counted (``failed_episodes``); a seed whose episodes all
    failed is left out; pass@k uses the seeds with at least k episodes left. ``turn_stops``: the policy's
    per-response stop reasons (``hf_policy``), logged as fractions beside the episodes' own."""
    from arena_train.rows import EPISODE_STOPS

    stops = {f"stop/episode/{r}": sum(ep.stop == r for ep in episodes) / len(episodes) for r in EPISODE_STOPS
             } if episodes else {}
    if turn_stops:
        total = sum(turn_stops.values())
        stops.update({f"stop/{r}": n / total for r, n in sorted(turn_stops.items())})
    failed = sum(ep.stop == "env_error" for ep in episodes)
    episodes = [ep for ep in episodes if ep.stop != "env_error"]
    by_seed: dict[int, list] = defaultdict(list)
    for ep in episodes:
        by_seed[ep.task_seed].append(ep)
    per_seed = samples > 1

    def metric(fn) -> Estimate:
        return _interval({s: [fn(ep) for ep in eps] for s, eps in by_seed.items()}, per_seed)

    wins = [int(ep.won) for ep in episodes]
    success = (clustered_proportion_ci([[float(ep.won) for ep in eps] for eps in by_seed.values()]) if per_seed
               else proportion_ci(sum(wins), len(wins)))
    return EvalResult(
        name=name, env_id=env_id, num_seeds=len(by_seed), samples_per_seed=samples, success=success,
        score=metric(lambda ep: ep.env_return), episode_return=metric(lambda ep: ep.episode_return),
        length=metric(lambda ep: ep.length),
        valid_format=metric(lambda ep: ep.num_valid_format / max(ep.length, 1)),
        valid_action=metric(lambda ep: ep.num_valid_action / max(ep.length, 1)),
        pass_at_k={k: float(np.mean([pass_at_k(len(eps), sum(ep.won for ep in eps), k) for eps in by_seed.values()
                                     if len(eps) >= k]))
                   for k in k_values if k <= samples and any(len(eps) >= k for eps in by_seed.values())},
        seconds=seconds, failed_episodes=failed, stops=stops,
    )


def evaluate_policy(env_id: str, policy: Policy | Literal["expert", "random"], seeds: Sequence[int], *,
                    samples: int = 1, max_turns: int | None = None, k_values: Sequence[int] = (1,),
                    name: str | None = None, env_kwargs: dict[str, Any] | None = None, history_length: int = 2,
                    format_penalty: float = 0.1, prompt_style: str = "full", max_parallel: int = 256,
                    policy_seed: int = 0, progress: bool = True, env_workers: int = 0,
                    env_step_timeout: float | None = None, records: list[dict[str, Any]] | None = None
                    ) -> EvalResult:
    """Play ``samples`` episodes per task seed with ``policy`` and summarise them.

    A policy with a ``sampling_seed`` attribute other than None (``hf_policy`` sampling with a seed) is called
    with ``seeds=``, one per prompt: ``arena_train.streams.episode_sampling_seeds`` of that seed (the episode's
    task seed, its sample index and the turn), so each episode's responses are the same however the episodes
    are chunked, batched or spread over env workers.

    ``env_workers``: 0 steps the envs in this process, N >= 1 in N worker processes, -1 = auto
    (``arena_envs.auto_env_workers``); ``env_step_timeout``: seconds a worker's step may take. An episode that
    fails on an env error is left out of the metrics and counted (``EvalResult.failed_episodes``).
    ``records``: every episode's record (``arena_train.episodes``, source = the result's name) is appended to it.
    Episodes run in chunks of at most ``max_parallel`` (bounds memory and batch size);
    ``max_turns`` defaults to the env's registered step limit; the env is made with
    ``split=held_out_split(env_id)`` (ARLArena ids) unless ``env_kwargs`` names a split.
    """
    from tqdm.auto import tqdm

    import wrappers

    try:
        spec = gym.spec(env_id)
    except gym.error.Error as err:
        raise EvalError(f"unknown env id {env_id!r}: {err}") from err
    if samples < 1 or not seeds:
        raise EvalError(f"need samples >= 1 and at least one seed, got samples={samples}, {len(seeds)} seeds")
    if env_id in ENV_IDS:  # other registered envs have no split argument
        env_kwargs = {"split": held_out_split(env_id), **(env_kwargs or {})}
    max_turns = max_turns or spec.max_episode_steps or DEFAULT_MAX_TURNS
    label = name or (policy if isinstance(policy, str) else "policy")
    rng = np.random.default_rng(policy_seed)
    env_fn = functools.partial(wrappers.make_env, env_id, history_length, format_penalty, prompt_style,
                               **(env_kwargs or {}))
    turn_stops = Counter(getattr(policy, "stop_counts", {}))
    per_chunk = max(1, max_parallel // samples)
    episodes, start, rollout = [], time.perf_counter(), None
    try:
        with tqdm(total=len(seeds) * samples, desc=f"{label} on {env_id}", unit="ep", disable=not progress) as bar:
            for lo in range(0, len(seeds), per_chunk):
                chunk = [int(s) for s in seeds[lo:lo + per_chunk]]
                if rollout is None or rollout.num_groups != len(chunk):
                    if rollout is not None:
                        rollout.close()
                    workers = auto_env_workers(env_id, len(chunk) * samples) if env_workers < 0 else env_workers
                    rollout = wrappers.GroupRollout(env_fn, len(chunk), samples, workers=workers,
                                                    step_timeout=env_step_timeout, env_id=env_id)
                rollout.reset(chunk)
                if isinstance(policy, str):
                    if policy == "random" and rollout.envs[0].unwrapped.admissible_actions() is None:
                        return EvalResult(label, env_id, len(seeds), samples, available=False,
                                          note="n/a: open action set (admissible_actions is None)")
                    act = _baseline(policy, rollout, rng)
                else:
                    act = policy
                done_before = bar.n
                stops: dict[tuple[int, int], str] = {}

                def tracked(batch: list[Messages], rollout=rollout, act=act, done_before=done_before,
                            stops=stops) -> list[str]:
                    bar.update(done_before + rollout.num_episodes - len(batch) - bar.n)  # episodes finished so far
                    active = rollout.active()
                    if getattr(act, "sampling_seed", None) is None:
                        out = act(batch)
                    else:
                        out = act(batch, seeds=episode_sampling_seeds(act.sampling_seed, rollout, active))
                    played = rollout.episodes()
                    for i, reason in zip(active, getattr(act, "last_stops", None) or []):
                        stops[(i, played[i].length)] = reason
                    return out

                turns = rollout.run(tracked, max_turns)
                bar.update(done_before + rollout.num_episodes - bar.n)
                episodes += rollout.episodes()
                if records is not None:
                    records += _records(env_id, env_kwargs.get("split", "") if env_kwargs else "", label, rollout,
                                        turns, stops, lo * samples)
    finally:  # the workers end on every path out
        if rollout is not None:
            rollout.close()
    turn_stops = Counter(getattr(policy, "stop_counts", {})) - turn_stops
    return summarize(label, env_id, episodes, samples, k_values, time.perf_counter() - start, turn_stops)


def _records(env_id: str, split: str, label: str, rollout, turns: list, stops: dict[tuple[int, int], str],
             first: int) -> list[dict[str, Any]]:
    """The episode records of one chunk of ``evaluate_policy`` (``first``: the chunk's first episode number)."""
    from arena_train.episodes import episode_record

    by_episode: dict[int, list] = defaultdict(list)
    for turn in turns:
        by_episode[turn.episode].append(turn)
    out = []
    for stats in rollout.episodes():
        record = episode_record(env_id=env_id, split=split, source=label, stats=stats, group_size=rollout.group_size,
                                turns=by_episode[stats.episode], group=first // rollout.group_size + stats.group,
                                episode=first + stats.episode)
        for turn in record["turns"]:
            turn["stop"] = turn["stop"] or stops.get((stats.episode, turn["turn"]))
        out.append(record)
    return out


# --- output ----------------------------------------------------------------------------
def _fmt(e: Estimate | None, scale: float = 1.0) -> str:
    if e is None or math.isnan(e.mean):
        return "-"
    return f"{e.mean * scale:.3g} [{e.low * scale:.3g}, {e.high * scale:.3g}]"


def format_results(results: Sequence[EvalResult]) -> str:
    """A Markdown table, one row per policy (95 % intervals in brackets: success Wilson, the other metrics
    Student-t over the ``seeds`` column's task seeds)."""
    ks = sorted({k for r in results for k in r.pass_at_k})
    header = ["policy", "seeds", "episodes", "success %", "score", "return", "length", "valid format %",
              "valid action %", *(f"pass@{k} %" for k in ks)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        if not r.available:
            cells = [r.name, "-", "-", r.note] + ["-"] * (len(header) - 4)
        else:
            cells = [r.name, str(r.num_seeds), str(r.num_seeds * r.samples_per_seed), _fmt(r.success, 100),
                     _fmt(r.score), _fmt(r.episode_return), _fmt(r.length), _fmt(r.valid_format, 100),
                     _fmt(r.valid_action, 100),
                     *(f"{100 * r.pass_at_k[k]:.3g}" if k in r.pass_at_k else "-" for k in ks)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def load_model(spec: str, device: str = "auto", chat_template: str | None = None, chat_template_kwargs: str = ""):
    """(model, tokenizer) from a local folder, a hub id or an arena_models name ('tiny', 'smollm2'), the
    tokenizer's chat format configured as a training run configures it (``arena_train.chat``)."""
    import torch
    from transformers.utils import logging as hf_logging

    from arena_models import resolve_model_path
    from arena_train import chat
    from arena_train.models import load_model_and_tokenizer

    hf_logging.disable_progress_bar()  # keep the evaluation's own progress bar readable
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    path = resolve_model_path(spec)
    try:
        model, tokenizer = load_model_and_tokenizer(
            path, torch.bfloat16 if device.startswith("cuda") else torch.float32)
    except (OSError, ValueError) as err:
        raise EvalError(f"cannot load model {spec!r}: {err}") from err
    problem = chat.template_problem(chat_template, chat_template_kwargs)
    if problem is not None:
        raise EvalError(problem.removeprefix("error: "))
    chat.configure(tokenizer, model.generation_config, chat_template, chat.parse_kwargs(chat_template_kwargs))
    return model.to(device).eval(), tokenizer


@dataclass
class Args:
    """Evaluate a checkpoint and the expert / random baselines on the same task seeds. Settings left unset come
    from the run (--run, or a --model folder inside a run folder: its args.json), else from the training
    scripts' cpu-tiny defaults."""

    run: Path | None = None
    """a training run's folder (runs/<name>): evaluates its final model with the run's own settings"""
    env_id: list[str] | None = None
    """registered env id(s); several = one table per env (e.g. a mixture run's envs); default: the run's"""
    model: str | None = None
    """HF folder or hub id ('tiny', 'smollm2' = offline models); default: the run's final model; omit (without
    --run) to run only the baselines"""
    num_seeds: int | None = None
    """task seeds (episodes per policy = num_seeds × samples); default: the run's --eval-episodes"""
    seed_start: int = EVAL_SEED_OFFSET
    """first task seed (default: the held-out range of the training scripts)"""
    decoding: list[Literal["greedy", "sampled"]] | None = None
    """sampled = ARLArena's validation sampling (temperature, top_p, top_k below); greedy = the option; default:
    the run's (--eval-greedy)"""
    samples: int | None = None
    """episodes per seed for sampled decoding and the random baseline (pass@k needs k <= samples); default: 1 for
    a run (its own evaluation's), else 4"""
    k: list[int] = field(default_factory=lambda: [1])
    """pass@k values (each at most --samples)"""
    baselines: list[Literal["expert", "random"]] = field(default_factory=lambda: ["expert", "random"])
    max_turns: int | None = None
    """turn budget; default: the run's --max-turns"""
    max_new_tokens: int | None = None
    """default: the run's --max-response-tokens"""
    max_prompt_tokens: int | None = None
    """default: the run's --max-prompt-tokens"""
    temperature: float | None = None
    """sampled decoding; default: the run's --eval-temperature (ARLArena validation: T=0.6, top_p 0.95, top_k 20)"""
    top_p: float | None = None
    top_k: int | None = None
    batch_size: int = 64
    """prompts per generate call"""
    history_length: int | None = None
    prompt_style: Literal["arlarena", "full", "compact"] | None = None
    format_penalty: float | None = None
    split: str | None = None
    """env split (default: the run's --eval-split, else the env's held-out split, never the training tasks)"""
    env_kwargs: str = "{}"
    """JSON object of extra env constructor arguments"""
    seed: int | None = None
    """seed of sampling (each episode's stream: arena_train.streams, from this seed, the task seed, the sample
    and the turn) and of the random baseline; default: the run's --seed (its evaluation's streams)"""
    device: str = "auto"
    out: Path | None = None
    """write results JSON here (and the table next to it as .md)"""
    episodes: Path | None = None
    """write every episode of the model and the baselines here as episode records (JSONL; python -m eval.view)"""
    progress: bool = True
    env_workers: int = -1
    """env worker processes (0 = in this process; -1 = auto: one per core for the native engines ALFWorld and
    TextWorld, 0 for the others)"""
    env_step_timeout: float = 300.0
    """seconds an env step may take in a worker before its episode fails (left out and counted)"""
    chat_template: str | None = None
    """a .jinja file or a TRL template name; default: the run's --chat-template, else the tokenizer's own"""
    chat_template_kwargs: str | None = None
    """JSON object for every chat-template call; default: the run's --chat-template-kwargs"""


#: Flags taken from a run's ``args.json`` (or the training defaults): flag -> (args.json key, how to read it).
RUN_SETTINGS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "env_id": ("env_id", lambda v: [v] if isinstance(v, str) else list(v)),
    "history_length": ("history_length", int),
    "prompt_style": ("prompt_style", str),
    "max_new_tokens": ("max_response_tokens", int),
    "max_prompt_tokens": ("max_prompt_tokens", int),
    "max_turns": ("max_turns", int),
    "format_penalty": ("format_penalty", float),
    "temperature": ("eval_temperature", float),
    "top_p": ("eval_top_p", float),
    "top_k": ("eval_top_k", int),
    "decoding": ("eval_greedy", lambda v: ["greedy"] if v else ["sampled"]),
    "num_seeds": ("eval_episodes", int),
    "seed": ("seed", int),
    "split": ("eval_split", lambda v: v),
    "chat_template": ("chat_template", str),
    "chat_template_kwargs": ("chat_template_kwargs", str),
}


def training_defaults() -> dict[str, Any]:
    """The training scripts' cpu-tiny settings, as a run's ``args.json`` holds them: the literal defaults of
    ``algos/grpo.py``'s ``Args``, read from its source (scripts are run or forked, never imported), and the
    evaluation and engine groups' (``arena_train.cli.EvalArgs``, ``EngineArgs``: the chat template)."""
    import ast
    from dataclasses import fields

    from arena_train.cli import EngineArgs, EvalArgs

    source = (Path(__file__).resolve().parents[1] / "algos" / "grpo.py").read_text()
    args_class = next(node for node in ast.parse(source).body
                      if isinstance(node, ast.ClassDef) and node.name == "Args")
    defaults: dict[str, Any] = {f.name: getattr(group(), f.name) for group in (EngineArgs, EvalArgs)
                                for f in fields(group)}
    for node in args_class.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None):
            continue
        value = node.value
        if isinstance(value, ast.Call) and value.keywords and isinstance(value.keywords[0].value, ast.Lambda):
            value = value.keywords[0].value.body  # field(default_factory=lambda: [...])
        try:
            defaults[node.target.id] = ast.literal_eval(value)
        except ValueError:  # a computed default (exp_name, model_path, groups): not an evaluation setting
            continue
    return defaults


def run_record(args: Args) -> tuple[Path | None, dict[str, Any] | None]:
    """(run folder, its args.json) of ``--run``, or of the run folder holding ``--model`` (the folder or one of
    its two parents: runs/<name>/final, a checkpoint below it); (None, None) without one."""
    candidates = [args.run] if args.run is not None else (
        [Path(args.model), *list(Path(args.model).parents)[:2]] if args.model is not None else [])
    for folder in candidates:
        record = folder / "args.json"
        if record.is_file():
            try:
                config = json.loads(record.read_text())
            except ValueError as err:
                raise EvalError(f"{record} is not JSON ({err})") from None
            if isinstance(config, dict):
                return folder, config
    if args.run is not None:
        raise EvalError(f"{args.run} holds no args.json: pass a training run's folder (runs/<name>) or --model")
    return None, None


def resolve_settings(args: Args) -> tuple[Args, list[str]]:
    """``args`` with every unset setting taken from the run's record, else the training defaults -> (the settings,
    lines to print: where they came from and every flag that differs from the run's)."""
    from dataclasses import replace

    folder, config = run_record(args)
    notes = []
    if config is None:
        config, source = training_defaults(), "the training scripts' cpu-tiny defaults (no run record)"
    else:
        source = f"the run {folder} (args.json)"
        missing = [key for key, _ in RUN_SETTINGS.values() if key not in config]
        if missing:  # a run from before these fields: the training defaults fill them
            config = {**training_defaults(), **config}
            source += f", with the training defaults for {', '.join(missing)}"
        if args.model is None:
            final = folder / "final"
            if not (final / "config.json").is_file():
                raise EvalError(f"{folder} has no final model ({final}); pass --model")
            args = replace(args, model=str(final))
    values = {}
    for name, (key, read) in RUN_SETTINGS.items():
        given = getattr(args, name)
        if name == "env_id" and isinstance(given, str):  # one id given as a string (the importable API)
            given = values[name] = [given]
        recorded = read(config[key]) if config.get(key) is not None else None
        if given is None:
            values[name] = recorded
        elif recorded is not None and given != recorded and folder is not None:
            notes.append(f"note: --{name.replace('_', '-')} {given} differs from the run's {recorded} "
                         f"(its --{key.replace('_', '-')}); using {given}")
    if args.samples is None:
        values["samples"] = 1 if folder is not None else 4
    resolved = replace(args, **values)
    used = {name: getattr(resolved, name) for name in [*RUN_SETTINGS, "samples"]}
    notes.insert(0, f"settings from {source}: " + ", ".join(f"{k}={v}" for k, v in used.items()))
    return resolved, notes


def main(args: Args) -> int:
    try:
        args, notes = resolve_settings(args)
    except EvalError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    env_ids = list(args.env_id)
    problem = (next(filter(None, map(env_id_problem, env_ids)), None) if env_ids else "error: --env-id needs an id")
    problem = problem or (model_path_problem(args.model) if args.model is not None else None)
    bad_k = [k for k in args.k if k > args.samples or k < 1]
    if problem is None and bad_k:
        problem = (f"error: --k {' '.join(map(str, bad_k))} needs 1 <= k <= --samples {args.samples}: raise "
                   f"--samples to {max(bad_k)} or drop that k")
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    for line in notes:
        print(line)
    try:
        env_kwargs = json.loads(args.env_kwargs)
        if not isinstance(env_kwargs, dict):
            raise ValueError("not a JSON object")
    except ValueError as err:
        print(f"error: --env-kwargs: {err}", file=sys.stderr)
        return 2
    if args.split is not None:
        env_kwargs["split"] = args.split
    seeds = list(range(args.seed_start, args.seed_start + args.num_seeds))
    results: list[EvalResult] = []
    tables, splits = [], {}
    records: list[dict[str, Any]] | None = [] if args.episodes is not None else None
    try:
        model, tokenizer = (load_model(args.model, args.device, args.chat_template, args.chat_template_kwargs or "")
                            if args.model is not None else (None, None))
        for env_id in env_ids:
            kwargs = {"split": held_out_split(env_id), **env_kwargs} if env_id in ENV_IDS else dict(env_kwargs)
            splits[env_id] = kwargs.get("split", "no")
            common = dict(max_turns=args.max_turns, k_values=args.k, env_kwargs=kwargs,
                          history_length=args.history_length, format_penalty=args.format_penalty,
                          prompt_style=args.prompt_style, policy_seed=args.seed, progress=args.progress,
                          env_workers=args.env_workers, env_step_timeout=args.env_step_timeout, records=records)
            mine: list[EvalResult] = []
            for decoding in args.decoding if model is not None else []:
                greedy = decoding == "greedy"
                policy = hf_policy(model, tokenizer, greedy, args.temperature, args.top_p, args.top_k,
                                   args.max_new_tokens, args.max_prompt_tokens, args.batch_size, args.seed)
                mine.append(evaluate_policy(env_id, policy, seeds, samples=1 if greedy else args.samples,
                                            name=decoding, **common))
            for kind in args.baselines:
                mine.append(evaluate_policy(env_id, kind, seeds, samples=1 if kind == "expert" else args.samples,
                                            **common))
            results += mine
            tables.append((env_id, format_results(mine)))
    except EvalError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for env_id, table in tables:
        print(f"\n{env_id} ({splits[env_id]} split), seeds {seeds[0]}..{seeds[-1]}, model {args.model}\n\n{table}")
    for r in results:
        if r.failed_episodes:
            print(f"{r.name} on {r.env_id}: {r.failed_episodes} episodes ended on an env error and are left out")
    if records is not None:
        from arena_train.episodes import write_episodes

        kept = write_episodes(args.episodes, records)
        print(f"episodes: {kept} records in {args.episodes} (python -m eval.view {args.episodes})")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"env_id": env_ids[0] if len(env_ids) == 1 else env_ids, "model": args.model, "seeds": seeds,
                  "args": asdict(args), "results": [r.as_dict() for r in results]}
        args.out.write_text(json.dumps(record, indent=2, default=str))
        markdown = tables[0][1] if len(tables) == 1 else "".join(
            f"## {env_id} ({splits[env_id]} split)\n\n{table}\n" for env_id, table in tables)
        args.out.with_suffix(".md").write_text(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main(tyro.cli(Args)))
