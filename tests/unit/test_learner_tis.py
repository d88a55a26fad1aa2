"""Truncated importance sampling against the train–inference mismatch (`learner/algo/tis.py`), on hand-checked
numbers, and its hook in the trainer (`algorithm.tis_cap`)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from searchr1.learner.algo.tis import apply_tis, mismatch_figures, tis_weights

LN2, LN3 = math.log(2.0), math.log(3.0)


def test_weights_are_the_capped_ratio_on_the_mask():
    learner = torch.tensor([[-1.0, -2.0, -0.5 + LN3, -9.0]])
    engine = torch.tensor([[-1.0, -1.0, -0.5, -1.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    w = tis_weights(learner, engine, mask, cap=2.0)
    # ratios 1, e^-1, 3 (capped to 2); masked-out position: 1
    assert w.tolist()[0] == pytest.approx([1.0, math.exp(-1.0), 2.0, 1.0], rel=1e-6)
    assert not w.requires_grad
    with pytest.raises(ValueError, match=">= 1"):
        tis_weights(learner, engine, mask, cap=0.5)


def test_apply_leaves_stale_rows_and_broadcasts_sequence_advantages():
    learner = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    engine = torch.tensor([[-1.0 - LN2, -1.0 + LN2], [-5.0, -5.0]])
    mask = torch.ones(2, 2)
    adv = torch.tensor([1.5, -1.0])
    weights = torch.ones(2, 2)
    out, w = apply_tis(adv, weights, learner, engine, mask, cap=4.0, rows=torch.tensor([True, False]))
    # row 0: ratios 2 and 1/2; row 1 is not on-policy: untouched
    assert w.flatten().tolist() == pytest.approx([2.0, 0.5, 1.0, 1.0])
    assert out.flatten().tolist() == pytest.approx([3.0, 0.75, -1.0, -1.0])


def test_mismatch_figures_hand_checked():
    engine = torch.zeros(1, 5)
    learner = torch.tensor([[0.0, LN2, -LN2, 2 * LN2, 7.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    f = mismatch_figures(learner, engine, mask, cap=2.5)
    assert f.tokens == 4
    assert f.mean_abs_diff == pytest.approx(LN2)  # (0 + ln2 + ln2 + 2 ln2) / 4
    assert f.max_abs_diff == pytest.approx(2 * LN2)
    assert (f.ratio_min, f.ratio_max) == pytest.approx((0.5, 4.0))
    assert f.ratio_p50 == pytest.approx(1.5)  # ratios 0.5, 1, 2, 4: median between 1 and 2
    assert f.frac_capped == pytest.approx(0.25)  # only 4 > 2.5
    with pytest.raises(ValueError):
        mismatch_figures(learner, engine, torch.zeros(1, 5))


def _step(model_path, tis_cap, behaviour_shift):
    from searchr1.learner.algo.batch import build_batch
    from searchr1.learner.settings import LearnerSettings
    from searchr1.learner.train.build import build_training
    from searchr1.learner.train.model import DistInfo
    from tests.support.synthetic import synthetic_group

    torch.manual_seed(0)
    s = LearnerSettings(model={"path": str(model_path)}, device="cpu",
                        algorithm={"advantage": "grpo", "use_kl_loss": False, "entropy_coef": 0.0,
                                   "tis_cap": tis_cap},
                        optim={"lr": 1e-3, "weight_decay": 0.0}, batch={"micro_batch_size": 16})
    training = build_training(s, DistInfo())
    batch = build_batch([synthetic_group("g", group_size=4, vocab=128, rng=random.Random(1), rewards=[1, 0, 1, 0])])
    # behaviour log-probs far below the learner's: every ratio is above any cap, so TIS weighs every token by it
    batch = batch.with_(behavior_logprobs=batch.behavior_logprobs + behaviour_shift * batch.loss_mask)
    return training.trainer.train_step(batch, version=0)


def test_trainer_hook_weighs_on_policy_tokens(tmp_path):
    from tests.support.synthetic import tiny_qwen2

    model = tiny_qwen2(tmp_path / "m", vocab=128, hidden=64)
    off = _step(model, None, -50.0)
    on = _step(model, 3.0, -50.0)
    assert off["is_weight_mean"] == pytest.approx(1.0)
    assert on["is_weight_mean"] == pytest.approx(3.0)
    # the weight is a constant 3 on every token: the policy-gradient loss is three times as large
    assert on["pg_loss"] == pytest.approx(3 * off["pg_loss"], rel=1e-4)
