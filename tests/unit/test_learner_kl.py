"""EMA-PG's KL pieces against hand-derived values and gradients (float64, 1e-6): the sampled estimators
k3plusplus / k4 / k5, the top-k KL with its tail correction, the KL importance weight, the EMA update.

Expected numbers come from closed forms written out here with `math` (softmax, log-ratios, and the
analytic gradients of each estimator), never from the functions under test."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from searchr1.learner.algo import losses as L
from searchr1.learner.algo.reference import ema_update_

torch.set_num_threads(1)
TOL = 1e-6
F64 = torch.float64


def _leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64, requires_grad=True)


def _grad(out: torch.Tensor, x: torch.Tensor) -> list[float]:
    (g,) = torch.autograd.grad(out.sum(), x)
    return g.tolist()


def _log_softmax(z: list[float]) -> list[float]:
    m = max(z)
    lse = m + math.log(sum(math.exp(v - m) for v in z))
    return [v - lse for v in z]


# ----------------------------------------------------------------------------- sampled estimators

LP, REF = math.log(0.2), math.log(0.5)  # π(y) = 0.2, π_ref(y) = 0.5


def test_k4_value_is_k1_and_gradient_is_the_log_ratio():
    lp = _leaf([LP])
    out = L.kl_penalty(lp, torch.tensor([REF], dtype=F64), "k4")
    assert out.item() == pytest.approx(math.log(0.4), abs=TOL)
    # d/d log π [sg(k1) · π/sg(π)] = sg(k1) = log π − log π_ref
    assert _grad(out, lp) == pytest.approx([math.log(0.4)], abs=TOL)


def test_k5_value_is_w_log_w_and_gradient_is_one_minus_w():
    lp = _leaf([LP])
    out = L.kl_penalty(lp, torch.tensor([REF], dtype=F64), "k5")
    w = 0.5 / 0.2
    assert out.item() == pytest.approx(w * math.log(w), abs=TOL)
    # d/d log π [sg(w)·(log π_ref − log π) + log π − sg(log π)] = −w + 1
    assert _grad(out, lp) == pytest.approx([1.0 - w], abs=TOL)


def test_k5_clamps_the_log_weight_and_its_gradient():
    lp = _leaf([-25.0])
    out = L.kl_penalty(lp, torch.tensor([0.0], dtype=F64), "k5")
    assert out.item() == pytest.approx(math.exp(20.0) * 20.0, rel=TOL)
    assert _grad(out, lp) == pytest.approx([1.0], abs=TOL)  # the clamped log w passes no gradient


def test_k3plusplus_value_is_k3_and_gradient_is_the_log_ratio():
    lp = _leaf([LP])
    out = L.kl_penalty(lp, torch.tensor([REF], dtype=F64), "k3plusplus")
    r = 0.5 / 0.2
    k3 = r - math.log(r) - 1.0
    assert out.item() == pytest.approx(k3, abs=TOL)
    # ∂k3/∂log π = 1 − r, plus k3 from π/sg(π): 1 − r + r − log r − 1 = −log r
    assert _grad(out, lp) == pytest.approx([-math.log(r)], abs=TOL)
    low_var = L.kl_penalty(lp, torch.tensor([REF], dtype=F64), "low_var_kl")
    assert low_var.item() == pytest.approx(k3, abs=TOL)
    assert _grad(low_var, lp) == pytest.approx([1.0 - r], abs=TOL)  # the gradients are what differ


def test_k3plusplus_clamped_at_ten_keeps_the_score_function_gradient():
    lp = _leaf([-15.0])
    ref = torch.tensor([0.0], dtype=F64)
    out = L.kl_penalty(lp, ref, "k3plusplus")
    assert out.item() == pytest.approx(10.0, abs=TOL)
    assert _grad(out, lp) == pytest.approx([10.0], abs=TOL)  # 0 from the clamped k3, 10 · ∇log π
    low_var = L.kl_penalty(lp, ref, "low_var_kl")
    assert _grad(low_var, lp) == pytest.approx([0.0], abs=TOL)


def test_k3plusplus_clamps_the_log_ratio_before_exp():
    # ref − lp = 800 overflows exp unclamped; clamped to 20, k3 = e^20 − 21 > 10 → 10
    out = L.kl_penalty(torch.tensor([-800.0], dtype=F64), torch.tensor([0.0], dtype=F64), "k3plusplus")
    assert out.item() == pytest.approx(10.0, abs=TOL)


def test_aliases_match_their_named_estimators():
    lp, ref = torch.tensor([-1.0, -0.5], dtype=F64), torch.tensor([-2.0, -0.1], dtype=F64)
    for alias, name in (("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl")):
        assert L.kl_penalty(lp, ref, alias).tolist() == L.kl_penalty(lp, ref, name).tolist()


# ----------------------------------------------------------------------------- top-k KL

Z = [2.0, 1.0, 0.0, -1.0, 0.5]  # policy logits over a 5-token vocabulary
R = [0.0, 1.5, -0.5, 0.3, 0.0]  # reference logits


def _topk_inputs(ids: list[list[int]]):
    """Two positions with the same logits; the policy's full logits are the leaf (gradients flow into
    the gathered logits and the log-sum-exp, as in the trainer)."""
    z = torch.tensor([Z, Z], dtype=F64, requires_grad=True)
    r = torch.tensor([R, R], dtype=F64)
    idx = torch.tensor(ids)
    return z, r, idx, z.gather(-1, idx), torch.logsumexp(z, -1), r.gather(-1, idx), torch.logsumexp(r, -1)


def test_reverse_head_over_the_whole_vocabulary_is_the_exact_kl():
    z, r, idx, zk, zl, rk, rl = _topk_inputs([[0, 1, 2, 3, 4], [4, 3, 2, 1, 0]])
    head, tail = L.topk_kl(zk, zl, rk, rl, direction="reverse")
    lp, lq = _log_softmax(Z), _log_softmax(R)
    p = [math.exp(v) for v in lp]
    kl = sum(pi * (a - b) for pi, a, b in zip(p, lp, lq))
    assert head.tolist() == pytest.approx([kl, kl], abs=TOL)
    assert tail.tolist() == [0.0, 0.0]
    # ∂KL(π‖q)/∂z_j = p_j (log p_j − log q_j − KL)
    expected = [pj * (a - b - kl) for pj, a, b in zip(p, lp, lq)]
    g = _grad(head, z)
    assert g[0] == pytest.approx(expected, abs=TOL) and g[1] == pytest.approx(expected, abs=TOL)


def test_forward_head_over_the_whole_vocabulary_is_the_exact_kl():
    z, r, idx, zk, zl, rk, rl = _topk_inputs([[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]])
    head, _ = L.topk_kl(zk, zl, rk, rl, direction="forward")
    lp, lq = _log_softmax(Z), _log_softmax(R)
    p, q = [math.exp(v) for v in lp], [math.exp(v) for v in lq]
    kl = sum(qi * (b - a) for qi, a, b in zip(q, lp, lq))
    assert head.tolist() == pytest.approx([kl, kl], abs=TOL)
    # ∂KL(q‖π)/∂z_j = p_j − q_j
    assert _grad(head, z)[0] == pytest.approx([pj - qj for pj, qj in zip(p, q)], abs=TOL)


def test_reverse_topk_head_and_tail_for_sampled_tokens_inside_and_outside():
    ids = [[0, 1], [0, 1]]  # the policy's top-2 (logits 2 and 1)
    sampled = [1, 3]  # position 0 samples inside I, position 1 outside
    z, r, idx, zk, zl, rk, rl = _topk_inputs(ids)
    y = torch.tensor(sampled)
    log_prob = z.gather(-1, y[:, None]).squeeze(-1) - zl
    ref_log_prob = r.gather(-1, y[:, None]).squeeze(-1) - rl
    head, tail = L.topk_kl(zk, zl, rk, rl, direction="reverse", topk_ids=idx, sampled_ids=y,
                           log_prob=log_prob, ref_log_prob=ref_log_prob)
    lp, lq = _log_softmax(Z), _log_softmax(R)
    p = [math.exp(v) for v in lp]
    d = [a - b for a, b in zip(lp, lq)]
    head_v = sum(p[i] * d[i] for i in (0, 1))
    assert head.tolist() == pytest.approx([head_v, head_v], abs=TOL)
    assert tail.tolist() == pytest.approx([0.0, d[3]], abs=TOL)
    # head: ∂/∂z_j = p_j([j∈I](d_j + 1) − S), S = Σ_{i∈I} p_i (d_i + 1)
    s = sum(p[i] * (d[i] + 1) for i in (0, 1))
    g_head = [p[j] * ((d[j] + 1 if j in (0, 1) else 0.0) - s) for j in range(5)]
    (g,) = torch.autograd.grad((head + tail).sum(), z)
    assert g[0].tolist() == pytest.approx(g_head, abs=TOL)  # y inside I: no tail gradient
    # tail (y = 3 outside I): sg(d_y) · ∇log π(y), ∂log π(y)/∂z_j = [j = y] − p_j
    g_tail = [d[3] * ((1.0 if j == 3 else 0.0) - p[j]) for j in range(5)]
    assert g[1].tolist() == pytest.approx([a + b for a, b in zip(g_head, g_tail)], abs=TOL)


def test_forward_topk_head_and_tail_for_sampled_tokens_inside_and_outside():
    ids = [[1, 3], [1, 3]]  # the reference's top-2 (logits 1.5 and 0.3)
    sampled = [3, 2]
    z, r, idx, zk, zl, rk, rl = _topk_inputs(ids)
    y = torch.tensor(sampled)
    log_prob = z.gather(-1, y[:, None]).squeeze(-1) - zl
    ref_log_prob = r.gather(-1, y[:, None]).squeeze(-1) - rl
    head, tail = L.topk_kl(zk, zl, rk, rl, direction="forward", topk_ids=idx, sampled_ids=y,
                           log_prob=log_prob, ref_log_prob=ref_log_prob)
    lp, lq = _log_softmax(Z), _log_softmax(R)
    p, q = [math.exp(v) for v in lp], [math.exp(v) for v in lq]
    head_v = sum(q[i] * (lq[i] - lp[i]) for i in (1, 3))
    w = q[2] / p[2]
    assert head.tolist() == pytest.approx([head_v, head_v], abs=TOL)
    assert tail.tolist() == pytest.approx([0.0, w * math.log(w)], abs=TOL)
    # head: ∂/∂z_j = −[j∈I] q_j + p_j Q_I; tail (k5): (1 − w) · ∇log π(y)
    q_i = q[1] + q[3]
    g_head = [-(q[j] if j in (1, 3) else 0.0) + p[j] * q_i for j in range(5)]
    g_tail = [(1.0 - w) * ((1.0 if j == 2 else 0.0) - p[j]) for j in range(5)]
    (g,) = torch.autograd.grad((head + tail).sum(), z)
    assert g[0].tolist() == pytest.approx(g_head, abs=TOL)
    assert g[1].tolist() == pytest.approx([a + b for a, b in zip(g_head, g_tail)], abs=TOL)


def test_topk_kl_rejects_bad_input():
    z, r, idx, zk, zl, rk, rl = _topk_inputs([[0, 1], [0, 1]])
    with pytest.raises(ValueError, match="direction"):
        L.topk_kl(zk, zl, rk, rl, direction="sideways")
    with pytest.raises(ValueError, match="same ids"):
        L.topk_kl(zk, zl, rk[..., :1], rl)
    with pytest.raises(ValueError, match="needs sampled_ids"):
        L.topk_kl(zk, zl, rk, rl, topk_ids=idx)


# ----------------------------------------------------------------------------- importance weight


def test_kl_importance_weight_is_detached_clamped_and_clipped():
    lp = _leaf([0.3, -0.7, 30.0])
    old = torch.tensor([0.0, 0.0, 0.0], dtype=F64)
    w = L.kl_importance_weight(lp, old)
    assert not w.requires_grad
    assert w.tolist() == pytest.approx([math.exp(0.3), math.exp(-0.7), math.exp(20.0)], rel=TOL)
    clipped = L.kl_importance_weight(lp, old, clip=(0.8, 1.2))
    assert clipped.tolist() == pytest.approx([1.2, 0.8, 1.2], abs=TOL)
    assert L.kl_importance_weight(lp, old, clip=(None, 1.2)).tolist() == pytest.approx(
        [1.2, math.exp(-0.7), 1.2], abs=TOL)
    with pytest.raises(ValueError, match="lo > hi"):
        L.kl_importance_weight(lp, old, clip=(2.0, 1.0))


# ----------------------------------------------------------------------------- EMA anchor


def _net(weight: float, running: float) -> nn.Module:
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    with torch.no_grad():
        for p in net.parameters():
            p.fill_(weight)
        net[1].running_mean.fill_(running)
        net[1].num_batches_tracked.fill_(7 if weight else 3)
    return net


def test_ema_update_averages_parameters_and_float_buffers():
    ref, pol = _net(1.0, 10.0), _net(3.0, 20.0)
    ema_update_(ref, pol, 0.9)
    for p in ref.parameters():
        assert torch.allclose(p, torch.full_like(p, 0.9 * 1.0 + 0.1 * 3.0))
    assert torch.allclose(ref[1].running_mean, torch.full((2,), 0.9 * 10.0 + 0.1 * 20.0))
    assert ref[1].num_batches_tracked.item() == 7  # integer buffers are left alone
    ema_update_(ref, pol, 0.9)  # twice: 0.81·1 + 0.19·3
    assert torch.allclose(ref[0].weight, torch.full((2, 2), 0.81 + 0.19 * 3.0))
    assert all(p.requires_grad for p in pol.parameters())


def test_ema_update_tau_one_is_off_and_zero_copies():
    ref, pol = _net(1.0, 10.0), _net(3.0, 20.0)
    ema_update_(ref, pol, 1.0)
    assert torch.equal(ref[0].weight, torch.ones(2, 2))
    ema_update_(ref, pol, 0.0)
    assert torch.equal(ref[0].weight, pol[0].weight.detach())


def test_ema_update_rejects_mismatched_models_and_bad_tau():
    with pytest.raises(ValueError, match="differ"):
        ema_update_(nn.Linear(2, 2), nn.Linear(2, 2, bias=False), 0.9)
    with pytest.raises(ValueError, match="shape"):
        ema_update_(nn.Linear(2, 2), nn.Linear(2, 3), 0.9)
    with pytest.raises(ValueError, match="tau"):
        ema_update_(nn.Linear(2, 2), nn.Linear(2, 2), 1.5)


# ----------------------------------------------------------------------------- settings


def test_ema_pg_settings_defaults_and_refusals():
    from pydantic import ValidationError

    from searchr1.learner.settings import LearnerSettings

    a = LearnerSettings().algorithm
    assert (a.ref_ema_tau, a.ref_ema_period, a.kl_topk_tokens, a.kl_tail_sampling, a.kl_importance_weight,
            a.kl_iw_clip, a.dynamic_sampling, a.overlong_filter) == (1.0, 10, 0, True, False, None, False, False)
    ok = LearnerSettings(algorithm={"ref_ema_tau": 0.9, "kl_loss_type": "full_reverse", "kl_topk_tokens": 32,
                                    "kl_importance_weight": True, "kl_iw_clip": [0.5, 2.0]}).algorithm
    assert ok.kl_iw_clip == (0.5, 2.0) and ok.kl_loss_type == "full_reverse"
    for kind in ("k1", "k2", "k3", "k3plusplus", "k4", "k5", "full_forward"):
        assert LearnerSettings(algorithm={"kl_loss_type": kind}).algorithm.kl_loss_type == kind
    with pytest.raises(ValidationError, match="full fine-tuning"):
        LearnerSettings(algorithm={"ref_ema_tau": 0.9}, model={"lora": {"enabled": True}})
    with pytest.raises(ValidationError, match="needs a KL term"):
        LearnerSettings(algorithm={"ref_ema_tau": 0.9, "use_kl_loss": False})
    with pytest.raises(ValidationError, match="kl_iw_clip"):
        LearnerSettings(algorithm={"kl_iw_clip": [2.0, 1.0]})
    with pytest.raises(ValidationError, match="full_reverse / full_forward only"):
        LearnerSettings(algorithm={"kl_topk_tokens": 32})
    with pytest.raises(ValidationError):
        LearnerSettings(algorithm={"ref_ema_tau": 0.0})
    with pytest.raises(ValidationError):
        LearnerSettings(algorithm={"ref_ema_period": 0})
    with pytest.raises(ValidationError, match="grpo / dr_grpo"):
        LearnerSettings(algorithm={"advantage": "gae", "use_kl_loss": False, "dynamic_sampling": True})


def test_ema_pg_config_maps_the_release_recipe():
    from pathlib import Path

    from searchr1.core.settings import load_settings
    from searchr1.learner.settings import LearnerSettings

    path = Path(__file__).resolve().parents[2] / "configs" / "qwen2.5-3b-grpo-ema-pg.toml"
    s = load_settings(LearnerSettings, path)
    a = s.algorithm
    assert (a.ref_ema_tau, a.ref_ema_period, a.kl_loss_type, a.kl_topk_tokens) == (0.9, 10, "full_reverse", 32)
    assert a.kl_importance_weight and a.kl_tail_sampling and a.clip_high == 0.28 and a.entropy_coef == 0.0
    assert (s.optim.lr, s.optim.total_steps, s.optim.betas, s.dispatcher.group_size) == (1e-6, 1005, (0.9, 0.95), 5)


# ----------------------------------------------------------------------------- KL term on a tiny model

VOCAB = 64


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from tests.support.synthetic import tiny_qwen2

    path = tiny_qwen2(tmp_path_factory.mktemp("kl") / "tiny", vocab=VOCAB, hidden=32, layers=1)
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).requires_grad_(False)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=p.dtype))
    ids = torch.randint(2, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    attn = torch.ones_like(ids)
    attn[1, 9:] = 0
    resp = torch.zeros(2, 11)
    resp[0, 4:] = 1
    resp[1, 5:8] = 1
    return policy, reference, ids, attn, resp


def _exact_kl(policy, reference, ids, attn, resp, direction):
    """Full-vocabulary KL per position from log_softmax of both models' full logits."""
    with torch.no_grad():
        lp = torch.log_softmax(policy(input_ids=ids, attention_mask=attn).logits[:, :-1], -1)
        lq = torch.log_softmax(reference(input_ids=ids, attention_mask=attn).logits[:, :-1], -1)
    kl = (lp.exp() * (lp - lq)).sum(-1) if direction == "reverse" else (lq.exp() * (lq - lp)).sum(-1)
    return kl * resp


