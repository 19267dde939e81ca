"""Padded training batches, per-token response log-probs and the old-policy / reference scoring pass.

B = rows, P = longest prompt, T = longest response, V = vocabulary. Masks are 0/1 floats.

Speed without changing the math:
- shared prompt prefixes: the rows of a group (``Row.group``) share the start of their prompt (the whole prompt
  on a first turn, the instructions on later turns). ``make_batch(..., share_prefix=True)`` keeps that prefix
  once per group; ``sequence_logprobs`` runs it once, expands its KV cache to the group's rows (differentiably)
  and runs only the rest of each row;
- micro-batches sorted by length and capped in padded tokens (``split_micro_batches``);
- log-probs and entropies in vocabulary chunks (``arena_train.logprob``);
- the first mini-batch of an update runs before any optimizer step, so its rows take their old log-probs from
  its own forward pass (``first_minibatch``, ``score_rows(..., skip_policy=...)``, ``fill_old_logp``): an
  on-policy update (one epoch, one mini-batch) needs no policy scoring pass at all.
"""

from __future__ import annotations

import functools
import math
import time
from collections import defaultdict
from collections.abc import Collection

import numpy as np
import torch

from arena_train.kv_cache import cache_name
from arena_train.logprob import token_logprobs
from arena_train.rollout import Row
from arena_train.rows import Later
from arena_train.sharding import is_sharded, lockstep_passes

#: Shorter common prefixes are not worth a separate forward pass.
MIN_SHARED_PREFIX = 8


def shared_prefix_lengths(rows: list[Row], min_prefix: int = MIN_SHARED_PREFIX) -> list[int]:
    """Per row, how many leading prompt tokens it shares with every other row of its group in ``rows`` (0 when
    the group has one row here or shares fewer than ``min_prefix``). The last prompt token is never shared, so
    the logits that predict the response always come from the row's own part."""
    by_group: dict[int, list[int]] = defaultdict(list)
    for b, r in enumerate(rows):
        by_group[r.group].append(b)
    lengths = [0] * len(rows)
    for members in by_group.values():
        if len(members) < 2:
            continue
        first = rows[members[0]].prompt_ids
        n = min(len(rows[b].prompt_ids) for b in members) - 1
        for b in members[1:]:
            other = rows[b].prompt_ids
            k = 0
            while k < n and first[k] == other[k]:
                k += 1
            n = k
        if n >= min_prefix:
            for b in members:
                lengths[b] = n
    return lengths


def make_batch(rows: list[Row], pad_id: int, device: torch.device | str,
               share_prefix: bool = False) -> dict[str, torch.Tensor]:
    """Left-pad prompts and right-pad responses so all responses start at the same column P.

    input_ids/attention_mask/position_ids: (B, P+T); response_ids, mask, old_logp, ref_logp, rollout_logp,
    advantages: (B, T); has_old_logp, has_rollout_logp: (B,) bool (rows scored before the update; rows whose
    generation pass recorded its own log-probs).
    With ``share_prefix`` and groups that share a prompt prefix, the batch also holds prefix_ids (S, L) (one
    right-padded row per shared prefix) and row_prefix (B,) (its index per row); input_ids then hold only each
    row's prompt after its prefix, position_ids continue from the prefix, and attention_mask (B, L+P+T) covers
    the row's prefix too (so its sum still counts every token of every row).
    """
    cut = shared_prefix_lengths(rows) if share_prefix else [0] * len(rows)
    P = max(len(r.prompt_ids) - c for r, c in zip(rows, cut))
    T = max(max(len(r.response_ids) for r in rows), 1)
    B = len(rows)
    input_ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + T), dtype=torch.long)
    out = {k: torch.zeros((B, T)) for k in ("mask", "old_logp", "ref_logp", "rollout_logp", "advantages")}
    for b, (r, c) in enumerate(zip(rows, cut)):
        p, n = len(r.prompt_ids) - c, len(r.response_ids)
        input_ids[b, P - p:P] = torch.tensor(r.prompt_ids[c:])
        input_ids[b, P:P + n] = torch.tensor(r.response_ids, dtype=torch.long)
        attn[b, P - p:P + n] = 1
        out["mask"][b, :n] = 1.0 if r.loss_mask is None else torch.as_tensor(r.loss_mask, dtype=torch.float32)
        for key, value in (("old_logp", r.stored("old_logp")), ("ref_logp", r.ref_logp),
                           ("rollout_logp", r.rollout_logp)):
            if value is not None:
                out[key][b, :n] = torch.as_tensor(value)
        out["advantages"][b, :n] = torch.as_tensor(np.broadcast_to(r.advantage, (n,)).astype(np.float32))
    out.update(input_ids=input_ids, attention_mask=attn, response_ids=input_ids[:, P:],
               position_ids=(attn.cumsum(-1) - 1).clamp(min=0) + torch.tensor(cut)[:, None],
               has_old_logp=torch.tensor([r.stored("old_logp") is not None for r in rows]),
               has_rollout_logp=torch.tensor([r.rollout_logp is not None for r in rows]))
    if any(cut):
        prefix_ids, row_prefix, prefix_attention = _prefix_tensors(rows, cut, pad_id)
        out.update(prefix_ids=prefix_ids, row_prefix=row_prefix,
                   attention_mask=torch.cat([prefix_attention, attn], dim=1))
    return {k: v.to(device) for k, v in out.items()}


