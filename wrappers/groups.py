"""``GroupRollout``: run G episodes of the same task for many tasks side by side.

Episode ``i`` belongs to group ``i // group_size``; all episodes of a group are reset
with the group's task seed, so they start from the identical state (the premise of
GRPO/GiGPO group baselines). Only active episodes are stepped and handed to the
policy; an episode ends on ``terminated``/``truncated`` or after ``max_turns``.

Why a plain list of envs and not ``gymnasium.vector``: vector envs autoreset finished
sub-envs and step all of them in lock-step, stack infos into arrays keyed by
``_key`` masks, and are built for numeric observations. Here observations are text,
infos are rich dicts (chat messages, anchors), episodes finish at different turns and
must then stay finished until the next ``reset``, and the expensive part is the LLM
call, not env stepping — so a list of envs stepped in a Python loop is both simpler
and as fast. Envs are created once and reused across ``reset`` calls.

Where the envs run is ``arena_envs.pool``'s choice: in this process (``LocalEnvs``) or in worker processes
(``EnvPool``, ``workers >= 1``), stepped as one batch either way. ``start_step`` sends a batch of actions to the
workers and returns at once; the ``step`` that follows with the same responses collects their results, so that the
trainer can generate for other episodes meanwhile (``arena_train.rollout.collect_rows``' ``overlap``) and every
turn still comes out of ``step`` (what wrappers of a rollout watch: ``arena_train.episodes.TurnTap``).
An env that raises in ``reset``/``step``, a crashed worker or a step past the timeout ends that episode as failed
(``EpisodeStats.stop == "env_error"``, ``failures()``); the caller decides what becomes of its group
(``arena_train.rollout.collect_rows``: retried once, else dropped). The first traceback of each kind is printed
once per process.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from arena_envs.pool import EnvError, EnvPool, LocalEnvs, Pending

Messages = list[dict[str, str]]

#: Error kinds whose first traceback this process has printed.
_REPORTED: set[str] = set()


@dataclass
class Turn:
    """One (episode, turn) row: the prompt the policy saw, its response and the outcome."""

    episode: int
    group: int
    turn: int  # 0-based index within the episode
    messages: Messages
    response: str
    env_reward: float  # env reward of this step, before the format penalty
    format_penalty: float  # penalty subtracted on this step (0.0 or the wrapper's penalty)
    format_ok: bool
    action_is_valid: bool
    anchor: Hashable  # anchor of the state this response acted on
    won: bool
    done: bool  # the episode ended with this turn (terminated, truncated, max_turns or an env error)
    action: str | None = None  # action the env received (projection "strict": None if the response was malformed)
    terminated: bool = False  # env reached a terminal state (vs. truncated / turn budget)
    env_error: bool = False  # the env failed on this step (the episode failed; rewards are 0)

    @property
    def reward(self) -> float:
        """Training reward of this step: env reward minus the format penalty."""
        return self.env_reward - self.format_penalty


@dataclass
class EpisodeStats:
    episode: int
    group: int
    task_seed: int
    episode_return: float = 0.0  # sum of Turn.reward
    env_return: float = 0.0  # sum of env rewards (no penalties)
    length: int = 0
    won: bool = False
    done: bool = False
    num_valid_format: int = 0
    num_valid_action: int = 0
    stop: str = ""  # why it ended: won, terminated, max_turns, truncated, env_error ("" while it runs)


class GroupRollout:
    """``num_groups × group_size`` episodes over envs built by ``env_fn`` (e.g. ``wrappers.make_env``).

    ``env_fn`` should return the standard stack (``PromptHistory`` outermost) so that
    info carries ``messages``, ``anchor``, ``format_ok``, ``env_reward`` and ``format_penalty``.
    ``env_fn`` may also be a ``LocalEnvs`` / ``EnvPool`` (several rollouts sharing one set of envs: this one uses
    its first slots); else ``workers >= 1`` runs the envs in that many worker processes (``env_fn`` must then
    pickle: ``functools.partial(wrappers.make_env, ...)``) with ``step_timeout`` seconds per step.
    ``env_id`` names the env in error messages.
    """

    def __init__(self, env_fn: Callable[[], gym.Env] | LocalEnvs | EnvPool, num_groups: int, group_size: int,
                 workers: int = 0, step_timeout: float | None = None, env_id: str = ""):
        if num_groups < 1 or group_size < 1:
            raise ValueError(f"num_groups and group_size must be >= 1, got {num_groups}, {group_size}")
        self.num_groups, self.group_size = int(num_groups), int(group_size)
        n = self.num_groups * self.group_size
        if isinstance(env_fn, (LocalEnvs, EnvPool)):
            self.runner = env_fn
            self.runner.ensure(n)
        elif workers > 0:
            self.runner = EnvPool(env_fn, n, workers=workers, timeout=step_timeout)
        else:
            self.runner = LocalEnvs(env_fn, n)
        self.env_id = env_id
        self._n = n
        self._messages: list[Messages] = []
        self._shorter: list[list[Messages]] = []
        self._anchors: list[Hashable] = []
        self._active: list[bool] = []
        self._stats: list[EpisodeStats] = []
        self._failures: dict[int, EnvError] = {}
        self._started: dict[int, tuple[str, Pending]] = {}  # episode -> (its action, its pending batch)
        self.last_error: EnvError | None = None

    @property
    def envs(self) -> list[Any]:
        """The episodes' envs (a worker's env: a stand-in whose ``unwrapped`` reaches it)."""
        return self.runner.envs[:self._n]

    @property
    def num_episodes(self) -> int:
        return self._n

    def group_of(self, episode: int) -> int:
        return episode // self.group_size

    def reset(self, task_seeds: Sequence[int], groups: Sequence[int] | None = None) -> None:
        """Start every episode of ``groups`` (default: all); group g uses ``task_seeds[g]``. Episodes of other
        groups stay inactive (a retry replays only the failed groups)."""
        if len(task_seeds) != self.num_groups:
            raise ValueError(f"need {self.num_groups} task seeds, got {len(task_seeds)}")
        play = set(range(self.num_groups) if groups is None else groups)
        for pending in {id(p): p for _, p in self._started.values()}.values():  # an abandoned rollout's batches
            self.runner.collect(pending)
        self._started = {}
        self._messages, self._shorter, self._anchors = [[] for _ in range(self._n)], [[]] * self._n, [None] * self._n
        self._active, self._failures = [False] * self._n, {}
        self._stats = [EpisodeStats(episode=i, group=self.group_of(i), task_seed=int(task_seeds[self.group_of(i)]))
                       for i in range(self._n)]
        results = self.runner.reset_many({i: {"seed": self._stats[i].task_seed} for i in range(self._n)
                                          if self.group_of(i) in play})
        for i, result in results.items():
            if isinstance(result, EnvError):
                self._fail(i, result)
                continue
            obs, info = result
            self._messages[i] = _messages(obs, info)
            self._shorter[i] = info.get("shorter_messages", [])
            self._anchors[i] = info.get("anchor", str(obs).strip())
            self._active[i] = True

    def _fail(self, i: int, error: EnvError) -> None:
        stats = self._stats[i]
        stats.stop, stats.done, stats.won = "env_error", True, False
        self._active[i] = False
        self._failures[i] = self.last_error = error
        if error.kind not in _REPORTED:
            _REPORTED.add(error.kind)
            print(f"env error in {self.env_id or 'an env'} (episode {i}, task seed {stats.task_seed}): {error.error}"
                  f"\n{error.traceback}(the episode failed and its group leaves the update; later errors of kind "
                  f"{error.kind!r} are counted in rollout/env_errors, not printed)", file=sys.stderr, flush=True)

    def failures(self) -> dict[int, EnvError]:
        """Episodes that failed since the last ``reset``, with their errors."""
        return dict(self._failures)

    def failed_groups(self) -> list[int]:
        """Groups with a failed episode since the last ``reset``."""
        return sorted({self.group_of(i) for i in self._failures})

    def active(self) -> list[int]:
        """The episodes waiting for a response (running, and not stepping since ``start_step``)."""
        return [i for i, a in enumerate(self._active) if a and i not in self._started]

    def messages(self, episode: int) -> Messages:
        """The chat messages episode ``episode`` must answer now."""
        return self._messages[episode]

    def shorter_messages(self, episode: int) -> list[Messages]:
        """``messages(episode)`` with the oldest 1, 2, ... history pairs left out (``PromptHistory``; [] without
        history), for prompts over a token budget."""
        return self._shorter[episode]

    def _texts(self, responses: Mapping[int, str]) -> dict[int, str]:
        """The actions of ``responses`` (a non-string response: ""), in episode order; refuses episodes that are
        not waiting for one."""
        inactive = [i for i in responses if not (0 <= i < len(self._active) and self._active[i])
                    or i in self._started]
        if inactive:
            raise ValueError(f"episodes {sorted(inactive)} are not active (call reset, or check active())")
        return {i: responses[i] if isinstance(responses[i], str) else "" for i in sorted(responses)}

    def start_step(self, responses: Mapping[int, str]) -> None:
        """Send the given active episodes' actions to their envs and return without waiting (in worker processes
        the envs step meanwhile; in-process they step now). They leave ``active()`` until the ``step`` with the
        same ``responses`` collects the results."""
        texts = self._texts(responses)
        pending = self.runner.submit_many(texts)
        self._started.update({i: (text, pending) for i, text in texts.items()})

    def step(self, responses: Mapping[int, str], max_turns: int | None = None) -> list[Turn]:
        """Step the given active episodes with their raw responses (or collect the steps ``start_step`` began with
        them); returns one Turn each (a failed step: a Turn with ``env_error``, ``done`` and rewards 0, and the
        episode fails)."""
        started = [i for i in responses if i in self._started]
        if started:
            texts = {i: responses[i] if isinstance(responses[i], str) else "" for i in sorted(responses)}
            pending = self._started[started[0]][1]
            if ({i for i, (_, p) in self._started.items() if p is pending} != set(texts)
                    or any(self._started[i][0] != text for i, text in texts.items())):
                raise ValueError(f"episodes {sorted(responses)} must be collected with the responses of one "
                                 f"start_step, all of them")
            results = self.runner.collect(pending)
            for i in texts:
                del self._started[i]
        else:
            texts = self._texts(responses)
            results = self.runner.step_many(texts)
        turns = []
        for i, response in texts.items():
            stats = self._stats[i]
            stats.length += 1
            result = results[i]
            if isinstance(result, EnvError):
                turns.append(Turn(episode=i, group=stats.group, turn=stats.length - 1, messages=self._messages[i],
                                  response=response, env_reward=0.0, format_penalty=0.0, format_ok=False,
                                  action_is_valid=False, anchor=self._anchors[i], won=False, done=True,
                                  env_error=True))
                self._fail(i, result)
                continue
            obs, reward, terminated, truncated, info = result
            budget = max_turns is not None and stats.length >= max_turns
            done = bool(terminated or truncated) or budget
            turn = Turn(
                episode=i, group=stats.group, turn=stats.length - 1, messages=self._messages[i],
                response=response, env_reward=float(info.get("env_reward", reward)),
                format_penalty=float(info.get("format_penalty", 0.0)), format_ok=bool(info.get("format_ok", True)),
                action_is_valid=bool(info["action_is_valid"]), anchor=self._anchors[i], won=bool(info["won"]),
                done=done, action=info.get("action"), terminated=bool(terminated),
            )
            turns.append(turn)
            stats.episode_return += turn.reward
            stats.env_return += turn.env_reward
            stats.num_valid_format += turn.format_ok
            stats.num_valid_action += turn.action_is_valid
            stats.won, stats.done = turn.won, done
            if done:
                stats.stop = ("won" if turn.won else "terminated" if terminated else "truncated" if truncated
                              else "max_turns")
            self._messages[i] = _messages(obs, info)
            self._shorter[i] = info.get("shorter_messages", [])
            self._anchors[i] = info.get("anchor", str(obs).strip())
            self._active[i] = not done
        return turns

    def run(self, policy: Callable[[list[Messages]], list[str]], max_turns: int) -> list[Turn]:
        """Play all active episodes to the end; ``policy`` is called once per turn, batched."""
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        turns: list[Turn] = []
        while active := self.active():
            responses = policy([self._messages[i] for i in active])
            if len(responses) != len(active):
                raise ValueError(f"policy returned {len(responses)} responses for {len(active)} prompts")
            turns += self.step(dict(zip(active, responses)), max_turns)
        return turns

    def episodes(self) -> list[EpisodeStats]:
        return list(self._stats)

    def close(self) -> None:
        """Close the envs (and end the workers)."""
        self.runner.close()


def _messages(obs: Any, info: dict[str, Any]) -> Messages:
    return info.get("messages") or [{"role": "user", "content": str(obs)}]
