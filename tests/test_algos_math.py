"""Property tests of the method-specific math of algos/*.py.

Against the invariants of docs/algorithms.md "Tested invariants" (items 3-6, 9-13).

Losses: float64 autograd gradients compared with closed forms. Advantages: numpy float64 invariants.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import load_script
from hypothesis import given, settings
from hypothesis import strategies as st

import arena_train.advantages as shared_advantages
from arena_train.rollout import Row

F64 = torch.float64
SETTINGS = settings(max_examples=50, deadline=None)

grpo, gspo, sapo, cispo, gigpo, empg, dapo, sampo, rloo, ppo = map(
    load_script, ["grpo", "gspo", "sapo", "cispo", "gigpo", "empg", "dapo", "sampo", "rloo", "ppo"])


# ---------------------------------------------------------------------------------------------- strategies
@st.composite
def loss_batch(draw, scale=0.5, ratio_one=False, max_rows=5, max_len=6):
    """(logp (B,T) requiring grad, old_logp, advantages = row scalar broadcast x mask, mask), float64."""
    B, T = draw(st.integers(1, max_rows)), draw(st.integers(1, max_len))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    mask = torch.zeros(B, T, dtype=F64)
    for b in range(B):
        mask[b, :draw(st.integers(1, T))] = 1.0
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3 - 0.05
    logp = old.clone() if ratio_one else old + scale * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.tensor([draw(st.sampled_from([-1.5, -0.3, 0.0, 0.4, 2.0])) for _ in range(B)], dtype=F64)
    return logp.requires_grad_(True), old, adv[:, None] * mask, mask


def grad(loss_fn, logp, *args, **kwargs):
    loss, metrics = loss_fn(logp, *args, **kwargs)
    (g,) = torch.autograd.grad(loss, logp)
    return g, loss, metrics


def grpo_grad(logp, old, adv, mask, agg_mode):
    return grad(grpo.policy_loss, logp, old, adv, mask, agg_mode=agg_mode)[0]


@st.composite
def multi_turn_rows(draw, max_groups=3, max_group_size=4, max_turns=4):
    """Per-row arrays of a multi-turn batch in random row order (as main() hands them to the estimators)."""
    rows, episode = [], 0
    for g in range(draw(st.integers(1, max_groups))):
        for _ in range(draw(st.integers(1, max_group_size))):
            n, won = draw(st.integers(1, max_turns)), draw(st.booleans())
            for k in range(n):
                anchor = "start" if k == 0 else draw(st.sampled_from(["a", "b", "c", "Nothing happens."]))
                rows.append(dict(group=g, episode=episode, turn=k, anchor=anchor,
                                 reward=10.0 * won if k == n - 1 else draw(st.sampled_from([0.0, 0.0, 1.0, -0.1])),
                                 penalty=draw(st.sampled_from([0.0, 0.1]))))
            episode += 1
    rows = [rows[i] for i in draw(st.permutations(range(len(rows))))]
    ret = {}
    for r in rows:
        ret[r["episode"]] = ret.get(r["episode"], 0.0) + r["reward"]

    def col(key: str) -> np.ndarray:
        return np.array([r[key] for r in rows])

    return dict(scores=np.array([ret[r["episode"]] - r["penalty"] for r in rows]), step_rewards=col("reward"),
                penalties=col("penalty"), group_ids=col("group"), episode_ids=col("episode"), turns=col("turn"),
                anchors=[r["anchor"] for r in rows])


def sums_by(values, keys) -> dict:
    out: dict = {}
    for v, k in zip(np.asarray(values).tolist(), keys):
        out[k] = out.get(k, 0.0) + v
    return out


def gigpo_call(module, d, **kwargs):
    return module.gigpo_advantages(d["scores"], d["step_rewards"], d["penalties"], d["group_ids"], d["episode_ids"],
                                   d["turns"], d["anchors"], **kwargs)


# ---------------------------------------------------------------------------------------------- 3. GSPO
@SETTINGS
@given(loss_batch(ratio_one=True))
def test_gspo_at_ratio_one_equals_grpo_seq_mean_token_mean(b):
    logp, old, adv, mask = b
    for module in (gspo, sampo):
        torch.testing.assert_close(grad(module.policy_loss, logp, old, adv, mask)[0],
                                   grpo_grad(logp, old, adv, mask, "seq-mean-token-mean"))


@SETTINGS
@given(loss_batch(scale=0.01), st.sampled_from([(3e-3, 4e-3), (0.2, 0.2)]))
def test_gspo_rows_clipped_all_or_nothing(b, clip):
    logp, old, adv, mask = b
    g, _, m = grad(gspo.policy_loss, logp, old, adv, mask, clip_low=clip[0], clip_high=clip[1])
    lens = mask.sum(-1)
    s = torch.exp(((logp.detach() - old) * mask).sum(-1) / lens)  # (B,) sequence ratio
    a = adv[:, 0]
    out_of_band = ((a > 0) & (s > 1 + clip[1])) | ((a < 0) & (s < 1 - clip[0]))
    expected = torch.where(out_of_band, 0.0, -a * s / (len(lens) * lens))[:, None] * mask
    torch.testing.assert_close(g, expected)  # in band: -A s / (B |y|) on every token; out of band: 0
    clipped_tokens = (out_of_band[:, None] * mask).sum() / mask.sum()
    assert m["clipfrac_upper"] + m["clipfrac_lower"] == pytest.approx(float(clipped_tokens))


@SETTINGS
@given(loss_batch(), st.integers(0, 2**31 - 1))
def test_gspo_depends_on_tokens_only_through_row_mean_log_ratio(b, seed):
    logp, old, adv, mask = b
    noise = torch.randn(logp.shape, generator=torch.Generator().manual_seed(seed), dtype=F64) * mask
    noise -= noise.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True) * mask  # zero row mean
    torch.testing.assert_close(gspo.policy_loss(logp, old, adv, mask)[0],
                               gspo.policy_loss(logp.detach() + noise, old, adv, mask)[0])


# ---------------------------------------------------------------------------------------------- 4. SAPO
@pytest.mark.parametrize("method", ["sapo", "cispo"])
@SETTINGS
@given(loss_batch(ratio_one=True), st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]))
def test_at_ratio_one_equals_grpo(method, b, agg):
    """SAPO's gate and CISPO's detached weight both reduce to GRPO's gradient at r = 1 (§9 items 4, 5)."""
    logp, old, adv, mask = b
    loss_fn = {"sapo": sapo, "cispo": cispo}[method].policy_loss
    torch.testing.assert_close(grad(loss_fn, logp, old, adv, mask, agg_mode=agg)[0],
                               grpo_grad(logp, old, adv, mask, agg))


