"""Several environments in one run: ``--env-id ARL/Sokoban-Mini-v0 ARL/WebShop-v0 --env-weights 0.5 0.5``.

A ``Mixture`` is the run's env ids and their sampling weights; ``MixtureRollout`` holds this process's group
rollouts of every env and collects an iteration's rows and its held-out evaluation.

* Allocation: each iteration draws its ``num_groups`` groups (over all processes) from the envs by weight, the
  same on every process: env ``k`` gets ``floor(num_groups * w_k)`` groups plus one more with probability equal to
  the fractional part (systematic sampling over the fractional parts with one uniform draw seeded by (seed,
  iteration, attempt)). The counts are exact in expectation (``num_groups * w_k``), never more than one group away
  from it, and an env with weight > 0 gets groups over time however small its share; a weight of 0 is never
  drawn (the env is still evaluated: a held-out transfer env). The groups are laid out env by env and process
  ``rank`` takes every ``world``-th one, like ``task_seeds``; the task seeds are ``task_seeds``' own, so a
  single id rolls out exactly the groups it rolled out before mixtures existed.
* A group never mixes envs: each env is played by its own ``GroupRollout`` and each env's rows get group and
  episode ids in their own range (``collect``), so every method that groups by ``row.group`` (GRPO groups,
  GiGPO anchor groups, dynamic sampling) never groups across envs. Rows and episodes carry their env's short name
  (``EnvRow.env``, ``EnvEpisode.env``) for the per-env metrics (``arena_train.logger.env_metrics``).
* Per-env budgets: when a run's ``--max-turns`` / ``--max-prompt-tokens`` is the largest recipe value of its envs
  (``arena_envs.env_recipe``; what ``--profile gpu`` sets for a mixture), each env takes its own recipe value;
  any other value (the cpu-tiny default, or a flag) applies to every env. An env's registered step limit ends its
  episodes anyway, so a larger turn budget never lengthens them.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from arena_envs.pool import EnvError, EnvPool, EnvServers, LocalEnvs, served_env
from arena_train.episodes import EpisodeRecorder, TurnTap, episode_record, turn_rows
from arena_train.rollout import (
    EVAL_SEED_OFFSET,
    RolloutConfig,
    Row,
    collect_rows,
    eval_split_of,
    held_out_seeds,
    require_messages_fit,
    task_seeds,
)
from wrappers.groups import EpisodeStats, GroupRollout

#: Stream id of the allocation's random draw (kept apart from ``task_seeds``' stream of the same key).
_ALLOCATION_STREAM = 7
#: The per-env budget fields (``RolloutConfig`` and ``arena_envs.env_recipe`` names).
BUDGET_FIELDS = ("max_turns", "max_prompt_tokens")


def env_name(env_id: str) -> str:
    """Short name of an env id in metric names: namespace, module and version dropped (ARL/WebShop-v0 -> WebShop)."""
    return re.sub(r"-v\d+$", "", env_id.split(":")[-1].split("/")[-1])


def env_id_problem(env_id: str) -> str | None:
    """Why ``env_id`` cannot be made here: not registered (the message lists ARLArena's ids) or its extra
    missing. Ids registered by other code (a test's env, a fork's) pass."""
    import gymnasium as gym

    import arena_envs

    if ":" in env_id:  # "module:Id" registers itself on import
        return None
    if env_id not in gym.registry:
        return f"error: unknown env id {env_id!r}; registered ids: {', '.join(arena_envs.ENV_IDS)}"
    extra = arena_envs.missing_extra(env_id) if env_id in arena_envs.ENV_IDS else None
    return f"error: {env_id} needs the {extra} extra: pip install 'arlarena[{extra}]'" if extra else None


def as_env_ids(env_id: str | Sequence[str]) -> list[str]:
    """``--env-id`` as a list (a plain string is one id)."""
    return [env_id] if isinstance(env_id, str) else list(env_id)


def mixture_problem(env_id: str | Sequence[str], env_weights: Sequence[float] | None = None,
                    check_registry: bool = True) -> str | None:
    """Why ``--env-id`` / ``--env-weights`` cannot make a mixture (one line that says what to do), or None."""
    ids = as_env_ids(env_id)
    if not ids:
        return "error: --env-id needs at least one env id"
    for i, a in enumerate(ids):
        for b in ids[:i]:
            if a == b:
                return f"error: --env-id lists {a} twice; give each env once and weigh it with --env-weights"
            if env_name(a) == env_name(b):
                return f"error: --env-id {b} and {a} share the metric name {env_name(a)!r}; mix only one of them"
    if env_weights is not None:
        if len(env_weights) != len(ids):
            return (f"error: --env-weights has {len(env_weights)} values for {len(ids)} --env-id ids; give one weight "
                    f"per id")
        if any(not math.isfinite(w) or w < 0 for w in env_weights):
            return f"error: --env-weights must be finite and >= 0 (got {' '.join(map(str, env_weights))})"
        if sum(env_weights) <= 0:
            return "error: --env-weights must not all be 0"
    if check_registry:
        return next((p for p in map(env_id_problem, ids) if p is not None), None)
    return None


@dataclass(frozen=True)
class Mixture:
    """The envs of a run and their sampling weights (normalised to sum 1); one id is a mixture of one."""

    env_ids: tuple[str, ...]
    weights: tuple[float, ...]

    @classmethod
    def parse(cls, env_id: str | Sequence[str], env_weights: Sequence[float] | None = None,
              check_registry: bool = True) -> Mixture:
        """The mixture of ``--env-id`` and ``--env-weights`` (default: equal weights); a problem is a one-line
        ``SystemExit`` (``mixture_problem``)."""
        problem = mixture_problem(env_id, env_weights, check_registry)
        if problem is not None:
            raise SystemExit(problem)
        ids = as_env_ids(env_id)
        raw = [1.0] * len(ids) if env_weights is None else [float(w) for w in env_weights]
        return cls(tuple(ids), tuple(w / sum(raw) for w in raw))

    @property
    def names(self) -> tuple[str, ...]:
        """The envs' short names (``env/<name>/...`` metrics)."""
        return tuple(env_name(e) for e in self.env_ids)

    @property
    def label(self) -> str:
        """The envs in a run name: ``ARL_Sokoban-Mini-v0`` for one id (as before mixtures), ids joined by '+'."""
        return "+".join(e.replace("/", "_") for e in self.env_ids)

    def allocate(self, num_groups: int, seed: int, iteration: int, attempt: int = 0) -> list[int]:
        """The env index of each of an iteration's ``num_groups`` groups over all processes, env by env
        (systematic sampling of the fractional parts; see the module docstring). No random draw for one env."""
        expected = num_groups * np.asarray(self.weights)
        counts = np.floor(expected).astype(np.int64)
        remainder = num_groups - int(counts.sum())
        if remainder > 0:
            bounds = np.cumsum(expected - counts)
            bounds[-1] = remainder  # the fractional parts sum to the remainder; no rounding error past the end
            u = np.random.default_rng([seed, iteration, attempt, _ALLOCATION_STREAM]).random()
            np.add.at(counts, np.searchsorted(bounds, u + np.arange(remainder), side="right"), 1)
        return [k for k, n in enumerate(counts.tolist()) for _ in range(n)]

    def task_seeds(self, seed: int, iteration: int, num_groups: int, rank: int, world: int,
                   attempt: int = 0) -> list[tuple[int, int]]:
        """(env index, task seed) of this process's groups: ``allocate``'s envs and ``rollout.task_seeds``'
        seeds, both sliced ``[rank::world]`` (one env: exactly ``task_seeds``)."""
        envs = self.allocate(num_groups, seed, iteration, attempt)[rank::world]
        return list(zip(envs, task_seeds(seed, iteration, num_groups, rank, world, attempt)))

    def rollout_config(self, index: int, base: RolloutConfig) -> RolloutConfig:
        """``base`` with env ``index``'s own turn and prompt budgets where ``base`` holds the largest recipe value
        of the mixture's envs; any other value of ``base`` applies to every env (module docstring)."""
        from arena_envs import env_recipe

        recipes = [env_recipe(e) for e in self.env_ids]
        own = {}
        for key in BUDGET_FIELDS:
            values = [r.get(key) for r in recipes]
            if None not in values and getattr(base, key) == max(values):
                own[key] = values[index]
        return replace(base, **own)

    def record(self) -> dict[str, Any]:
        """What ``args.json`` holds of the mixture (the ``--env-id`` / ``--env-weights`` fields)."""
        return {"env_id": list(self.env_ids), "env_weights": list(self.weights)}

    def differs_from(self, saved: Mixture) -> str | None:
        """How this mixture differs from ``saved`` (ids or normalised weights), as part of a sentence, or None."""
        if saved.env_ids != self.env_ids:
            return f"it trains on --env-id {' '.join(saved.env_ids)}, not {' '.join(self.env_ids)}"
        if not np.allclose(saved.weights, self.weights, rtol=0, atol=1e-9):
            def text(ws):
                return " ".join(f"{w:g}" for w in ws)
            return f"its --env-weights are {text(saved.weights)} (normalised), not {text(self.weights)}"
        return None


def resume_problem(run_dir: Path, mixture: Mixture) -> str | None:
    """Why ``--resume`` of ``run_dir`` with ``mixture`` would continue a different mixture (one line that says what
    to do), or None. The run's mixture is read from its ``args.json`` (a run from before mixtures has one id)."""
    try:
        config = json.loads((run_dir / "args.json").read_text())
    except (OSError, ValueError):
        return None  # nothing recorded: nothing to compare
    if not isinstance(config, dict) or config.get("env_id") is None:
        return None
    saved = Mixture.parse(config["env_id"], config.get("env_weights"), check_registry=False)
    difference = mixture.differs_from(saved)
    if difference is None:
        return None
    return (f"error: cannot resume {run_dir}: {difference}; pass the run's own --env-id and --env-weights to continue "
            f"it, or --overwrite (or another --run-name) to train the new mixture from the start")


def check_resume(accelerator, run_dir: Path, mixture: Mixture) -> None:
    """``resume_problem`` on the main process, a one-line ``SystemExit`` on every process; call before the
    metrics logger rewrites ``args.json``."""
    from accelerate.utils import broadcast_object_list

    problem: list[str | None] = [resume_problem(run_dir, mixture) if accelerator.is_main_process else None]
    if accelerator.num_processes > 1:
        broadcast_object_list(problem)
    if problem[0] is not None:
        raise SystemExit(problem[0] if accelerator.is_main_process else 1)


@dataclass
class EnvRow(Row):
    """A ``Row`` tagged with its env's short name."""

    env: str = ""


@dataclass
class EnvEpisode(EpisodeStats):
    """A ``wrappers.EpisodeStats`` tagged with its env's short name."""

    env: str = ""


def _tagged(cls, record, **values):
    """A copy of the dataclass ``record`` as ``cls`` (its subclass), with ``values`` set."""
    return cls(**{**{f.name: getattr(record, f.name) for f in fields(record)}, **values})


class MixtureRollout:
    """This process's group rollouts of every env of ``mixture``: ``num_groups`` (this process's groups per
    iteration) x ``group_size`` training episodes at most per env, and ``eval_episodes`` (this process's share)
    held-out episodes per env. ``make_env(env_id, split=...)`` builds one wrapped env.

    ``env_workers`` (``--env-workers``): 0 runs the envs in this process; N >= 1 in N worker processes per env and
    split (``arena_envs.pool.EnvPool``; ``make_env`` must then pickle, e.g. a ``functools.partial`` of
    ``wrappers.make_env``); -1 = auto (``arena_envs.auto_env_workers``: workers for the native engines).
    ``step_timeout`` (``--env-step-timeout``, workers only): seconds a step may take before its episode fails.
    ``env_servers`` (``--env-servers``): OpenEnv server URLs that play the training episodes
    (``arena_envs.pool.EnvServers``); held-out evaluation stays in this machine's envs.
    ``sampling_seed``: the training rollouts' per-episode streams of the current iteration
    (``arena_train.streams.training_seed``, which ``Run.iterations`` sets with ``--episode-streams``); None: the
    backend's own stream. ``overlap_turns`` (``--overlap-turns``): training rollouts overlap generation with env
    steps (``collect_rows``' ``overlap``).

    The training envs of an env are made when an iteration first draws that many of its groups (for one id:
    all of them here, as ``GroupRollout`` did) and reused afterwards. ``close`` ends the workers (they also end
    with the process).

    ``recorder`` (set by ``Run.rollouts``): an ``arena_train.episodes.EpisodeRecorder`` that receives the first
    training episodes of each iteration and every held-out episode (None: no records)."""

    def __init__(self, mixture: Mixture, make_env: Callable[..., Any], num_groups: int, group_size: int,
                 eval_episodes: int, eval_split: str | None = None, env_workers: int = 0,
                 step_timeout: float | None = None, env_servers: Sequence[str] = (), overlap_turns: bool = False):
        self.mixture, self.make_env, self.env_servers = mixture, make_env, list(env_servers)
        self.overlap_turns = overlap_turns
        self.sampling_seed: int | None = None
        self.num_groups, self.group_size = num_groups, group_size
        self._rollouts: dict[tuple[int, int], GroupRollout] = {}
        self.recorder: EpisodeRecorder | None = None
        self.eval_splits = splits = [eval_split_of(e, eval_split) for e in mixture.env_ids]  # never 'train'
        self._runners = [self._runner(e, "train", num_groups * group_size, env_workers, step_timeout)
                         for e in mixture.env_ids]
        if len(mixture.env_ids) == 1:
            self.rollout(0, num_groups)
        self.eval_rollouts = [GroupRollout(self._runner(e, s, eval_episodes, env_workers, step_timeout),
                                           eval_episodes, 1, env_id=e) for e, s in zip(mixture.env_ids, splits)]

    def _runner(self, env_id: str, split: str, slots: int, workers: int, timeout: float | None):
        from arena_envs import auto_env_workers

        if split == "train" and self.env_servers:
            return EnvServers(functools.partial(served_env, self.make_env, env_id), self.env_servers, slots, timeout)
        env_fn = functools.partial(self.make_env, env_id, split=split)
        workers = auto_env_workers(env_id, slots) if workers < 0 else workers
        return EnvPool(env_fn, slots, workers=workers, timeout=timeout) if workers > 0 else LocalEnvs(env_fn)

    def rollout(self, index: int, num_groups: int) -> GroupRollout:
        """A ``GroupRollout`` of ``num_groups`` groups of env ``index`` (made envs are reused)."""
        key = (index, num_groups)
        if key not in self._rollouts:
            self._rollouts[key] = GroupRollout(self._runners[index], num_groups, self.group_size,
                                               env_id=self.mixture.env_ids[index])
        return self._rollouts[key]

    def require_prompts_fit(self, tokenizer, config: RolloutConfig, seed: int) -> None:
        """``rollout.require_prompt_fits`` for every env with its own prompt budget (on its first env)."""
        for k, env_id in enumerate(self.mixture.env_ids):
            runner = self._runners[k]
            runner.ensure(1)
            result = runner.reset_many({0: {"seed": seed}})[0]
            if isinstance(result, EnvError):
                raise SystemExit(f"error: {env_id} failed to reset: {result.error}\n{result.traceback}")
            require_messages_fit(tokenizer, result[1].get("messages"), env_id,
                                 self.mixture.rollout_config(k, config).max_prompt_tokens)

    def last_error(self) -> tuple[str, EnvError] | None:
        """The env id and error of the latest env failure of the training rollouts, or None."""
        for rollout in self._rollouts.values():
            if rollout.last_error is not None:
                return rollout.env_id, rollout.last_error
        return None

    def collect(self, backend, tokenizer, tasks: list[tuple[int, int]], config: RolloutConfig,
                stats: dict[str, float], greedy: bool = False, id_offset: int = 0
                ) -> tuple[list[EnvRow], list[EnvEpisode]]:
        """``collect_rows`` of the (env index, task seed) groups ``tasks`` (``Mixture.task_seeds``): one call per
        env that has groups, in env order, with that env's budgets (``Mixture.rollout_config``). Env ``k``'s
        group and episode ids start at ``id_offset`` plus the episodes of the envs before it, so ids stay unique
        over the envs and stay below ``id_offset + len(tasks) * group_size`` (a resampling loop passes
        ``id_offset = attempt * len(tasks) * group_size``). Episodes carry the ids of their rows."""
        rows: list[EnvRow] = []
        episodes: list[EnvEpisode] = []
        offset = id_offset
        for k, name in enumerate(self.mixture.names):
            seeds = [s for env, s in tasks if env == k]
            if not seeds:
                continue
            rollout = self.rollout(k, len(seeds))
            tap = TurnTap(rollout) if self.recorder is not None and self.recorder.train_wanted > 0 else None
            env_rows, env_episodes = collect_rows(backend, tokenizer, tap or rollout, seeds,
                                                  self.mixture.rollout_config(k, config), stats, greedy, offset,
                                                  sampling_seed=self.sampling_seed, overlap=self.overlap_turns)
            tagged = [_tagged(EnvRow, r, env=name) for r in env_rows]
            if tap is not None:  # the tagged rows are those the script fills with advantages
                self.recorder.add_train(env_id=self.mixture.env_ids[k], split="train", tap=tap, episodes=env_episodes,
                                        rows=tagged, id_offset=offset, group_size=self.group_size)
            rows += tagged
            episodes += [_tagged(EnvEpisode, e, env=name, episode=e.episode + offset, group=e.group + offset)
                         for e in env_episodes]
            offset += len(seeds) * self.group_size
        return rows, episodes

    def evaluate(self, accelerator, backend, tokenizer, config: RolloutConfig, eval_episodes: int, rank: int,
                 world: int, greedy: bool = False, seed: int | None = None) -> dict[str, float]:
        """Held-out evaluation of every env on its ``held_out_seeds``: ``eval/success_rate`` over all envs' episodes
        (every env plays as many) and, for two envs or more, ``eval/<name>/success_rate``; pooled over processes.
        ``seed`` (the run's): sampled decoding draws each episode's tokens from its own stream
        (``collect_rows``' ``sampling_seed``), so an episode's result does not depend on the split over processes,
        batches or env workers; None: the backend's own stream.
        An episode that fails on an env error is replayed once, then left out of the success rates
        (``eval/failed_episodes`` counts those); ``eval/stop/...`` are the stop-reason fractions. With a
        ``recorder``, every held-out episode's record goes to it (gathered on the main process)."""
        from arena_train.dist import global_mean
        from arena_train.logger import pooled_means, stop_metrics

        seeds = held_out_seeds(eval_episodes, rank, world)
        wins: dict[str, list[float]] = {}
        stats: dict[str, float] = defaultdict(float)
        records: list[dict] = []
        for k, name in enumerate(self.mixture.names):
            tap = TurnTap(self.eval_rollouts[k]) if self.recorder is not None else None
            rows, held_out = collect_rows(backend, tokenizer, tap or self.eval_rollouts[k], seeds,
                                          self.mixture.rollout_config(k, config), stats, greedy=greedy,
                                          sampling_seed=seed)
            wins[f"eval/{name}/success_rate"] = [float(e.won) for e in held_out]
            if tap is not None:
                by_turn = turn_rows(rows, 0)
                records += [episode_record(env_id=self.mixture.env_ids[k], split=self.eval_splits[k], source="eval",
                                           stats=e, group_size=1, turns=tap.turns.get(e.episode, []), rows=by_turn,
                                           group=e.task_seed - EVAL_SEED_OFFSET, episode=e.task_seed - EVAL_SEED_OFFSET)
                            for e in held_out]
        if self.recorder is not None:
            if world > 1:
                from accelerate.utils import gather_object

                records = gather_object(records)
            if accelerator.is_main_process:
                self.recorder.add_eval(records)
        out = {"eval/success_rate": global_mean(accelerator, [w for ws in wins.values() for w in ws])}
        if len(wins) > 1:
            out.update(pooled_means(accelerator, wins))
        for key, value in stop_metrics(accelerator, stats).items():  # a held-out group is one episode
            out[f"eval/{key}" if key.startswith("stop/") else key.replace("rollout/", "eval/")] = value
        out["eval/failed_episodes"] = out.pop("eval/dropped_groups")
        out.pop("eval/retried_groups")
        return out

    def close(self) -> None:
        """Close every env and end the workers."""
        for runner in [*self._runners, *(r.runner for r in self.eval_rollouts)]:
            runner.close()


class EnvRatios:
    """Each env's importance ratios in an update (``env/<name>/ratio_out_frac``, ``env/<name>/approx_kl``): the
    share of its loss tokens whose ratio π/π_old lies outside the clip band, and its mean log(π_old/π)."""

    def __init__(self):
        self.sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # out of band, tokens, log-ratio

    def add(self, rows: list, logp, old_logp, mask, clip_low: float, clip_high: float) -> None:
        """One micro-batch: rows (B,) carrying ``env``, (B, T) log-probs, old log-probs and loss mask."""
        import torch

        with torch.no_grad():
            log_ratio = torch.clamp(logp - old_logp, -20.0, 20.0)
            ratio = torch.exp(log_ratio)
            outside = ((ratio < 1 - clip_low) | (ratio > 1 + clip_high)).float() * mask
            for b, row in enumerate(rows):
                sums = self.sums[row.env]
                sums[0] += float(outside[b].sum())
                sums[1] += float(mask[b].sum())
                sums[2] += float((-log_ratio[b] * mask[b]).sum())

    def metrics(self, accelerator, names: Sequence[str]) -> dict[str, float]:
        """Pooled over the processes in one reduction, in the mixture's env order (nan for an env without tokens)."""
        import torch

        totals = accelerator.reduce(torch.tensor([self.sums[name] for name in names], dtype=torch.float64,
                                                 device=accelerator.device), reduction="sum")
        out = {}
        for name, (outside, tokens, neg_log_ratio) in zip(names, totals.tolist()):
            out[f"env/{name}/ratio_out_frac"] = outside / tokens if tokens else math.nan
            out[f"env/{name}/approx_kl"] = neg_log_ratio / tokens if tokens else math.nan
        return out


class FailureStreak:
    """``--max-env-failures``: the consecutive iterations whose env errors dropped a group (``rollout/dropped_groups``
    > 0, pooled: the same count on every process). At ``limit`` (0 = never) ``update`` returns the one-line reason
    to stop, naming the env and its last error; the run then ends on its last checkpoint."""

    def __init__(self, limit: int, rollouts: MixtureRollout):
        self.limit, self.rollouts, self.count = int(limit), rollouts, 0

    def update(self, metrics: dict[str, float]) -> str | None:
        self.count = self.count + 1 if metrics.get("rollout/dropped_groups", 0.0) > 0 else 0
        if not self.limit or self.count < self.limit:
            return None
        last = self.rollouts.last_error()
        where = f"; last: {last[0]}: {last[1].error}" if last is not None else ""
        return (f"error: env errors dropped groups in {self.count} consecutive iterations (--max-env-failures "
                f"{self.limit}){where}; the run stops on its last checkpoint: fix the env, then --resume")