def test_forward_kl_logits_agrees_with_forward_logprobs_and_the_full_logits(tiny_models):
    from searchr1.learner.train.model import forward_kl_logits, forward_logprobs

    policy, _, ids, attn, resp = tiny_models
    with torch.no_grad():
        ref_lp, ref_ent = forward_logprobs(policy, ids, attn, entropy=True, mask=resp)
        full = policy(input_ids=ids, attention_mask=attn).logits[:, :-1][resp.bool()]
        top = forward_kl_logits(policy, ids, attn, resp, entropy=True, topk=5)
        at = forward_kl_logits(policy, ids, attn, resp, at_ids=top.ids.flip(-1))
    # forward_logprobs computes in float32; forward_kl_logits keeps the model's float64
    assert torch.allclose(top.log_prob, ref_lp.double(), atol=1e-5)
    assert torch.allclose(top.entropy, ref_ent.double(), atol=1e-5)
    assert torch.equal(top.selected, resp.bool())
    assert torch.allclose(top.logits, full.topk(5, dim=-1).values, atol=TOL)
    assert torch.allclose(top.logsumexp, torch.logsumexp(full, -1), atol=TOL)
    assert torch.allclose(at.logits, top.logits.flip(-1), atol=TOL)
    with pytest.raises(ValueError, match="not both"):
        forward_kl_logits(policy, ids, attn, resp, topk=2, at_ids=top.ids)