@SETTINGS
@given(loss_batch(scale=1.0), st.floats(0.5, 3.0), st.floats(0.5, 3.0))
def test_sapo_gradient_closed_form_weight_below_ratio(b, tau_pos, tau_neg):
    logp, old, adv, mask = b
    g, _, _ = grad(sapo.policy_loss, logp, old, adv, mask, tau_pos=tau_pos, tau_neg=tau_neg)
    r = torch.exp(logp.detach() - old)
    tau = torch.where(adv[:, :1] > 0, tau_pos, tau_neg).to(F64)
    weight = r / torch.cosh(tau * (r - 1) / 2) ** 2  # r sech^2(tau (r - 1) / 2)
    torch.testing.assert_close(g, -adv * weight * mask / mask.sum())
    assert bool((weight <= r * (1 + 1e-12)).all())


@SETTINGS
@given(st.floats(0.5, 3.0), st.floats(0.5, 3.0), st.floats(-0.5, 0.5))
def test_sapo_zero_mean_advantage_row_uses_tau_neg(tau_pos, tau_neg, shift):
    old = torch.tensor([[-1.0, -2.0]], dtype=F64)
    logp = (old + shift).requires_grad_(True)
    adv, mask = torch.tensor([[1.0, -1.0]], dtype=F64), torch.ones(1, 2, dtype=F64)
    g, _, _ = grad(sapo.policy_loss, logp, old, adv, mask, tau_pos=tau_pos, tau_neg=tau_neg)
    r = math.exp(shift)
    w = r / math.cosh(tau_neg * (r - 1) / 2) ** 2
    torch.testing.assert_close(g, torch.tensor([[-w / 2, w / 2]], dtype=F64))


# ---------------------------------------------------------------------------------------------- 5. CISPO
@SETTINGS
@given(loss_batch(scale=1.0), st.sampled_from([(1.0, 0.2), (0.2, 0.28)]),
       st.sampled_from(["token-mean", "seq-mean-token-mean"]))
