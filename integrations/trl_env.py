"""Any ``ARL/*`` id as a TRL ``GRPOTrainer`` environment (``environment_factory``), with our wrappers.

TRL (>= 1.0) trains multi-turn agents through tool calling: the trainer builds one environment per
rollout from ``environment_factory``, calls ``reset(**row)`` with the dataset row and appends the
returned string to the row's last user message, exposes every public method as a tool, feeds each
tool's return value back as a ``tool`` message, and scores the rollout with ``get_reward()``.

:class:`TRLEnvironment` maps that onto the standard stack of :func:`wrappers.make_env`:

* ``reset(seed=...)`` returns the first user prompt of :class:`wrappers.PromptHistory` (the system
  message, if the style has one, is in the dataset row built by :func:`trl_dataset`);
* the one tool, ``act(response)``, takes the agent's turn in the paper's format,
  ``<think>…</think><action>…</action>``, and passes it unchanged through
  :class:`wrappers.FormatPenalty` (same projection, same penalty); it returns the next user prompt;
* ``get_reward()`` is the episode's training return (env rewards minus format penalties), the
  ``episode_return`` of :class:`wrappers.EpisodeStats`.

A mixture of envs (``arena_train.mixture``) is TRL's dict of environments: :func:`environment_factories` gives
``{env name: factory}`` and :func:`trl_mixture_dataset` rows whose ``environment`` column routes each task to its
env. TRL groups the ``num_generations`` rollouts of one dataset row, so a group never mixes envs.

A rollout that stops calling ``act`` while the episode still runs has answered a turn without an
action: that turn is stepped as the empty response (what our own loop does with a response that
carries no action), so giving up never scores better than playing.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import wrappers
from arena_train.mixture import Mixture
from wrappers.special_tokens import escape_turn_markers

#: Returned by ``act`` once the episode is over (TRL feeds a tool's exception text back to the model).
EPISODE_OVER = "The episode is over; do not call act again."


class TRLEnvironment:
    """One episode of ``env_id`` at a time, for TRL's tool-calling loop (see module docstring).

    ``make_env_kwargs`` go to :func:`wrappers.make_env` (``history_length``, ``format_penalty``,
    ``prompt_style``, ``projection`` and env kwargs). Only ``reset``, ``act`` and ``get_reward`` are
    public: TRL turns every other public method into a tool.
    """

    def __init__(self, env_id: str, **make_env_kwargs: Any):
        self._env = wrappers.make_env(env_id, **make_env_kwargs)
        self._return = 0.0
        self._done = True  # no episode until reset

    def reset(self, seed: int | None = None, **row: Any) -> str:
        """Start the episode of task ``seed`` (a dataset column); other row columns are ignored."""
        _, info = self._env.reset(seed=None if seed is None else int(seed))
        self._return, self._done = 0.0, False
        return escape_turn_markers(info["messages"][-1]["content"])  # TRL tokenizes it: no forged turn

    def act(self, response: str) -> str:
        """Play your turn in the environment and receive the next observation.

        Args:
            response: Your full answer for this turn: your reasoning inside <think> </think> tags, then exactly
                one admissible action inside <action> </action> tags.

        Returns:
            The next observation, or the outcome when the episode has ended.
        """
        if self._done:
            raise ValueError(EPISODE_OVER)
        _, reward, terminated, truncated, info = self._env.step(response)
        self._return += float(reward)
        self._done = bool(terminated or truncated)
        if not self._done:
            return escape_turn_markers(info["messages"][-1]["content"])
        outcome = "solved" if info["won"] else "not solved"
        return escape_turn_markers(f"The episode is over ({outcome}). Final observation:\n{info['observation']}")

    def get_reward(self) -> float:
        """The episode's return (format penalties included); an unfinished episode first plays one empty turn."""
        if not self._done:
            self.act("")
            self._done = True  # the rollout is over, whatever the env says: score it once
        return self._return


def environment_factory(env_id: str, **make_env_kwargs: Any) -> Callable[[], TRLEnvironment]:
    """What ``GRPOTrainer(environment_factory=...)`` takes: a no-argument callable building one env per rollout."""
    wrappers.make_env(env_id, **make_env_kwargs).close()  # fail here, not inside the trainer, on a bad id/kwarg
    return functools.partial(TRLEnvironment, env_id, **make_env_kwargs)


def trl_dataset(env_id: str, seeds: Iterable[int], **make_env_kwargs: Any):
    """A ``datasets.Dataset`` with one row per task seed: ``prompt`` (the stack's messages before the first
    user prompt, plus an empty user message that ``reset`` fills) and ``seed`` (passed to ``reset``)."""
    from datasets import Dataset

    env = wrappers.make_env(env_id, **make_env_kwargs)
    prompts, seed_column = [], []
    for seed in seeds:
        _, info = env.reset(seed=int(seed))
        prompts.append(info["messages"][:-1] + [{"role": "user", "content": ""}])
        seed_column.append(int(seed))
    env.close()
    if not seed_column:
        raise ValueError("trl_dataset needs at least one seed")
    return Dataset.from_dict({"prompt": prompts, "seed": seed_column})


def environment_factories(mixture: Mixture, **make_env_kwargs: Any) -> dict[str, Callable[[], TRLEnvironment]]:
    """TRL's dict of environments (``GRPOTrainer(environment_factory={...})``) for ``mixture``: env name ->
    factory. Each env gets its own ``TRLEnvironment`` subclass, ``TRLEnvironment[<name>]``: TRL scores a rollout
    with the reward column of its env's class only and logs each column, so every env's reward is logged apart
    (``rewards/TRLEnvironment[WebShop]/mean``)."""
    factories = {}
    for env_id, name in zip(mixture.env_ids, mixture.names):
        cls = type(f"TRLEnvironment[{name}]", (TRLEnvironment,), {"__module__": __name__})
        wrappers.make_env(env_id, **make_env_kwargs).close()  # fail here, not inside the trainer
        factories[name] = functools.partial(cls, env_id, **make_env_kwargs)
    return factories


def trl_mixture_dataset(mixture: Mixture, num_rows: int, seed: int = 0, **make_env_kwargs: Any):
    """``trl_dataset`` rows of every env of ``mixture`` plus the ``environment`` column TRL routes by: env ``k``
    has ``Mixture.allocate``'s share of the ``num_rows`` rows (its weight, within one row), on task seeds 0, 1, ...
    The rows come env by env; TRL's sampler shuffles them."""
    from datasets import concatenate_datasets

    counts = Counter(mixture.allocate(num_rows, seed, iteration=0))
    parts = [trl_dataset(env_id, range(counts[k]), **make_env_kwargs).add_column("environment", [name] * counts[k])
             for k, (env_id, name) in enumerate(zip(mixture.env_ids, mixture.names)) if counts[k]]
    if not parts:
        raise ValueError("trl_mixture_dataset needs num_rows >= 1")
    return concatenate_datasets(parts)
