"""The mini-arena's second process (``--overlap``): greedy evaluations that need no answer before training goes on
(BC validation checks, the BC start's held-out evaluation and the baselines) run there while the main process
trains; several pipeline seeds run in processes of their own.

Greedy evaluation draws no random numbers and runs the same code at the same thread count (``--torch-threads``) in
either process, so moving it changes no result (in line, ``SideProcess(0, ...)`` runs it at that thread count too;
tests/test_mini_arena.py compares the two bit for bit). It pays only where a core is free: the default trains BC on
two threads and RL on two processes, which keep a 2-core machine busy, so the default evaluates in line.

The process is started with ``spawn``: a forked child of a process whose tokenizer already used its thread pool
would run with tokenizer parallelism disabled and a warning.
"""

from __future__ import annotations

import copy
import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Any, Callable

#: (model, tokenizer) sent once per BC run, by run key; later checks send only the weights
_MODELS: dict[str, tuple[Any, Any]] = {}


def _init(threads: int) -> None:
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(threads)
    hf_logging.disable_progress_bar()


def bc_env(env_id: str):
    """The BC stage's env (its data and validation): no history, format penalty 0.1, compact prompts."""
    import wrappers

    return wrappers.make_env(env_id, history_length=0, format_penalty=0.1, prompt_style="compact")


def _validate(key: str, model_and_tokenizer: tuple[Any, Any] | None, state: dict[str, Any], env_id: str,
              episodes: int, config) -> float:
    from arena_train.bc import validation_success

    if model_and_tokenizer is not None:
        _MODELS.clear()  # one BC run at a time
        _MODELS[key] = model_and_tokenizer
    model, tokenizer = _MODELS[key]
    model.load_state_dict(state)
    model.eval()
    return validation_success(model, tokenizer, partial(bc_env, env_id), episodes, config)


def evaluate_start(args, bc_dir, seeds: list[int]):
    """The BC start's held-out evaluation (result, per-seed wins) and the baselines: what needs no RL."""
    from eval.mini_arena import evaluate_baselines, evaluate_model

    return (*evaluate_model(args, bc_dir, "BC start", seeds), evaluate_baselines(args, seeds))


def _seed_alone(args, seed: int) -> dict[str, Any]:
    from eval.mini_arena import run_seed

    return run_seed(args, seed, SideProcess(0, args.torch_threads))


def run_seeds_apart(args, workers: int) -> list[dict[str, Any]]:
    """Each pipeline seed's BC, RL and evaluation in its own process, ``workers`` at a time, in seed order. A
    seed's pipeline shares nothing with another's (its own RNG seeding, model folder and RL subprocess), so each
    gives the numbers it gives alone."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init, initargs=(args.torch_threads,)) as pool:
        futures = [pool.submit(_seed_alone, args, seed) for seed in args.seeds]
        return [SideProcess.result(f) for f in futures]


class SideProcess:
    """One worker process (or none: every call runs at once in this process, ``workers=0``).

    ``submit`` returns a Future either way, so callers have one code path; ``result`` turns a dead worker into
    a message instead of a traceback from the pool's internals."""

    def __init__(self, workers: int, threads: int):
        self.pool = (ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                                         initargs=(threads,)) if workers > 0 else None)
        self.threads = threads
        self._sent: set[str] = set()

    def submit(self, fn: Callable, *args: Any) -> Future:
        """``fn(*args)`` in the worker, or at once here at the worker's thread count (BC trains on its own)."""
        if self.pool is not None:
            return self.pool.submit(fn, *args)
        import torch

        future: Future = Future()
        threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            future.set_result(fn(*args))
        finally:
            torch.set_num_threads(threads)
        return future

    def validate(self, key: str, model, tokenizer, state: dict[str, Any], env_id: str, episodes: int,
                 config) -> Future:
        """Greedy BC validation success of ``state`` (a detached copy of the model's weights, taken now)."""
        if self.pool is None:
            model.eval()
            return self.submit(_validate, key, (model, tokenizer), state, env_id, episodes, config)
        first = key not in self._sent  # a copy: the pool pickles it later, while training changes the original
        self._sent.add(key)
        return self.submit(_validate, key, copy.deepcopy((model, tokenizer)) if first else None, state, env_id,
                           episodes, config)

    @staticmethod
    def result(future: Future) -> Any:
        try:
            return future.result()
        except BrokenProcessPool as err:
            raise SystemExit("the mini-arena's evaluation process died (out of memory?); rerun without --overlap "
                             "to evaluate in the main process") from err

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