def test_cispo_weight_is_detached(b, clip, agg):
    logp, old, adv, mask = b
    g, _, m = grad(cispo.policy_loss, logp, old, adv, mask, clip_low=clip[0], clip_high=clip[1], agg_mode=agg)
    r = torch.exp(logp.detach() - old)
    w = torch.clamp(r, 1 - clip[0], 1 + clip[1])
    per_token = mask / mask.sum() if agg == "token-mean" else mask / (mask.shape[0] * mask.sum(-1, keepdim=True))
    torch.testing.assert_close(g, -w * adv * per_token)  # exactly -clip(r) A, even out of band
    assert m["clipfrac_upper"] == pytest.approx(float(((r > 1 + clip[1]) * mask).sum() / mask.sum()))



def test_cispo_keeps_gradient_where_ppo_clips():
    old = torch.full((1, 3), -1.0, dtype=F64)
    logp = (old + 0.5).requires_grad_(True)  # r = e^0.5 > 1.2, A > 0: PPO's gradient is 0
    adv, mask = torch.ones(1, 3, dtype=F64), torch.ones(1, 3, dtype=F64)
    assert torch.all(grpo_grad(logp, old, adv, mask, "token-mean") == 0)
    torch.testing.assert_close(grad(cispo.policy_loss, logp, old, adv, mask)[0],
                               torch.full((1, 3), -1.2 / 3, dtype=F64))


# ---------------------------------------------------------------------------------------------- 6. seq-mask
@pytest.mark.parametrize("name", ["sapo", "cispo"])
@SETTINGS
@given(b=loss_batch(scale=0.3), delta=st.sampled_from([0.0, 3e-3, 0.1]))
def test_seq_mask_masks_only_negative_off_policy_rows(name, b, delta):
    module = load_script(name)
    logp, old, adv, mask = b
    g, _, m = grad(module.policy_loss, logp, old, adv, mask, seq_mask_delta=delta)
    drift = ((old - logp.detach()) * mask).sum(-1) / mask.sum(-1)
    rejected = (adv[:, 0] < 0) & (drift > delta)
    assert m["masked_seqs"] == int(rejected.sum())
    assert torch.all(g[rejected] == 0)
    at_one = old.clone().requires_grad_(True)
    assert grad(module.policy_loss, at_one, old, adv, mask, seq_mask_delta=delta)[2]["masked_seqs"] == 0


# ---------------------------------------------------------------------------------------------- 10. GiGPO
def test_shared_gigpo_estimator_is_gigpo_scripts_copy():
    """dapo.py's --advantage gigpo imports arena_train.advantages: the same code as gigpo.py's visible estimator."""
    script = ast.parse(Path(gigpo.__file__).read_text())
    shared = ast.parse(Path(shared_advantages.__file__).read_text())
    mine = {n.name: ast.dump(n) for n in shared.body if isinstance(n, ast.FunctionDef)}
    theirs = {n.name: ast.dump(n) for n in script.body if isinstance(n, ast.FunctionDef) and n.name in mine}
    assert set(mine) == {"compute_advantages", "discounted_step_returns", "step_groups", "step_advantages",
                         "gigpo_advantages"}
    assert mine == theirs


@SETTINGS
@given(multi_turn_rows(), st.sampled_from(["mean_norm", "mean_std_norm"]), st.floats(0.0, 1.0), st.floats(0.0, 2.0))
def test_shared_gigpo_estimator_equals_gigpo_script(d, mode, gamma, weight):
    want = gigpo_call(gigpo, d, mode=mode, gamma=gamma, step_weight=weight)
    got = gigpo_call(shared_advantages, d, mode=mode, gamma=gamma, step_weight=weight)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@SETTINGS
@given(multi_turn_rows(), st.sampled_from(["mean_norm", "mean_std_norm"]))
def test_gigpo_omega_zero_is_pooled_grpo(d, mode):
    for module in (gigpo, shared_advantages, sampo):
        adv, _ = gigpo_call(module, d, step_weight=0.0, mode=mode)
        expected = grpo.compute_advantages(d["scores"], d["group_ids"], d["episode_ids"], cross_steps=True,
                                           norm_by_std=mode == "mean_std_norm")
        np.testing.assert_allclose(adv, expected, atol=1e-12)