@pytest.mark.parametrize("direction", ["reverse", "forward"])
def test_kl_term_over_the_whole_vocabulary_equals_the_exact_kl(tiny_models, direction):
    from searchr1.learner.settings import AlgorithmSettings
    from searchr1.learner.train.kl_term import KLTerm, MicroBatch

    policy, reference, ids, attn, resp = tiny_models
    exact = _exact_kl(policy, reference, ids, attn, resp, direction)
    for k in (0, VOCAB):  # the full logits, and the top-k path with k = vocabulary size (tail always 0)
        a = AlgorithmSettings(kl_loss_type=f"full_{direction}", kl_topk_tokens=k, kl_importance_weight=True)
        out = KLTerm(a, enabled=True).forward(policy, reference, MicroBatch(ids, attn, resp, entropy=False))
        assert torch.allclose(out.kl, exact, atol=TOL), k
        assert out.kl.requires_grad


def test_reverse_topk_ids_from_the_prepass_equal_those_of_the_update_forward(tiny_models):
    from searchr1.learner.settings import AlgorithmSettings
    from searchr1.learner.train.kl_term import KLTerm, MicroBatch

    policy, reference, ids, attn, resp = tiny_models
    term = KLTerm(AlgorithmSettings(kl_loss_type="full_reverse", kl_topk_tokens=4), enabled=True)
    assert term.prepass_topk == 4
    old, dense = term.prepass_policy(policy, ids, attn, resp)
    assert dense.shape == (2, 11, 4) and (dense[~resp.bool()] == 0).all()
    own = term.forward(policy, reference, MicroBatch(ids, attn, resp, entropy=False))
    given = term.forward(policy, reference, MicroBatch(ids, attn, resp, entropy=False, old_log_prob=old, topk_ids=dense))
    assert torch.allclose(own.kl, given.kl, atol=TOL)
    # the top-4 head is a partial sum of the exact KL's terms; with the tail it estimates the rest
    no_tail = KLTerm(AlgorithmSettings(kl_loss_type="full_reverse", kl_topk_tokens=4, kl_tail_sampling=False),
                     enabled=True).forward(policy, reference, MicroBatch(ids, attn, resp, entropy=False))
    assert not torch.allclose(no_tail.kl, own.kl)


