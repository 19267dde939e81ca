"""A deliberately naive reference of every method's update, from the math in docs/algorithms.md.

One batch, one process, plain loops: every row is its own forward pass (no padding, no shared prefixes, no
micro-batches, no rollout log-probs), advantages are recomputed from the rows' raw fields over all processes' rows
(groups and episodes keyed by process), and each optimizer step's loss is the one-batch loss of that step's rows.
``tests/test_reference_update.py`` compares its gradients with those a script really stepped with
(``tests/record_update.py``).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import torch

EPS = 1e-6
GRPO_FAMILY = ("grpo", "gspo", "sapo", "cispo", "dapo")


# ---- advantages (one value per row, or per token for PPO) ---------------------------------------------------------
def grpo_adv(rows, score, norm_by_std=True):
    out = {}
    groups = defaultdict(list)
    for i, r in enumerate(rows):
        groups[r["gkey"]].append(i)
    for members in groups.values():
        x = [score[i] for i in members]
        if len(x) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(x) / len(x)
            std = math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1))
        for i in members:
            out[i] = (score[i] - mean) / (std + EPS) if norm_by_std else score[i] - mean
    return [out[i] for i in range(len(rows))]


def gigpo_adv(rows, score, a):
    norm = a["gigpo_mode"] == "mean_std_norm"
    episode = grpo_adv(rows, score, norm)
    returns = [0.0] * len(rows)
    for ekey in {r["ekey"] for r in rows}:
        running = 0.0
        for i in sorted((i for i, r in enumerate(rows) if r["ekey"] == ekey), key=lambda i: -rows[i]["turn"]):
            running = rows[i]["step_reward"] + a["gamma"] * running
            returns[i] = running
    returns = [g - r["format_penalty"] for g, r in zip(returns, rows)]
    step = [0.0] * len(rows)
    groups = defaultdict(list)
    for i, r in enumerate(rows):
        groups[(r["gkey"], r["anchor"])].append(i)
    for members in groups.values():
        if len(members) < 2:
            continue
        x = [returns[i] for i in members]
        mean = sum(x) / len(x)
        std = math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1))
        for i in members:
            step[i] = (returns[i] - mean) / (std + EPS) if norm else returns[i] - mean
    return [e + a["step_advantage_w"] * s for e, s in zip(episode, step)]


def rloo_adv(rows, score):
    out = [0.0] * len(rows)
    for gkey in {r["gkey"] for r in rows}:
        members = [i for i, r in enumerate(rows) if r["gkey"] == gkey]
        episodes = sorted({rows[i]["ekey"] for i in members})
        ep_score = {e: np.mean([score[i] for i in members if rows[i]["ekey"] == e]) for e in episodes}
        for i in members:
            others = [ep_score[e] for e in episodes if e != rows[i]["ekey"]]
            out[i] = score[i] - (sum(others) / len(others) if others else 0.0)
    return out


def empg_adv(rows, adv, entropy, a):
    h = np.array(entropy)
    h = (h - h.min()) / (h.max() - h.min() + 1e-8)
    g = np.exp(-a["empg_k"] * h)
    g = g / g.mean()
    f = np.exp(-a["empg_k_f"] * h)
    where = {(r["ekey"], r["turn"]): i for i, r in enumerate(rows)}
    out = [g[i] * adv[i] + a["empg_zeta"] * (f[where[(r["ekey"], r["turn"] + 1)]]
                                               if (r["ekey"], r["turn"] + 1) in where else 0.0)
           for i, r in enumerate(rows)]
    mean = sum(out) / len(out)
    return [v - mean for v in out]


def advantages(method, a, rows, entropy):
    """Per-row advantages of the non-PPO methods, from the rows' raw fields."""
    score = [r["env_return"] - r["format_penalty"] for r in rows]
    if method == "dapo" and a["overlong_penalty_factor"] > 0:
        raise NotImplementedError("overlong shaping is not part of this reference")
    if method in ("gigpo", "sampo") or (method == "dapo" and a["advantage"] == "gigpo"):
        return gigpo_adv(rows, score, a)
    if method == "rloo":
        return rloo_adv(rows, score)
    adv = grpo_adv(rows, score, a.get("norm_adv_by_std", True))
    return empg_adv(rows, adv, entropy, a) if method == "empg" else adv


# ---- per-row forward ---------------------------------------------------------------------------------------------
def row_forward(model, row, temperature):
    """(log-probs (n,), entropies (n,)) of the row's response tokens: one forward of prompt + response."""
    ids = torch.tensor([row["prompt_ids"] + row["response_ids"]])
    P, n = len(row["prompt_ids"]), len(row["response_ids"])
    logits = model(input_ids=ids).logits[0, P - 1:P + n - 1].float() / temperature  # (n, V)
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all[torch.arange(n), torch.tensor(row["response_ids"])]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def row_values(critic, row):
    ids = torch.tensor([row["prompt_ids"] + row["response_ids"]])
    P, n = len(row["prompt_ids"]), len(row["response_ids"])
    return critic(input_ids=ids).logits[0, P - 1:P + n - 1, 0].float()


