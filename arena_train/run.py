"""A training run's life outside the method: set-up, resume, logging, the alarm's decisions, checkpoints, the end.

A script calls, in order (``algos/grpo.py``):

    run = Run.start(...)                       # threads, seeds, accelerator, run folder; --dry-run exits here
    backend = run.rollout_backend(...)         # after the models are prepared
    run.resume(collapse, optimizer, config)    # alarm, checkpoint 0 or the resumed one, logger
    rollouts = run.rollouts(...)               # the mixture's envs (env workers, failure policy)
    for iteration in run.iterations(n):        # held-out evaluation at iteration 0, then a progress bar
        ...
        metrics.update(run.evaluate())         # when run.eval_due(iteration): held-out episodes
        action = run.log(iteration, metrics)   # alarm + logger + env-failure streak: "go", "stop" or "rollback"
        run.checkpoint(iteration)
    run.finish(policy, tokenizer, backend, rollouts)   # final model, consistency check, summary, verdict

The pieces have their own tested modules (``checkpoint``, ``monitor``, ``logger``, ``mixture``); this one fixes
their order, which resume, rollback and multi-process runs depend on, and holds the run folder's rules and the
default thread count.

The run folder: a new run never writes into an old one's files. Without ``--resume`` a folder that already holds
a run is an error unless ``--overwrite`` is given (then that run's files are deleted first, and only those);
``--resume`` of a run that has metrics but no checkpoint is an error too, since restarting it would silently
replace its metrics. Other files in the folder (a launcher's log, a sweep's labels) never count and are never
deleted.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from arena_train import chat
from arena_train.checkpoint import resume_latest, save_checkpoint
from arena_train.cli import EngineArgs, EvalArgs, RunArgs
from arena_train.dist import param_sync_error
from arena_train.episodes import EPISODES_DIR, EpisodeRecorder, file_iteration
from arena_train.logger import MetricsLogger
from arena_train.mixture import FailureStreak, Mixture, MixtureRollout, check_resume
from arena_train.monitor import MONITOR_STATE, CollapseConfig, CollapseMonitor, checkpoints_to_keep, restore_healthy
from arena_train.resume import run_name_for, updated_record
from arena_train.rollout import RolloutConfig
from arena_train.safe_files import first_link, list_entries, remove_entries
from arena_train.streams import training_seed
from arena_train.verdict import run_verdict, verdict_line

#: What a training script writes into its run folder.
RUN_ENTRIES = ("metrics.jsonl", "checkpoints", "tb", "final", "args.json", "summary.json", EPISODES_DIR)
#: The run folder's lock file (``lock_run``): not one of the run's files, it never makes a folder hold a run.
LOCK = ".run.lock"


def writable_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot be created or written to (one line that names it), or None."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=folder)  # O_EXCL: a planted name is not followed
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        return f"error: the output folder {folder} is not writable ({err.strerror or err}); choose another --output-dir"
    return None


def flags_problem(resume: bool, overwrite: bool) -> str | None:
    """Why these run-folder flags contradict each other, or None."""
    if resume and overwrite:
        return "error: --resume continues a run, --overwrite deletes it: give one of them"
    return None


def run_dir_problem(run_dir: Path, resume: bool, overwrite: bool, entries: Sequence[str] = RUN_ENTRIES,
                    resumable: bool = True) -> str | None:
    """Why a run cannot start in ``run_dir`` with these flags (one line that says what to do), or None;
    ``entries`` are the files that make a run, ``resumable`` whether the script has ``--resume``. An entry that is
    a symbolic link (or holds one) is refused: the run would write, or delete, through it (``--overwrite``
    deletes the link itself)."""
    problem = flags_problem(resume, overwrite)
    if problem is not None:
        return problem
    found = [name for name in entries if os.path.lexists(run_dir / name)]
    link = None if overwrite else first_link(run_dir, found)
    if link is not None:
        return (f"error: {link} is a symbolic link (to {os.readlink(link)}); a run writes only into its own folder: "
                f"remove the link{' or pass --overwrite to delete the run' if resumable else ''}")
    if found and not resume and not overwrite:
        how = "pass --resume to continue it or --overwrite" if resumable else "pass --overwrite"
        return f"error: {run_dir} already holds a run ({', '.join(found)}); {how} to delete it and start over"
    if resume and "metrics.jsonl" in found and "checkpoints" not in found:
        return (f"error: {run_dir} has metrics but no checkpoint to resume from; pass --overwrite to start over "
                f"(its metrics are deleted)")
    return writable_problem(run_dir)


def clear_run(run_dir: Path, entries: Sequence[str] = RUN_ENTRIES) -> None:
    """Delete the files of the run in ``run_dir`` (``--overwrite``); a link is deleted itself, never followed."""
    for name in entries:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            path.unlink()


def lock_run(run_dir: Path) -> tuple[int | None, str | None]:
    """(descriptor holding ``run_dir``'s lock, None), or (None, why not: one line). The lock is an exclusive
    ``flock`` on ``LOCK`` in the folder, held as long as the descriptor stays open: the kernel drops it when the
    process ends, a crash included, so a stale lock never blocks a ``--resume``."""
    path = run_dir / LOCK
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        if path.is_symlink():
            return None, f"error: {path} is a symbolic link; a run writes only into its own folder: remove the link"
        return None, writable_problem(run_dir) or f"error: {path} cannot be opened ({err.strerror or err})"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        return None, (f"error: {run_dir} is in use by a live run (process {holder} holds {path}); wait for it to end "
                      f"or give another --run-name")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd, None


def prepare_run_dir(accelerator, run_dir: Path, resume: bool, overwrite: bool) -> int | None:
    """Take the run folder's lock, check it for these flags and clear an old run on ``overwrite``, on the main
    process -> the lock's descriptor (keep it open for the run's life; None on the other processes). The lock comes
    before any of the run's files is read or written, so a second start, or a ``--resume`` of a live run, is
    refused; a problem is one ``SystemExit`` printed by the main process, the others exit quietly."""
    from accelerate.utils import broadcast_object_list

    problem: list[str | None] = [None]
    lock = None
    if accelerator.is_main_process:
        problem[0] = flags_problem(resume, overwrite)
        if problem[0] is None:
            lock, problem[0] = lock_run(run_dir)
        if problem[0] is None:
            problem[0] = run_dir_problem(run_dir, resume, overwrite)
        if problem[0] is None and overwrite:
            clear_run(run_dir)
    if accelerator.num_processes > 1:
        broadcast_object_list(problem)
    if problem[0] is not None:
        if lock is not None:
            os.close(lock)
        raise SystemExit(problem[0] if accelerator.is_main_process else 1)
    return lock


def first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` (itself included) that does not exist yet: what creating it makes."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing = folder
    return missing


def discard_unstarted(run: Run, created: Path) -> None:
    """At exit: delete the files of a run that ended before it logged anything (a start-up error: a model that
    does not load, prompts that do not fit, an env that does not start), then its folder and the folders its start
    made up to ``created`` while they are empty, so the corrected command is not refused as a second run. A file
    another program put there meanwhile stays, and so does its folder. A run that logged a line keeps all."""
    if run.logger is not None and run.logger.logged:
        return
    clear_run(run.run_dir, (*RUN_ENTRIES, LOCK))
    for folder in (run.run_dir, *run.run_dir.parents):
        if created not in (folder, *folder.parents):
            break
        try:
            folder.rmdir()  # only if empty: nothing but this run was put there
        except OSError:
            break


def default_threads(requested: int = 0) -> int:
    """``requested`` if > 0; else ``$OMP_NUM_THREADS`` if set (how to pin it on a shared machine); else the cores
    this process may run on, split between the processes of this machine (``$LOCAL_WORLD_SIZE`` under
    ``accelerate launch``/``torchrun``), at least 1."""
    if requested > 0:
        return requested
    pinned = os.environ.get("OMP_NUM_THREADS", "").strip()
    if pinned.isdigit() and int(pinned) > 0:
        return int(pinned)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local = os.environ.get("LOCAL_WORLD_SIZE", "1").strip()
    return max(1, cores // (int(local) if local.isdigit() and int(local) > 0 else 1))


@dataclass
class Run:
    """The state a run's infrastructure keeps between the script's calls (``Run.start`` makes it)."""

    run: RunArgs
    engine: EngineArgs
    eval: EvalArgs
    mixture: Mixture
    exp_name: str
    seed: int
    model_path: str
    accelerator: Any
    run_dir: Path
    dtype: torch.dtype
    start_iteration: int = 1
    monitor: CollapseMonitor | None = None
    logger: MetricsLogger | None = None
    env_failures: FailureStreak | None = None
    env_failure: str | None = None
    optimizer: Any = None
    keep: int = 2
    _last: int = field(default=0, repr=False)
    _backend: Any = field(default=None, repr=False)  # what the iteration-0 evaluation needs (rollout_backend,
    _tokenizer: Any = field(default=None, repr=False)  # rollouts)
    _rollouts: MixtureRollout | None = field(default=None, repr=False)
    _eval_sampling: RolloutConfig | None = field(default=None, repr=False)
    _bar: Any = field(default=None, repr=False)
    _postfix: dict[str, str] = field(default_factory=dict, repr=False)
    _lock: int | None = field(default=None, repr=False)  # the run folder's lock, held for the process's life

    @classmethod
    def start(cls, run: RunArgs, engine: EngineArgs, eval_args: EvalArgs, mixture: Mixture, *, exp_name: str,
              seed: int, model_path: str, num_groups: int, max_prompt_tokens: int, max_response_tokens: int) -> Run:
        """Threads, the run name, ``--dry-run``'s plan (exits), the accelerator, per-process seeds, the run folder
        (``--resume`` / ``--overwrite``); checks that groups and evaluation episodes split over the processes."""
        from accelerate.utils import set_seed
        from transformers.utils import logging as hf_logging

        from arena_train.memory import dry_run_exit_code, print_run_plan
        from arena_train.models import resolve_policy_path
        from arena_train.sharding import make_accelerator, require_supported

        if run.run_name is None:
            run.run_name = run_name_for(mixture.label, exp_name, seed)
        torch.set_num_threads(default_threads(run.torch_threads))  # before any vLLM engine: later calls are no-ops
        hf_logging.disable_progress_bar()
        if run.dry_run:  # the plan needs the model's shape only: Qwen3 names are known without a download
            raise SystemExit(dry_run_exit_code(print_run_plan(
                model_path, micro_batch_size=engine.micro_batch_size, lora_rank=engine.lora_rank,
                max_prompt_tokens=max_prompt_tokens, max_response_tokens=max_response_tokens,
                gradient_checkpointing=engine.gradient_checkpointing, rollout_backend=engine.rollout_backend,
                vllm_share=engine.vllm_gpu_memory_utilization, mixed_precision=engine.mixed_precision)))
        model_path = resolve_policy_path(model_path)
        accelerator = make_accelerator(engine.mixed_precision)  # FSDP2 also on CPU-only machines (tests)
        world = accelerator.num_processes
        if num_groups % world or eval_args.eval_episodes % world:
            raise SystemExit(f"--num-groups and --eval-episodes must be multiples of the {world} processes")
        set_seed(seed + accelerator.process_index)
        run_dir = Path(run.output_dir) / run.run_name
        created = first_missing(run_dir) if accelerator.is_main_process else None
        lock = prepare_run_dir(accelerator, run_dir, run.resume, run.overwrite)
        new = cls(run, engine, eval_args, mixture, exp_name, seed, model_path, accelerator, run_dir, dtype=(
            torch.bfloat16 if engine.mixed_precision == "bf16" and torch.cuda.is_available() else torch.float32),
            _lock=lock)
        if created is not None:  # a start-up error from here on must not leave a run behind (see discard_unstarted)
            atexit.register(discard_unstarted, new, created)
        require_supported(accelerator, engine.lora_rank)
        return new

    @property
    def rank(self) -> int:
        return self.accelerator.process_index

    @property
    def world(self) -> int:
        return self.accelerator.num_processes

    def rollout_backend(self, policy, tokenizer, *, max_model_len: int, max_num_seqs: int):
        """The rollout engine (``--rollout-backend``): vLLM, or transformers generate (sharded: an unsharded copy
        fed from the shards); seeded per process. First the tokenizer's chat format (``--chat-template``,
        ``--chat-template-kwargs``, the end-of-turn ids of the policy's generation config: ``arena_train.chat``),
        which every prompt, stop and trajectory delta of the run then uses."""
        from arena_train.sharding import make_rollout_backend

        e = self.engine
        generation_config = getattr(self.accelerator.unwrap_model(policy), "generation_config", None)
        chat.configure(tokenizer, generation_config, e.chat_template, chat.parse_kwargs(e.chat_template_kwargs))
        self._backend = make_rollout_backend(
            e.rollout_backend, self.accelerator, policy, tokenizer, self.model_path, self.dtype,
            seed=self.seed + self.rank, max_model_len=max_model_len, mixed_precision=e.mixed_precision,
            max_num_seqs=max_num_seqs, gpu_memory_utilization=e.vllm_gpu_memory_utilization,
            precision=e.rollout_precision)
        return self._backend

    def rollouts(self, make_env: Callable[..., Any], num_groups: int, group_size: int, tokenizer,
                 sampling: RolloutConfig) -> MixtureRollout:
        """Every env's groups (``num_groups`` over all processes) and held-out episodes, in-process or in env
        workers (``--env-workers``); the held-out split keeps rollout and evaluation tasks apart. Checks that the
        prompts fit ``sampling``'s budget and starts the env-failure streak (``--max-env-failures``)."""
        e = self.engine
        if e.env_servers:  # the network the run plays on is said before the first session opens
            self.accelerator.print(f"env servers: the training episodes play on {', '.join(e.env_servers)}")
        rollouts = MixtureRollout(self.mixture, make_env, num_groups // self.world, group_size,
                                  max(self.eval.eval_episodes // self.world, 1), self.eval.eval_split,
                                  env_workers=e.env_workers, step_timeout=e.env_step_timeout,
                                  env_servers=e.env_servers, overlap_turns=e.overlap_turns)
        rollouts.require_prompts_fit(tokenizer, sampling, seed=self.seed)
        if sampling.row_layout == "trajectory" and not chat.format_of(tokenizer).prefix_preserving:
            self.accelerator.print(
                "chat template: earlier turns render differently once a message follows (e.g. Qwen3 drops their "
                "<think>); trajectory rows keep the sampled tokens, as the template's training variant renders them "
                "(--chat-template <name>_training; docs/real_models.md)")
        self.env_failures = FailureStreak(e.max_env_failures, rollouts)
        rollouts.recorder = EpisodeRecorder(self.run.log_episodes if self.accelerator.is_main_process else 0)
        self._tokenizer, self._rollouts = tokenizer, rollouts
        self._eval_sampling = replace(sampling, temperature=self.eval.eval_temperature, top_p=self.eval.eval_top_p,
                                      top_k=self.eval.eval_top_k)  # training's, with the --eval-* sampling
        return rollouts

    def resume(self, collapse: CollapseConfig, optimizer, config: dict[str, Any]) -> int:
        """The alarm (its state travels in every checkpoint, as JSON), ``--resume`` of the newest verified checkpoint,
        the logger (``config`` is written to args.json; a resumed run's args.json keeps its start values and gets the
        changed ones appended, ``arena_train.resume.updated_record``) and, for a stop or rollback alarm,
        checkpoint 0 (the start weights: a healthy checkpoint for a collapse in the first iterations). -> the
        first iteration to run."""
        acc, self.optimizer = self.accelerator, optimizer
        self.monitor = CollapseMonitor(collapse)
        self.keep = checkpoints_to_keep(collapse, self.run.checkpoint_every)  # a healthy one survives an alarm
        if self.run.resume:  # before the logger rewrites args.json, the record of the run's mixture
            check_resume(acc, self.run_dir, self.mixture)
        self.start_iteration = 1 + (resume_latest(acc, self.run_dir, self.run.resume_fallback, self._states)
                                    if self.run.resume else 0)
        if acc.is_main_process:  # a resumed run's args.json keeps its start values; changes are appended
            config = {**config, "world_size": self.world}
            self.logger = MetricsLogger(self.run_dir, self.start_iteration,
                                        self.run.wandb_project if self.run.track else None, self.run.run_name,
                                        config, updated_record(self.run_dir, config, self.start_iteration)
                                        if self.run.resume else config)
        if self.start_iteration == 1 and collapse.on_collapse in ("stop", "rollback"):
            self.monitor.checkpointed(0)
            save_checkpoint(acc, self.run_dir, 0, self.keep, self._states)
        return self.start_iteration

    @property
    def _states(self) -> dict[str, CollapseMonitor]:
        """What a checkpoint carries as JSON beside the tensors: the alarm's state."""
        return {MONITOR_STATE: self.monitor}

    def iterations(self, num_iterations: int) -> Iterator[int]:
        """Iterations ``start_iteration .. num_iterations`` under a progress bar (main process) that shows the
        rollout success, the last held-out success and the KL to the reference.

        A new run with evaluation on (``--eval-every`` > 0) first evaluates the start weights, logged as
        iteration 0 (the verdict's baseline; the alarm does not see it, so its decisions are those of a run
        without it). Held-out decoding draws from per-episode streams and the held-out envs are their own, so the
        rows the run trains on are the same with or without it. A resumed run keeps its iteration-0 line and
        drops the episode files of the iterations it replays."""
        from tqdm.auto import tqdm

        self._last = num_iterations
        if self.start_iteration > 1:
            self._drop_episodes_from(self.start_iteration)
        elif self.eval_due(0) and self._rollouts is not None and self._backend is not None:
            metrics = self.evaluate()
            if self.logger is not None:
                self.logger.log(0, metrics)
            self._record(0, metrics)
        self._bar = tqdm(range(self.start_iteration, num_iterations + 1), initial=self.start_iteration - 1,
                         total=num_iterations, desc=self.exp_name, disable=not self.accelerator.is_main_process)
        if self._postfix:
            self._bar.set_postfix(self._postfix, refresh=False)
        return self._streamed(iter(self._bar))

    def _streamed(self, iterations: Iterator[int]) -> Iterator[int]:
        """``iterations``, each first setting the training rollouts' per-episode streams of that iteration
        (``--episode-streams``: ``arena_train.streams.training_seed``; off: the backend's own stream)."""
        for iteration in iterations:
            if self._rollouts is not None:
                self._rollouts.sampling_seed = (training_seed(self.seed, iteration) if self.engine.episode_streams
                                                else None)
            yield iteration

    def evaluate(self) -> dict[str, float]:
        """Held-out evaluation of the current weights (``eval/*``): ``--eval-episodes`` episodes of the held-out
        split, sampled with the training settings but ``--eval-temperature``/``--eval-top-p``/``--eval-top-k``
        (``--eval-greedy``: greedy), through the rollout engine and envs of ``rollout_backend`` and ``rollouts``."""
        return self._rollouts.evaluate(self.accelerator, self._backend, self._tokenizer, self._eval_sampling,
                                       self.eval.eval_episodes, self.rank, self.world,
                                       greedy=self.eval.eval_greedy, seed=self.seed)

    def eval_due(self, iteration: int) -> bool:
        """Held-out evaluation at the start (iteration 0: ``iterations`` runs it), every ``--eval-every``
        iterations and after the last one (0 = never)."""
        every = self.eval.eval_every
        return every > 0 and (iteration % every == 0 or iteration == self._last)

    def _drop_episodes_from(self, iteration: int) -> None:
        """Delete the episode files of ``iteration`` and later (a resumed run plays them again)."""
        if not self.accelerator.is_main_process:
            return
        folder = self.run_dir / EPISODES_DIR
        names = [n for n in list_entries(folder, self.run_dir) if n.endswith(".jsonl")
                 and (found := file_iteration(Path(n))) is not None and found >= iteration]
        remove_entries(folder, names, self.run_dir)  # a linked file goes itself; a linked folder is refused

    def _record(self, iteration: int, metrics: dict[str, float]) -> None:
        """The episode records since the last iteration into ``episodes/``, and the progress bar's figures."""
        if self._rollouts is not None and self._rollouts.recorder is not None and self.accelerator.is_main_process:
            self._rollouts.recorder.flush(self.run_dir, iteration)
        shown = {"success": "rollout/success_rate", "held-out": "eval/success_rate", "kl": "actor/kl_ref"}
        for label, key in shown.items():
            value = metrics.get(key)
            if value is not None:
                self._postfix[label] = f"{value:.3g}" if label == "kl" else f"{100 * value:.0f}%"
        self._postfix = {label: self._postfix[label] for label in shown if label in self._postfix}
        if self._bar is not None:
            self._bar.set_postfix(self._postfix, refresh=False)

    def log(self, iteration: int, metrics: dict[str, float]) -> str:
        """The alarm's signals (added to ``metrics`` as ``stability/*``), the logger, the env-failure streak.

        -> "go"; "stop" (the env keeps failing, or the alarm stops the run on its last healthy checkpoint); or
        "rollback" (the last healthy checkpoint is restored, at a smaller learning rate, and saved as this
        iteration's: push the weights to the rollout engine and go on with the next iteration)."""
        step = self.monitor.update(iteration, metrics)  # pooled metrics: one decision on every process
        metrics.update(step.metrics)
        if step.message:
            self.accelerator.print(step.message)
        if self.logger is not None:
            self.logger.log(iteration, metrics)
        self._record(iteration, metrics)
        self.env_failure = self.env_failures.update(metrics)
        if self.env_failure is not None:
            return "stop"
        if step.decision.action not in ("stop", "rollback"):
            return "go"
        restored = restore_healthy(self.accelerator, self.run_dir, self.monitor, step.decision, iteration,
                                   self.optimizer, self.keep)
        return "stop" if step.decision.action == "stop" or restored is None else "rollback"

    def checkpoint(self, iteration: int) -> None:
        """Every ``--checkpoint-every`` iterations and after the last one: model, optimizer, RNG and alarm state."""
        every = self.run.checkpoint_every
        if (every > 0 and iteration % every == 0) or iteration == self._last:
            self.monitor.checkpointed(iteration)
            save_checkpoint(self.accelerator, self.run_dir, iteration, self.keep, self._states)

    def finish(self, policy, tokenizer, backend, rollouts: MixtureRollout) -> None:
        """Close the env workers; after env failures exit naming the env and its error (the last checkpoint
        stays); else save the final model (a normal HF folder), check that every process holds the same weights
        and write summary.json with the verdict (``arena_train.verdict``: held-out success at the start, best and
        final, the paired gain), also printed as the last line."""
        from arena_train.sharding import save_final_model

        acc = self.accelerator
        rollouts.close()  # the env workers end here (and with the process on any other way out)
        if self.env_failure is not None:
            backend.close()
            raise SystemExit(self.env_failure if acc.is_main_process else 1)
        sync_error = param_sync_error(acc, policy)
        final = save_final_model(acc, policy, tokenizer, self.run_dir / "final")  # every process joins the gather
        if acc.is_main_process:
            verdict = run_verdict(self.run_dir)
            self.logger.close(summary={"world_size": self.world, "param_sync_error": sync_error,
                                       "final_model": str(final), **self.monitor.summary(), "verdict": verdict})
            acc.print(f"done: metrics in {self.run_dir / 'metrics.jsonl'}, episodes in "
                      f"{self.run_dir / EPISODES_DIR}, model in {final}")
            acc.print(verdict_line(verdict))
        backend.close()  # vLLM: after the last collective, before the process group ends
        acc.end_training()