@SETTINGS
@given(multi_turn_rows(), st.sampled_from(["mean_norm", "mean_std_norm"]), st.floats(0.0, 1.0))
def test_gigpo_step_and_episode_groups_sum_to_zero(d, mode, gamma):
    adv, step = gigpo_call(gigpo, d, mode=mode, gamma=gamma)
    sizes = sums_by(np.ones(len(adv)), d["group_ids"].tolist())
    for g, total in sums_by(adv - step, d["group_ids"].tolist()).items():
        assert abs(total) < 1e-9 or sizes[g] == 1  # a lone row keeps its raw score, as in GRPO
    for total in sums_by(step, list(zip(d["group_ids"].tolist(), d["anchors"]))).values():
        assert abs(total) < 1e-9


@SETTINGS
@given(multi_turn_rows())
def test_gigpo_unique_anchors_give_no_step_part_and_groups_never_cross_tasks(d):
    _, step = gigpo_call(gigpo, {**d, "anchors": list(range(len(d["scores"])))})
    assert np.all(step == 0)
    _, step = gigpo_call(gigpo, {**d, "anchors": ["same"] * len(d["scores"])}, mode="mean_norm")
    for total in sums_by(step, d["group_ids"].tolist()).values():
        assert abs(total) < 1e-9  # one anchor everywhere still splits by episode group


@SETTINGS
@given(multi_turn_rows(), st.floats(0.0, 1.0))
def test_gigpo_discounted_returns_recursion(d, gamma):
    ret = gigpo.discounted_step_returns(d["step_rewards"], d["episode_ids"], d["turns"], gamma)
    at = {(e, k): i for i, (e, k) in enumerate(zip(d["episode_ids"].tolist(), d["turns"].tolist()))}
    for (e, k), i in at.items():
        following = ret[at[(e, k + 1)]] if (e, k + 1) in at else 0.0
        assert ret[i] == pytest.approx(d["step_rewards"][i] + gamma * following, abs=1e-9)


@SETTINGS
@given(multi_turn_rows(), st.floats(0.5, 10.0))
def test_gigpo_mean_std_norm_is_scale_invariant(d, a):
    base, _ = gigpo_call(gigpo, d, eps=1e-6)
    scaled, _ = gigpo_call(gigpo, {**d, "scores": a * d["scores"], "step_rewards": a * d["step_rewards"],
                                   "penalties": a * d["penalties"]}, eps=a * 1e-6)  # eps scales with the rewards
    sizes = sums_by(np.ones(len(base)), d["group_ids"].tolist())
    grouped = np.array([sizes[g] > 1 for g in d["group_ids"].tolist()])  # lone rows keep the raw score
    np.testing.assert_allclose(scaled[grouped], base[grouped], atol=1e-7, rtol=1e-7)


@SETTINGS
@given(multi_turn_rows())
def test_gigpo_row_permutation_equivariance(d):
    perm = np.random.default_rng(0).permutation(len(d["scores"]))
    permuted = {k: (v[perm] if isinstance(v, np.ndarray) else [v[i] for i in perm]) for k, v in d.items()}
    np.testing.assert_allclose(gigpo_call(gigpo, permuted)[0], gigpo_call(gigpo, d)[0][perm], atol=1e-12)


def test_gigpo_similarity_merges_near_identical_text_anchors_within_a_group():
    ids = gigpo.step_groups(np.array([0, 0, 0, 1]), ["you see a mug", "you see a mug.", "an empty room",
                                                     "you see a mug"], similarity_thresh=0.9)
    assert ids[0] == ids[1] != ids[2] and ids[3] not in ids[:3]
    assert len(set(gigpo.step_groups(np.array([0, 0]), ["you see a mug", "you see a mug."]))) == 2  # exact


# ---------------------------------------------------------------------------------------------- 11. EMPG
@SETTINGS
@given(multi_turn_rows(), st.integers(0, 2**31 - 1), st.floats(0.1, 3.0), st.floats(0.0, 0.5))
def test_empg_scale_has_mean_one_and_output_is_centred(d, seed, k, zeta):
    base = grpo.compute_advantages(d["scores"], d["group_ids"], d["episode_ids"])
    h = np.random.default_rng(seed).uniform(0, 2, len(base))
    adv, g = empg.empg_advantages(base, h, d["episode_ids"], d["turns"], k=k, zeta=zeta)
    assert g.mean() == pytest.approx(1.0, abs=1e-9) and adv.mean() == pytest.approx(0.0, abs=1e-9)
    assert g[h.argmin()] == g.max()  # the most confident step is amplified most