def mask_of(row):
    m = row.get("loss_mask")
    return torch.ones(len(row["response_ids"])) if m is None else torch.as_tensor(np.asarray(m), dtype=torch.float32)


# ---- aggregation and per-token losses ----------------------------------------------------------------------------
def aggregate(terms, masks, mode, max_len, dropped=()):
    """One-batch aggregation of per-row token terms (ARLArena §3.1) with dropped rows left out."""
    masks = [torch.zeros_like(m) if b in dropped else m for b, m in enumerate(masks)]
    tokens = sum(float(m.sum()) for m in masks)
    nonempty = sum(float(m.sum() > 0) for m in masks)
    sums = [(t * m).sum() for t, m in zip(terms, masks)]
    if mode == "token-mean":
        return sum(sums) / max(tokens, 1.0)
    if mode == "seq-mean-token-mean":
        return sum(s / max(float(m.sum()), 1.0) for s, m in zip(sums, masks)) / max(nonempty, 1.0)
    if mode == "seq-mean-token-sum":
        return sum(sums) / len(terms)
    if mode == "seq-mean-token-sum-norm":
        return sum(sums) / (len(terms) * max_len)
    raise ValueError(mode)


def vanilla(logp, old, adv, a):
    ratio = torch.exp(torch.clamp(logp - old, -20, 20))
    out = []
    for t in range(len(logp)):
        l1 = -adv * ratio[t]
        l2 = -adv * torch.clamp(ratio[t], 1 - a["clip_ratio_low"], 1 + a["clip_ratio_high"])
        c = torch.maximum(l1, l2)
        out.append(torch.minimum(c, torch.tensor(-adv * a["clip_ratio_c"])) if adv < 0 else c)
    return torch.stack(out)


def gspo(logp, old, adv, mask, a):
    seq = ((logp - old) * mask).sum() / max(float(mask.sum()), 1.0)
    ratio = torch.exp(torch.clamp(seq.detach() + logp - logp.detach(), max=10.0))
    return torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - a["clip_ratio_low"], 1 + a["clip_ratio_high"]))


def sapo(logp, old, adv, a):
    tau = a["tau_pos"] if adv > 0 else a["tau_neg"]
    ratio = torch.exp(torch.clamp(logp - old, -20, 20))
    return -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * adv


def cispo(logp, old, adv, a):
    ratio = torch.exp(torch.clamp(logp - old, -20, 20))
    return -torch.clamp(ratio, 1 - a["clip_ratio_low"], 1 + a["clip_ratio_high"]).detach() * adv * logp


def k3(logp, ref):
    x = torch.clamp(ref - logp, -20, 20)
    return torch.clamp(torch.exp(x) - x - 1, -10, 10)


# ---- PPO's token advantages ---------------------------------------------------------------------------------------
def ppo_targets(rows, values, a):
    """GAE on each row's token rewards (score on its last token), whitened over all tokens of all rows."""
    advs, rets = [], []
    for r, v in zip(rows, values):
        n = len(r["response_ids"])
        reward = [0.0] * n
        reward[-1] = r["env_return"] - r["format_penalty"]
        adv, next_v, next_a = [0.0] * n, 0.0, 0.0
        for t in reversed(range(n)):
            delta = reward[t] + a["gamma"] * next_v - float(v[t])
            next_a, next_v = delta + a["gamma"] * a["lam"] * next_a, float(v[t])
            adv[t] = next_a
        advs.append(adv)
        rets.append([x + float(vt) for x, vt in zip(adv, v)])
    flat = [x for adv in advs for x in adv]
    mean = sum(flat) / len(flat)
    var = sum((x - mean) ** 2 for x in flat) / (len(flat) - 1)
    return [[(x - mean) / math.sqrt(var + 1e-8) for x in adv] for adv in advs], rets


