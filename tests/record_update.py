"""Run one method script's real training loop on seeded synthetic rows and record what its update computed.

    python tests/record_update.py <method> <out_dir> <script flags...>      (or under ``accelerate launch``)

The script runs unchanged (its ``main``), with three substitutions: ``collect_rows`` (as the mixture of envs calls
it; with ``RECORD_REAL_ROLLOUT=1`` the real one plays the script's envs) returns seeded synthetic rows
(``synthetic_rows``: groups that share a prompt prefix, responses of 1 to ``max_response_tokens`` tokens, random
wins, format penalties and anchors; a different number of rows on every process; noisy rollout log-probs under
``--rollout-is``), ``score_rows`` and ``update_orders`` are wrapped to record the rows and mini-batch orders of the
update, and ``torch.optim.AdamW`` is plain SGD that records every gradient it steps with. Each process writes
``<out_dir>/rank<r>.pt``; ``tests/naive_update.py`` recomputes the update from those rows and compares.
"""

from __future__ import annotations

import os
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch

from arena_train.cli import parse_args
from arena_train.rollout import Row, TurnSpan

#: Tokens of a group's shared task text (every prompt of the group starts with them).
PREFIX_TOKENS = 12


def synthetic_rows(tokenizer, seeds: list[int], config, id_offset: int, group_size: int) -> tuple[list[Row], list]:
    """Rows of ``len(seeds)`` groups x ``group_size`` episodes, seeded by the task seeds (so by process)."""
    from wrappers.groups import EpisodeStats

    rng = np.random.default_rng(seeds[0] * 7919 + id_offset + 1)
    special = set(tokenizer.all_special_ids)
    vocab = [t for t in range(len(tokenizer)) if t not in special]
    rows, episodes = [], []
    n_extra = int(rng.integers(0, 3))  # unequal turn counts over processes
    for g, seed in enumerate(seeds):
        group = id_offset // group_size + g
        prefix = rng.choice(vocab, PREFIX_TOKENS).tolist()
        for e in range(group_size):
            episode = group * group_size + e
            won = bool(rng.random() < 0.5)
            n_turns = int(rng.integers(1, config.max_turns + 1)) if e or not n_extra else config.max_turns
            turns = []
            for t in range(n_turns):
                n = int(rng.integers(1, config.max_response_tokens + 1))
                penalty = float(rng.choice([0.0, 0.1]))
                turns.append(dict(prompt=prefix + rng.choice(vocab, int(rng.integers(2, 7))).tolist(),
                                  response=rng.choice(vocab, n).tolist(), penalty=penalty,
                                  reward=10.0 if won and t == n_turns - 1 else 0.0,
                                  anchor=(seed, t, int(rng.integers(0, 2)))))
            episodes.append(EpisodeStats(episode=episode, group=group, task_seed=seed, env_return=10.0 * won,
                                         episode_return=10.0 * won - sum(x["penalty"] for x in turns),
                                         length=n_turns, won=won, done=True))
            common = dict(group=group, episode=episode, won=won, env_return=10.0 * won)
            if config.row_layout == "step":
                rows += [Row(turn=t, prompt_ids=x["prompt"], response_ids=x["response"], step_reward=x["reward"],
                             format_penalty=x["penalty"], format_ok=x["penalty"] == 0,
                             action_is_valid=x["penalty"] == 0, anchor=x["anchor"], **common)
                         for t, x in enumerate(turns)]
                continue
            response, mask, spans = [], [], []
            for t, x in enumerate(turns):  # policy tokens, then the env's observation tokens (not trained)
                spans.append(TurnSpan(len(response), len(response) + len(x["response"]), x["reward"], x["penalty"]))
                response += x["response"]
                mask += [1] * len(x["response"])
                if t < n_turns - 1:
                    obs = rng.choice(vocab, int(rng.integers(2, 5))).tolist()
                    response += obs
                    mask += [0] * len(obs)
            rows.append(Row(turn=0, prompt_ids=turns[0]["prompt"], response_ids=response,
                            step_reward=sum(x["reward"] for x in turns),
                            format_penalty=sum(x["penalty"] for x in turns), format_ok=True, action_is_valid=True,
                            anchor=turns[0]["anchor"], loss_mask=np.array(mask, dtype=np.float32), turns=spans,
                            **common))
    return rows, episodes


class RecordingSGD(torch.optim.SGD):
    """SGD (no momentum, no weight decay) that keeps a copy of every gradient it steps with."""

    steps: list[list[torch.Tensor]] = []

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.0, **_):
        super().__init__(params, lr=lr)

    def step(self, closure=None):
        RecordingSGD.steps.append([p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                                   for group in self.param_groups for p in group["params"]])
        return super().step(closure)


def main() -> None:
    method, out_dir, argv = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    from conftest import load_script  # this file's folder is on the path of a script run by file name

    import arena_train.mixture as mixture

    script = load_script(method)
    args = parse_args(script.Args, script.GPU_PROFILE, argv)
    recorded: dict = {"rows": [], "orders": []}
    pending: list = []

    def collect_rows(backend, tokenizer, rollout, seeds, config, stats, greedy=False, id_offset=0, sampling_seed=None,
                     overlap=False):  # the sampling arguments do not apply to synthetic rows
        rows, episodes = synthetic_rows(tokenizer, seeds, config, id_offset, args.group_size)
        if args.engine.rollout_is != "none":  # an engine that disagrees: log-probs near uniform's, noisy
            noise = np.random.default_rng(seeds[0] + id_offset)
            for r in rows:
                r.rollout_logp = (-np.log(len(tokenizer)) + noise.normal(0, 0.3, len(r.response_ids))).astype(
                    np.float32)
        pending.append(True)
        return rows, episodes

    real_score_rows, real_update_orders = script.score_rows, script.update_orders

    def score_rows(policy, ref_model, rows, **kwargs):
        if pending:  # the first scoring of an iteration sees its final rows
            pending.clear()
            recorded["rows"].append(rows)  # written after the run: with the entropies the scoring filled in
        return real_score_rows(policy, ref_model, rows, **kwargs)

    def update_orders(accelerator, n_rows, mini_batch_size, epochs, seed):
        result = real_update_orders(accelerator, n_rows, mini_batch_size, epochs, seed)
        recorded["orders"].append(result)
        return result

    real_collect_rows = mixture.collect_rows

    def collect_real_rows(*args, **kwargs):
        pending.append(True)
        return real_collect_rows(*args, **kwargs)

    # the scripts collect through arena_train.mixture; RECORD_REAL_ROLLOUT=1 plays the envs for real
    mixture.collect_rows = collect_real_rows if os.environ.get("RECORD_REAL_ROLLOUT") else collect_rows
    script.score_rows, script.update_orders = score_rows, update_orders
    torch.optim.AdamW = RecordingSGD
    script.main(args)
    rank = int(os.environ.get("RANK", "0"))
    out_dir.mkdir(parents=True, exist_ok=True)
    recorded["rows"] = [[{f.name: r.stored(f.name) for f in fields(r) if f.name not in ("old_logp", "ref_logp")}
                         for r in rows] for rows in recorded["rows"]]  # as stored: rows left for later too
    torch.save({**recorded, "grads": RecordingSGD.steps}, out_dir / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