def _prefix_tensors(rows: list[Row], cut: list[int], pad_id: int) -> tuple[torch.Tensor, ...]:
    """prefix_ids (S, L) right-padded (pads after the real tokens cannot change them under causal attention),
    row_prefix (B,), prefix_attention (B, L) (zeros for rows without a shared prefix)."""
    slots: dict[int, int] = {}
    prefixes: list[list[int]] = []
    for r, c in zip(rows, cut):
        if c and r.group not in slots:
            slots[r.group] = len(prefixes)
            prefixes.append(r.prompt_ids[:c])
    L = max(len(p) for p in prefixes)
    prefix_ids = torch.full((len(prefixes), L), pad_id, dtype=torch.long)
    for s, p in enumerate(prefixes):
        prefix_ids[s, :len(p)] = torch.tensor(p)
    prefix_attention = torch.zeros((len(rows), L), dtype=torch.long)
    for b, c in enumerate(cut):
        prefix_attention[b, :c] = 1
    row_prefix = torch.tensor([slots.get(r.group, 0) for r in rows])
    return prefix_ids, row_prefix, prefix_attention


def _checkpointing(model) -> bool:
    """Whether activation (gradient) checkpointing is on, which makes transformers drop the KV cache."""
    model = getattr(model, "module", model)  # DDP / Accelerate wrappers
    flag = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5; the older name warns there
    return bool(getattr(model, "is_gradient_checkpointing", False) if flag is None else flag)


def full_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask, position_ids (B, L+P+T) of whole rows: a batch's shared prefixes spliced back
    in front of each row (for a model run without the KV reuse, e.g. PPO's critic); a batch without shared
    prefixes as it is."""
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    if "prefix_ids" in batch:
        rows_prefix = batch["prefix_ids"][batch["row_prefix"]]
        positions = torch.arange(rows_prefix.shape[1], device=rows_prefix.device).expand_as(rows_prefix)
        inputs.update(input_ids=torch.cat([rows_prefix, batch["input_ids"]], dim=1),
                      position_ids=torch.cat([positions, batch["position_ids"]], dim=1))
    return inputs


def sequence_logprobs(model, batch: dict[str, torch.Tensor], temperature: float,
                      with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (B, T) of the response tokens and their entropies (B, T) at ``temperature``.

    Only the T positions that predict the response go through the LM head (``logits_to_keep``); the softmax runs
    in vocabulary chunks, so no (B, T, V) float32 log-softmax is kept. A batch with shared prefixes runs each
    prefix once and reuses its KV cache for the rows of its group (gradients flow into the prefix); with gradient
    checkpointing, which disables the cache, and with sharded models, whose every forward is a collective that
    all processes must join equally often, the prefixes are spliced back into the rows instead.
    """
    T = batch["mask"].shape[1]
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                  position_ids=batch["position_ids"])
    if "prefix_ids" in batch:
        if (model.training and _checkpointing(model)) or is_sharded(model):
            inputs = full_inputs(batch)
        else:
            cache = getattr(model(input_ids=batch["prefix_ids"], use_cache=True, logits_to_keep=1), cache_name())
            cache.reorder_cache(batch["row_prefix"])  # (S, ...) -> (B, ...), differentiable indexing
            inputs[cache_name()] = cache
    L = inputs["input_ids"].shape[1]
    # positions L-T-1 .. L-2 predict the T response tokens; asking the model for exactly those keeps the (B, T, V)
    # logits contiguous: no copy of them in the log-prob pass and no second one for their gradient
    keep = torch.arange(L - T - 1, L - 1, device=inputs["input_ids"].device)
    logits = model(**inputs, logits_to_keep=keep, use_cache=cache_name() in inputs).logits  # (B, T, V)
    logp, entropy = token_logprobs(logits, batch["response_ids"], temperature)
    return logp, entropy if with_entropy else None


def first_minibatch(orders: list[list[int]], n_minibatches: int) -> set[int]:
    """Row indices of the update's first mini-batch (the first share of the first epoch's order, as the update
    splits it with ``np.array_split``)."""
    return set(np.array_split(np.array(orders[0], dtype=np.int64), n_minibatches)[0].tolist())


