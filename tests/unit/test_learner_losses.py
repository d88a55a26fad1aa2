"""Hand-checked numbers for the learner's pure math (searchr1.learner.algo.losses)."""

from __future__ import annotations

import math

import pytest
import torch

from searchr1.learner.algo import losses as L

torch.set_num_threads(1)


def test_grpo_one_right_four_wrong():
    adv = L.grpo_advantages(torch.tensor([1.0, 0, 0, 0, 0]), ["a"] * 5)
    # mean 0.2, unbiased std sqrt(0.8/4)=0.4472 → 0.8/0.4472 = 1.789, -0.2/0.4472 = -0.447
    assert adv[0].item() == pytest.approx(1.789, abs=1e-3)
    assert adv[1:].tolist() == pytest.approx([-0.447] * 4, abs=1e-3)


def test_grpo_groups_are_independent_and_zero_mean():
    scores = torch.tensor([1.0, 0.0, 3.0, 5.0, 7.0, 2.0])
    ids = [0, 0, 1, 1, 1, 2]
    adv = L.grpo_advantages(scores, torch.tensor(ids))
    assert adv[:2].sum().item() == pytest.approx(0, abs=1e-6)
    assert adv[2:5].sum().item() == pytest.approx(0, abs=1e-6)
    # group 1: mean 5, std 2 → [-1, 0, 1]
    assert adv[2:5].tolist() == pytest.approx([-1, 0, 1], abs=1e-5)
    # singleton: mean 0, std 1 → its raw score (over 1 + eps)
    assert adv[5].item() == pytest.approx(2.0, abs=1e-5)


def test_grpo_equal_scores_give_zero_and_dr_grpo_does_not_scale():
    assert L.grpo_advantages(torch.tensor([1.0, 1.0, 1.0]), [0, 0, 0]).tolist() == [0.0, 0.0, 0.0]
    adv = L.grpo_advantages(torch.tensor([1.0, 0, 0, 0, 0]), [0] * 5, scale_by_std=False)
    assert adv.tolist() == pytest.approx([0.8, -0.2, -0.2, -0.2, -0.2])


def test_grpo_rejects_length_mismatch():
    with pytest.raises(ValueError):
        L.grpo_advantages(torch.tensor([1.0, 2.0]), [0])


def test_ppo_clip_loss_hand_checked():
    lp = torch.tensor([[math.log(1.5), math.log(0.5), 0.0]])
    old = torch.zeros(1, 3)
    adv = torch.tensor([1.0])
    mask = torch.tensor([[1, 1, 0]])
    out = L.ppo_clip_loss(lp, old, adv, mask, clip_low=0.2)
    # token 0: ratio 1.5 → max(-1.5, -1.2) = -1.2 (clipped larger); token 1: ratio .5 → max(-.5, -.8) = -.5
    assert out.loss.item() == pytest.approx((-1.2 - 0.5) / 2, abs=1e-6)
    assert out.clip_frac.item() == pytest.approx(0.5)
    assert out.approx_kl.item() == pytest.approx(-(math.log(1.5) + math.log(0.5)) / 2, abs=1e-6)


def test_ppo_clip_higher_and_negative_advantage():
    lp = torch.tensor([[math.log(1.5)], [math.log(0.5)]])
    old = torch.zeros(2, 1)
    mask = torch.ones(2, 1)
    # clip-higher 0.28: ratio 1.5 with A=+1 → -1.28
    out = L.ppo_clip_loss(lp[:1], old[:1], torch.tensor([1.0]), mask[:1], 0.2, 0.28)
    assert out.loss.item() == pytest.approx(-1.28)
    # A=-1, ratio 0.5: max(0.5, 0.8) = 0.8 (clipped at 1-0.2)
    out = L.ppo_clip_loss(lp[1:], old[1:], torch.tensor([-1.0]), mask[1:], 0.2)
    assert out.loss.item() == pytest.approx(0.8)
    assert out.clip_frac.item() == 1.0


def test_ppo_gradient_is_minus_advantage_on_policy():
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    out = L.ppo_clip_loss(lp, lp.detach(), torch.tensor([2.0]), torch.ones(1, 2), 0.2)
    out.loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-1.0, -1.0])  # -A / n_tokens per token