@SETTINGS
@given(multi_turn_rows(), st.floats(0.0, 0.5))
def test_empg_constant_entropy_leaves_grpo_plus_bonus(d, zeta):
    base = grpo.compute_advantages(d["scores"], d["group_ids"], d["episode_ids"])
    adv, g = empg.empg_advantages(base, np.full(len(base), 0.7), d["episode_ids"], d["turns"], zeta=zeta)
    np.testing.assert_allclose(g, 1.0)
    keys = set(zip(d["episode_ids"].tolist(), d["turns"].tolist()))
    has_next = np.array([(e, t + 1) in keys for e, t in zip(d["episode_ids"].tolist(), d["turns"].tolist())])
    expected = base + zeta * has_next
    np.testing.assert_allclose(adv, expected - expected.mean(), atol=1e-12)


# ---------------------------------------------------------------------------------------------- 9. RLOO
@SETTINGS
@given(multi_turn_rows())
def test_rloo_baseline_leaves_out_the_own_episode(d):
    adv = rloo.compute_advantages(d["scores"], d["group_ids"], d["episode_ids"])
    ep_score = {e: d["scores"][d["episode_ids"] == e].mean() for e in np.unique(d["episode_ids"])}
    ep_group = dict(zip(d["episode_ids"].tolist(), d["group_ids"].tolist()))
    for i, (s, e) in enumerate(zip(d["scores"], d["episode_ids"].tolist())):
        others = [v for u, v in ep_score.items() if ep_group[u] == ep_group[e] and u != e]
        assert adv[i] == pytest.approx(s - np.mean(others) if others else s, abs=1e-9)
    ep_adv = {e: adv[d["episode_ids"] == e].mean() for e in ep_score}
    for g in set(ep_group.values()):  # episode-level advantages of a group sum to 0
        members = [ep_adv[e] for e in ep_adv if ep_group[e] == g]
        assert len(members) == 1 or abs(sum(members)) < 1e-9


@SETTINGS
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=8))
def test_rloo_row_mode_closed_form(xs):
    r, n = np.array(xs), len(xs)
    adv = rloo.compute_advantages(r, np.zeros(n), np.zeros(n), leave_out="row")
    np.testing.assert_allclose(adv, r * n / (n - 1) - r.mean() * n / (n - 1), atol=1e-9)
    assert abs(adv.sum()) < 1e-9


# ---------------------------------------------------------------------------------------------- 12. dynamic sampling
def fake_rollout(batches, group_size):
    """rollout(attempt) -> (rows, episodes) of arena_train Rows; batches[a][g] = env returns of group g."""
    def rollout(attempt):
        rows, episodes = [], []
        for g, returns in enumerate(batches[attempt]):
            for i, ret in enumerate(returns):
                ep = (attempt * 100 + g) * group_size + i
                episodes.append(ep)
                for turn in range(1 + (ep % 3)):
                    rows.append(Row(group=attempt * 100 + g, episode=ep, turn=turn, prompt_ids=[1],
                                    response_ids=[2], step_reward=0.0, format_penalty=0.0, format_ok=True,
                                    action_is_valid=True, anchor="s", won=ret > 0, env_return=ret))
        return rows, episodes
    return rollout


@pytest.mark.parametrize("name", ["dapo", "sampo"])
@SETTINGS
@given(batches=st.lists(st.lists(st.lists(st.sampled_from([0.0, 10.0]), min_size=3, max_size=3), min_size=1,
                                 max_size=5), min_size=4, max_size=4),
       n_groups=st.integers(1, 5), tries=st.integers(1, 4))