def fill_old_logp(batch: dict[str, torch.Tensor], logp: torch.Tensor, rows: list[Row]) -> None:
    """Rows left without old log-probs (the first mini-batch's, ``score_rows(..., skip_policy=...)``) take this
    forward's log-probs, detached, into the batch and into the rows (later epochs). Before the first optimizer
    step the weights are the rollout's, so these are the old policy's log-probs (as from a separate pass, up to
    float rounding; and dropout, which is 0 in Qwen3)."""
    keep = batch["has_old_logp"][:, None]
    batch["old_logp"] = torch.where(keep, batch["old_logp"], logp.detach())
    for b, row in enumerate(rows):
        if row.stored("old_logp") is None:
            row.old_logp = logp[b, :len(row.response_ids)].detach().float().cpu().numpy()


def split_micro_batches(rows: list[Row], max_rows: int, max_tokens: int = 0) -> list[list[Row]]:
    """Rows sorted by length (longest first, so each micro-batch pads little), packed greedily into micro-batches
    of at most ``max_rows`` rows and, when ``max_tokens`` > 0, at most ``max_tokens`` padded tokens (a longer
    row still gets a micro-batch of its own)."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    ordered = sorted(rows, key=lambda r: len(r.prompt_ids) + len(r.response_ids), reverse=True)
    batches: list[list[Row]] = []
    width = 0  # longest row of the current micro-batch (the first, as rows come longest first)
    for r in ordered:
        if batches and len(batches[-1]) < max_rows and (max_tokens <= 0 or width * (len(batches[-1]) + 1)
                                                         <= max_tokens):
            batches[-1].append(r)
        else:
            batches.append([r])
            width = len(r.prompt_ids) + len(r.response_ids)
    return batches


@torch.no_grad()
def score_rows(policy, ref_model, rows: list[Row], *, micro_batch_size: int, temperature: float, pad_id: int,
               device: torch.device | str, stats: dict[str, float], skip_policy: set[int] | frozenset = frozenset(),
               micro_batch_tokens: int = 0, use_rollout_logp: bool = True) -> None:
    """Fill ``old_logp`` and ``entropy`` (the policy; rows whose index is in ``skip_policy`` are left for later) and
    ``ref_logp`` (``ref_model``, if not None) of the rows before the update, in length-sorted micro-batches of
    ``micro_batch_size`` rows and at most ``micro_batch_tokens`` padded tokens (0 = no cap); adds the seconds spent
    to ``stats["time_score"]``.

    ``skip_policy`` = the update's first mini-batch (``first_minibatch``), whose own forward gives those rows' old
    log-probs (``fill_old_logp``): one forward pass fewer per iteration. Reading those rows' ``old_logp`` or
    ``entropy`` before it raises ``RowNotScored``; ``score_all(rows)`` fills them now, with this call's settings
    (``Row.later``). Other rows scored by the rollout itself (``Row.rollout_logp``) take those
    log-probs and entropies instead of a forward pass, unless ``use_rollout_logp`` is False (the trainer's own
    log-probs are wanted beside the rollout's: rollout/trainer mismatch correction). With sharded models every
    process runs as many passes as the busiest one (the extra ones score rows again and discard them): each pass
    all-gathers weights, a collective all processes must join.
    """
    start = time.perf_counter()
    score_later = functools.partial(score_rows, policy, None, micro_batch_size=micro_batch_size,
                                    temperature=temperature, pad_id=pad_id, device=device, stats=stats,
                                    micro_batch_tokens=micro_batch_tokens, use_rollout_logp=use_rollout_logp)
    scored = Later(set(), score_later)
    policy_rows = []
    for j, r in enumerate(rows):
        if j in skip_policy:
            r.later = Later({"old_logp", "entropy"}, score_later)
            continue
        r.later = scored
        if r.rollout_logp is not None and use_rollout_logp:  # the generation pass scored it with these weights
            r.old_logp, r.entropy = r.rollout_logp, r.rollout_entropy
        else:
            policy_rows.append(r)
    for model, subset, is_policy in ((policy, policy_rows, True), (ref_model, rows, False)):
        if model is None:
            continue
        chunks = split_micro_batches(subset, micro_batch_size, micro_batch_tokens) if subset else []
        for k in range(lockstep_passes(len(chunks), is_sharded(model))):
            chunk = chunks[k] if k < len(chunks) else []
            batch = make_batch(chunk or (chunks[0] if chunks else rows[:1]), pad_id, device, share_prefix=True)
            logp, entropy = sequence_logprobs(model, batch, temperature, with_entropy=is_policy)
            for b, row in enumerate(chunk):
                n = len(row.response_ids)
                values = logp[b, :n].float().cpu().numpy()
                if is_policy:
                    trained = batch["mask"][b, :n] > 0  # a trajectory row's env tokens are not the policy's
                    row.old_logp = values
                    row.entropy = float(entropy[b, :n][trained].mean()) if trained.any() else 0.0
                else:
                    row.ref_logp = values
    stats["time_score"] += time.perf_counter() - start


def score_all(rows: list[Row]) -> None:
    """Fill the rows' fields that ``score_rows`` left for later (``Row.later``: the update's first mini-batch), with
    that call's settings, so that the advantage block can read every row's ``old_logp`` and ``entropy``; the
    update then uses these old log-probs instead of its first forward pass's (equal up to float rounding).
    Call it on every process (a sharded policy's passes are collectives); rows already filled keep their values."""
    pending = [r for r in rows if r.later is not None and r.later.fields]
    score = next((r.later.score for r in rows if r.later is not None), None)
    if score is None:  # no score_rows call marked these rows: nothing was left for later
        return
    kept = {id(r): r.stored("old_logp") for r in pending if "old_logp" not in r.later.fields}
    score(pending)
    for r in pending:
        if id(r) in kept:  # the update's forward already gave it: the update's number stays
            r.old_logp = kept[id(r)]


def lockstep_micro_batches(accelerator, rows: list[Row], max_rows: int,
                           max_tokens: int = 0) -> tuple[list[list[Row]], list[bool]]:
    """(micro-batches, whether each may reuse shared prompt prefixes): ``split_micro_batches`` padded with empty
    micro-batches to the largest count over the processes, and prefix reuse only where every process can use it.

    Every process must make the same forward and backward calls in every micro-batch: a sharded forward
    all-gathers weights, and DDP's gradient hooks and buckets follow the calls. An empty micro-batch reruns a real
    one with weight 0; a micro-batch whose rows share no prefix on some process splices the prefixes back in on
    all of them (one forward call each instead of two).
    """
    micro_batches = split_micro_batches(rows, max_rows, max_tokens) if rows else []
    count = torch.tensor([len(micro_batches)], device=accelerator.device)
    most = int(accelerator.gather(count).max().item())
    micro_batches += [[] for _ in range(most - len(micro_batches))]
    local = [any(shared_prefix_lengths(micro or micro_batches[0])) for micro in micro_batches]
    if accelerator.num_processes == 1 or most == 0:
        return micro_batches, local
    flags = accelerator.reduce(torch.tensor([0 if f else 1 for f in local], device=accelerator.device),
                               reduction="sum")  # how many processes cannot share, per micro-batch
    return micro_batches, [int(n) == 0 for n in flags.tolist()]


def loss_counts(accelerator, rows: list[Row], max_len: int, dropped: Collection[int] = ()) -> dict[str, float]:
    """The denominators of the loss over one mini-batch on all processes: ``tokens`` (loss-mask sum), ``rows``,
    ``nonempty_rows`` (rows with a token in the loss) and ``max_len`` (Dr.GRPO's constant length).

    Every micro-batch divides its partial sum by these, so the gradient is the one-batch, one-process gradient
    whatever the micro-batching and the split of rows over processes (a row weighs the same on every process).
    ``dropped``: ``id(row)`` of rows the loss leaves out (sequence masking); they count as rows without tokens.
    """
    tokens = nonempty = 0.0
    for r in rows:
        n = 0.0 if id(r) in dropped else float(len(r.response_ids) if r.loss_mask is None else np.sum(r.loss_mask))
        tokens += n
        nonempty += float(n > 0)
    t = torch.tensor([tokens, float(len(rows)), nonempty], dtype=torch.float64, device=accelerator.device)
    tokens, n_rows, nonempty = accelerator.reduce(t, reduction="sum").tolist()
    return {"tokens": tokens, "rows": n_rows, "nonempty_rows": nonempty, "max_len": float(max_len)}


def update_orders(accelerator, n_rows: int, mini_batch_size: int, epochs: int,
                  seed: int) -> tuple[int, list[list[int]]]:
    """(mini-batches per epoch, one row order per epoch): the mini-batch count comes from the largest row count
    over the processes, so every process takes the same number of optimizer steps (or DDP's all-reduce would
    hang); the orders are seeded by ``seed`` (the script's seed, iteration and rank)."""
    most = accelerator.gather(torch.tensor([n_rows], device=accelerator.device)).max().item()
    shuffle = torch.Generator().manual_seed(seed)
    orders = [torch.randperm(n_rows, generator=shuffle).tolist() for _epoch in range(epochs)]
    return max(1, math.ceil(most / mini_batch_size)), orders