def test_aggregations():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert L.aggregate(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert L.aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert L.aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    with pytest.raises(ValueError):
        L.aggregate(loss, mask, "nope")


@pytest.mark.parametrize("agg", sorted(L.AGGREGATIONS))
def test_garbage_in_masked_positions_changes_nothing(agg):
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(3, 5, generator=g)
    old = -torch.rand(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    adv = torch.randn(3, 5, generator=g)
    base = L.ppo_clip_loss(lp, old, adv, mask, 0.2, agg=agg)
    junk = torch.where(mask.bool(), 0.0, torch.tensor(float("nan")))
    bad = L.ppo_clip_loss(lp + junk, old - 1e9 * (1 - mask), adv + junk, mask, 0.2, agg=agg)
    assert bad.loss.item() == pytest.approx(base.loss.item())
    assert bad.clip_frac.item() == pytest.approx(base.clip_frac.item())
    assert bad.approx_kl.item() == pytest.approx(base.approx_kl.item())
    v = L.value_loss(lp, old, adv, mask, 0.5, agg=agg)
    vb = L.value_loss(lp + junk, old + junk, adv + junk, mask, 0.5, agg=agg)
    assert vb.loss.item() == pytest.approx(v.loss.item())


def test_kl_estimators_hand_checked():
    lp, ref = torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0])
    assert L.kl_penalty(lp, ref, "kl").tolist() == pytest.approx([1.0, -2.0])
    assert L.kl_penalty(lp, ref, "abs").tolist() == pytest.approx([1.0, 2.0])
    assert L.kl_penalty(lp, ref, "mse").tolist() == pytest.approx([0.5, 2.0])
    # k3: kl = ref - lp = [-1, 2] → exp(-1)+1-1 = 0.3679; exp(2)-2-1 = 4.389
    assert L.kl_penalty(lp, ref, "low_var_kl").tolist() == pytest.approx([math.exp(-1), math.exp(2) - 3], abs=1e-5)
    assert L.kl_penalty(torch.tensor([-20.0]), torch.tensor([0.0]), "low_var_kl").item() == 10.0
    assert L.kl_penalty(lp, lp, "low_var_kl").tolist() == [0.0, 0.0]
    with pytest.raises(ValueError):
        L.kl_penalty(lp, ref, "full")


def test_gae_hand_checked_gamma_one_lambda_one():
    # rewards only at the last token, values [.5, .2, .1]; with γ=λ=1 the raw advantage is R - V_t
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    v = torch.tensor([[0.5, 0.2, 0.1, 99.0]])  # position 3 is masked garbage
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, ret = L.gae_advantages(r, v, mask, gamma=1.0, lam=1.0)
    assert ret[0, :3].tolist() == pytest.approx([1.0, 1.0, 1.0])
    raw = torch.tensor([0.5, 0.8, 0.9])
    whitened = (raw - raw.mean()) / torch.sqrt(raw.var(unbiased=True) + 1e-8)
    assert adv[0, :3].tolist() == pytest.approx(whitened.tolist(), abs=1e-5)
    assert adv[0, 3].item() == 0.0 and ret[0, 3].item() == 0.0


def test_gae_discounting():
    # γ=0.5, λ=0.5, one row, zero values: A_t = r_t + 0.25 A_{t+1}
    r = torch.tensor([[1.0, 2.0]])
    _adv, ret = L.gae_advantages(r, torch.zeros(1, 2), torch.ones(1, 2), gamma=0.5, lam=0.5)
    assert ret[0].tolist() == pytest.approx([1.5, 2.0])


def test_value_loss_clipped():
    v = torch.tensor([[1.0, 0.0]])
    old = torch.tensor([[0.0, 0.0]])
    ret = torch.tensor([[0.0, 1.0]])
    out = L.value_loss(v, ret, old, torch.ones(1, 2), clip_range=0.5)
    # token 0: max((1-0)², (0.5-0)²) = 1; token 1: max(1, 1) = 1 → ½·mean = 0.5
    assert out.loss.item() == pytest.approx(0.5)
    assert out.clip_frac.item() == 0.0
    out = L.value_loss(torch.tensor([[1.0]]), torch.tensor([[2.0]]), torch.tensor([[0.0]]), torch.ones(1, 1), 0.5)
    assert out.loss.item() == pytest.approx(0.5 * 2.25) and out.clip_frac.item() == 1.0


def test_entropy_uniform_and_onehot():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]])
    ent = L.entropy_from_logits(logits)
    assert ent[0, 0].item() == pytest.approx(math.log(4))
    assert ent[0, 1].item() == pytest.approx(0.0, abs=1e-6)


def test_truncated_importance_weights():
    prox = torch.tensor([[0.0, -1.0, 0.0]])
    beh = torch.tensor([[-1.0, 0.0, -50.0]])
    w = L.truncated_importance_weights(prox, beh, torch.tensor([[1, 1, 0]]), cap=2.0)
    assert w[0].tolist() == pytest.approx([2.0, math.exp(-1), 1.0])


def test_masked_whiten_unbiased():
    x = torch.tensor([1.0, 2.0, 3.0, 1000.0])
    m = torch.tensor([1, 1, 1, 0])
    w = L.masked_whiten(x, m)
    assert w.tolist() == pytest.approx([-1.0, 0.0, 1.0, 0.0], abs=1e-6)