def test_dynamic_sampling_keeps_whole_informative_groups(name, batches, n_groups, tries):
    module = load_script(name)
    rows, episodes, stats = module.dynamic_sample(fake_rollout(batches, 3), n_groups, tries)
    by_group: dict = {}
    for r in rows:
        by_group.setdefault(r.group, {})[r.episode] = r.env_return
    assert len(by_group) == stats["kept_groups"] <= n_groups and stats["gen_batches"] <= tries
    assert len(episodes) == 3 * sum(len(batches[a]) for a in range(stats["gen_batches"]))
    last = stats["gen_batches"] - 1
    for g, returns in by_group.items():
        assert len(returns) == 3  # atomic: every episode of a kept group, hence a multiple of the group size
        assert len(set(returns.values())) > 1 or (g // 100 == last == tries - 1)  # constant only as last-try fill
    if stats["kept_groups"] < n_groups:
        assert stats["gen_batches"] == tries
    if tries == 1:  # no filtering: the whole rollout batch
        assert stats["kept_groups"] == min(n_groups, len(batches[0]))


def test_select_groups_fill_order():
    returns = [[1, 1], [0, 10], [2, 2], [10, 0]]
    assert dapo.select_groups(returns, 3, fill=False) == [1, 3]
    assert dapo.select_groups(returns, 3, fill=True) == [1, 3, 0]
    assert dapo.select_groups(returns, 1, fill=True) == [1]


def test_overlong_penalty_matches_arlarena_reward_manager():
    np.testing.assert_allclose(dapo.overlong_penalty(np.array([10, 410, 460, 512]), 512, 0.1),
                               [0.0, 0.0, -50 / 102 * 0.1, -0.1])
    assert np.all(dapo.overlong_penalty(np.array([1, 600]), 512, 0.0) == 0)


# ---------------------------------------------------------------------------------------------- 13. GAE / critic
@SETTINGS
@given(loss_batch(), st.floats(-5, 10))
def test_gae_terminal_reward_gamma_lambda_one_gives_return(b, R):
    _, _, _, mask = b
    B, T = mask.shape
    values = torch.randn(B, T, dtype=F64)
    rewards = torch.zeros(B, T, dtype=F64)
    rewards[torch.arange(B), mask.sum(-1).long() - 1] = R
    adv, ret = ppo.gae(rewards, values, mask, 1.0, 1.0)
    torch.testing.assert_close((adv + values)[mask > 0], torch.full((int(mask.sum()),), R, dtype=F64))
    torch.testing.assert_close(ret, adv + values)
    white = ppo.masked_whiten(adv, mask)
    n = float(mask.sum())
    assert float((white * mask).sum()) == pytest.approx(0.0, abs=1e-9)
    if n > 1:
        var = float(((adv - (adv * mask).sum() / n) ** 2 * mask).sum()) / (n - 1)
        assert float((white**2 * mask).sum() / (n - 1)) == pytest.approx(var / (var + 1e-8), rel=1e-9)


def test_gae_carries_through_masked_tokens():
    values = torch.tensor([[0.5, 9.0, 0.2, 0.1]], dtype=F64)
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]], dtype=F64)
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]], dtype=F64)
    adv, _ = ppo.gae(rewards, values, mask, 0.9, 0.8)
    a3 = 1.0 - 0.1
    a2 = 0.9 * 0.1 - 0.2 + 0.72 * a3
    a0 = 0.9 * 0.2 - 0.5 + 0.72 * a2  # the masked token is skipped: V_next = V_2, A_next = A_2
    torch.testing.assert_close(adv, torch.tensor([[a0, a2, a2, a3]], dtype=F64))


@SETTINGS
@given(loss_batch(), st.integers(0, 2**31 - 1))
def test_value_loss_gradient_closed_form(b, seed):
    _, _, _, mask = b
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(mask.shape, generator=g, dtype=F64)
    v = (old + torch.randn(mask.shape, generator=g, dtype=F64)).requires_grad_(True)
    ret = torch.randn(mask.shape, generator=g, dtype=F64)
    loss, _ = ppo.value_loss(v, old, ret, mask, clip=0.5)
    (gv,) = torch.autograd.grad(loss, v)
    vd = v.detach()
    clipped = old + torch.clamp(vd - old, -0.5, 0.5)
    use_clipped = (clipped - ret) ** 2 > (vd - ret) ** 2
    inside = (vd - old).abs() < 0.5
    expected = torch.where(use_clipped, torch.where(inside, clipped - ret, 0.0), vd - ret) * mask / mask.sum()
    torch.testing.assert_close(gv, expected)


def test_pad_rows_right_pads():
    out = ppo.pad_rows([np.array([1.0, 2.0]), np.array([]), np.array([3.0])], 3)
    torch.testing.assert_close(out, torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0], [3.0, 0.0, 0.0]]))