# ---- the update ---------------------------------------------------------------------------------------------------
def reference_grads(method, a, steps, model_path, applied=None):
    """Gradients of every optimizer step. ``steps``: per step, that step's rows (dicts with ``gkey``/``ekey``),
    each row a dict of Row's fields; ``a``: the script's arguments. Steps run one after another with SGD at
    ``a['learning_rate']`` (the critic at its own rate), as the recorded run did; with ``applied`` (per step, the
    gradients the run stepped with) each step applies those, so that every step's gradient is compared at the
    very parameters the run had (float differences are not amplified by the steps)."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    critic = None
    if method == "ppo":
        critic = AutoModelForTokenClassification.from_pretrained(model_path, num_labels=1, dtype=torch.float32)
        for p in critic.score.parameters():
            torch.nn.init.zeros_(p)
        critic.eval()
    all_rows = {id(r): r for rows in steps for r in rows}.values()  # one iteration: every row of its batch
    rows = list(all_rows)
    T = a["temperature"]
    with torch.no_grad():
        first = [row_forward(model, r, T) for r in rows]
        old = {id(r): f[0] for r, f in zip(rows, first)}
        ref_lp = {id(r): row_forward(ref, r, T)[0] for r in rows}
        entropy = [float((f[1] * mask_of(r)).sum() / mask_of(r).sum()) for r, f in zip(rows, first)]
        if method == "empg":  # min-max normalisation of near-equal entropies would amplify float noise
            assert np.allclose(entropy, [r["entropy"] for r in rows], rtol=0, atol=1e-5)
            entropy = [r["entropy"] for r in rows]
        if method == "ppo":
            values0 = [row_values(critic, r) for r in rows]
            adv_tok, returns = ppo_targets(rows, values0, a)
            adv = {id(r): torch.tensor(x) for r, x in zip(rows, adv_tok)}
            ret = {id(r): torch.tensor(x) for r, x in zip(rows, returns)}
            old_v = {id(r): v for r, v in zip(rows, values0)}
        else:
            adv = {id(r): float(x) for r, x in zip(rows, advantages(method, a, rows, entropy))}
    max_len = a["max_response_tokens"] * (a["max_turns"] if a["row_layout"] == "trajectory" else 1)
    mode = a["loss_agg_mode"]
    grads = []
    for step_rows in steps:
        params = list(model.parameters()) + (list(critic.parameters()) if critic is not None else [])
        for p in params:
            p.grad = None
        outs = [row_forward(model, r, T) for r in step_rows]
        masks = [mask_of(r) for r in step_rows]
        pg_terms, dropped = [], set()
        for b, (r, (logp, _)) in enumerate(zip(step_rows, outs)):
            o, A = old[id(r)], adv[id(r)]
            if method in ("gspo", "sampo"):
                pg_terms.append(gspo(logp, o, A, masks[b], a))
            elif method == "sapo":
                pg_terms.append(sapo(logp, o, A, a))
            elif method == "cispo":
                pg_terms.append(cispo(logp, o, A, a))
            elif method == "ppo":
                pg_terms.append(torch.stack([vanilla(logp[t:t + 1], o[t:t + 1], float(A[t]), a)[0]
                                             for t in range(len(logp))]))
            else:
                pg_terms.append(vanilla(logp, o, A, a))
            if a.get("rollout_is", "none") != "none":  # rollout/trainer importance weight per token (detached)
                rho = torch.exp(o - torch.as_tensor(np.asarray(r["rollout_logp"]), dtype=torch.float32))
                cap = a["rollout_is_cap"]
                w = torch.clamp(rho, max=cap) if a["rollout_is"] == "tis" else rho * (rho <= cap)
                pg_terms[-1] = pg_terms[-1] * w
            if a.get("use_seq_mask"):
                m = masks[b]
                mean_adv = float((torch.as_tensor(A) * m).sum() / m.sum().clamp(min=1))
                mean_lr = float(((o - logp.detach()) * m).sum() / m.sum().clamp(min=1))
                if mean_adv < 0 and mean_lr > a["seq_mask_delta"]:
                    dropped.add(b)
        pg_mode = "seq-mean-token-mean" if method in ("gspo", "sampo") else mode
        loss = aggregate(pg_terms, masks, pg_mode, max_len, dropped)
        kl_weight = 0.0 if a.get("kl_in_reward") else a["kl_coef"]
        loss = loss + kl_weight * aggregate([k3(lp, ref_lp[id(r)]) for r, (lp, _) in zip(step_rows, outs)],
                                            masks, mode, max_len)
        loss = loss - a["entropy_coef"] * aggregate([h for _, h in outs], masks, mode, max_len)
        if method == "ppo":
            terms = []
            for r in step_rows:
                v, vo, R = row_values(critic, r), old_v[id(r)], ret[id(r)]
                clipped = vo + torch.clamp(v - vo, -a["value_clip"], a["value_clip"])
                terms.append(torch.maximum((v - R) ** 2, (clipped - R) ** 2))
            loss = loss + 0.5 * aggregate(terms, masks, mode, max_len)
        loss.backward()
        grads.append([p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params])
        step = grads[-1] if applied is None else applied[len(grads) - 1]
        n_policy = len(list(model.parameters()))
        with torch.no_grad():
            lr = a["learning_rate"]
            critic_lr = a.get("critic_lr") or 10 * lr
            for k, p in enumerate(params):
                p.add_(step[k], alpha=-(lr if k < n_policy else critic_lr))
    return grads