def test_kl_term_sampled_estimator_with_importance_weight(tiny_models):
    from searchr1.learner.settings import AlgorithmSettings
    from searchr1.learner.train.kl_term import KLTerm, MicroBatch
    from searchr1.learner.train.model import forward_logprobs

    policy, reference, ids, attn, resp = tiny_models
    term = KLTerm(AlgorithmSettings(kl_loss_type="k4", kl_importance_weight=True, kl_iw_clip=(0.5, 1.5)),
                  enabled=True)
    with torch.no_grad():
        lp, _ = forward_logprobs(policy, ids, attn, mask=resp)
        lq, _ = forward_logprobs(reference, ids, attn, mask=resp)
    old = lp - 1.0 * resp  # π/π_old = e ≈ 2.72 on the response, clipped to 1.5
    out = term.forward(policy, reference, MicroBatch(ids, attn, resp, entropy=False, old_log_prob=old))
    expected = torch.where(resp.bool(), (lp - lq) * 1.5, torch.zeros_like(lp))
    assert torch.allclose(out.kl * resp, expected, atol=TOL)


def test_ema_due_every_period_steps():
    from searchr1.learner.algo.reference import ema_due

    assert [s for s in range(0, 31) if ema_due(s, 0.9, 10)] == [10, 20, 30]
    assert not any(ema_due(s, 1.0, 1) for s in range(5))
