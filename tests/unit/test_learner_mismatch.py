"""Mismatch corrections beyond TIS (`learner/algo/mismatch.py`) on hand-checked numbers: sequence-level
masked IS, IcePop token masking, the step's mismatch figures, garbage in masked positions, and the
settings that choose them."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from searchr1.learner.algo.mismatch import (
    CORRECTIONS,
    CorrectionParams,
    MismatchSums,
    correction_weights,
    seq_log_ratio,
)
from searchr1.learner.settings import LearnerSettings

LN2 = math.log(2.0)


def test_sequence_log_ratio_is_the_mean_over_sampled_tokens():
    engine = torch.zeros(2, 4)
    learner = torch.tensor([[LN2, -LN2, 2 * LN2, 9.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0]])
    # row 0: (ln2 − ln2 + 2 ln2) / 3 = 2 ln2 / 3; row 1 has no token: 0
    assert seq_log_ratio(learner, engine, mask).tolist() == pytest.approx([2 * LN2 / 3, 0.0])


def test_seq_mask_rejects_whole_sequences_outside_the_band():
    engine = torch.zeros(3, 2)
    # geometric means: exp(0.005) kept; exp(0.5) rejected; exp(-0.5) rejected
    learner = torch.tensor([[0.01, 0.0], [0.5, 0.5], [-1.0, 0.0]])
    mask = torch.ones(3, 2)
    p = CorrectionParams(seq_band=(0.99, 1.02))
    w = correction_weights("seq_mask", learner, engine, mask, p)
    assert w.tolist() == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    # with a TIS cap the kept row gets its truncated ratios
    w = correction_weights("seq_mask", learner, engine, mask, CorrectionParams(tis_cap=1.005, seq_band=(0.99, 1.02)))
    assert w[0].tolist() == pytest.approx([1.005, 1.0])
    assert w[1:].abs().sum() == 0


def test_icepop_keeps_the_ratio_inside_the_band_and_zeroes_outside():
    engine = torch.zeros(1, 5)
    learner = torch.log(torch.tensor([[0.4, 0.51, 1.5, 4.9, 6.0]], dtype=torch.float64))
    mask = torch.ones(1, 5)
    w = correction_weights("icepop", learner, engine, mask, CorrectionParams(token_band=(0.5, 5.0)))
    assert w.tolist()[0] == pytest.approx([0.0, 0.51, 1.5, 4.9, 0.0], rel=1e-5)


def test_tis_without_a_cap_is_the_identity():
    learner, engine = torch.tensor([[3.0, -3.0]]), torch.zeros(1, 2)
    assert correction_weights("tis", learner, engine, torch.ones(1, 2), CorrectionParams()).tolist() == [[1.0, 1.0]]
    w = correction_weights("tis", learner, engine, torch.ones(1, 2), CorrectionParams(tis_cap=2.0))
    assert w.tolist()[0] == pytest.approx([2.0, math.exp(-3.0)], rel=1e-6)


@pytest.mark.parametrize("name", sorted(CORRECTIONS))
def test_garbage_in_masked_positions_changes_nothing(name):
    engine = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
    learner = torch.tensor([[-1.0, -1.01, -0.5, -1.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    p = CorrectionParams(tis_cap=2.0, seq_band=(0.5, 2.0), token_band=(0.5, 5.0))
    clean = correction_weights(name, learner, engine, mask, p)
    dirty_l, dirty_e = learner.clone(), engine.clone()
    dirty_l[0, 3], dirty_e[0, 3] = float("nan"), float("inf")
    dirty = correction_weights(name, dirty_l, dirty_e, mask, p)
    assert torch.equal(clean, dirty)
    assert dirty[0, 3] == 1.0
    s_clean, s_dirty = MismatchSums(), MismatchSums()
    s_clean.add(learner, engine, mask, clean)
    s_dirty.add(dirty_l, dirty_e, mask, dirty)
    assert s_clean == s_dirty


def test_unknown_correction_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown mismatch correction 'nope'"):
        correction_weights("nope", torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), CorrectionParams())


def test_step_figures_hand_checked():
    engine = torch.zeros(2, 3)
    learner = torch.tensor([[LN2, -LN2, 0.0], [2 * LN2, 0.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    weights = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 1.0]])  # row 1 zeroed on its two tokens
    s = MismatchSums()
    s.add(learner[:1], engine[:1], mask[:1], weights[:1])  # two micro-batches add up
    s.add(learner[1:], engine[1:], mask[1:], weights[1:])
    f = s.figures()
    # |Δ|: ln2, ln2, 0, 2 ln2, 0 over 5 tokens
    assert f["mismatch_abs_logp_mean"] == pytest.approx(4 * LN2 / 5)
    # sequence log-ratios: 0 and ln2 (= 2 ln2 / 2)
    assert f["mismatch_seq_log_ratio_mean"] == pytest.approx(LN2 / 2)
    assert f["mismatch_seq_log_ratio_abs_max"] == pytest.approx(LN2)
    # ratios 2, 0.5, 1, 4, 1: (Σr)² / (N Σr²) = 8.5² / (5 · 22.25)
    assert f["mismatch_ess"] == pytest.approx(8.5 ** 2 / (5 * 22.25))
    assert f["mismatch_masked_token_frac"] == pytest.approx(2 / 5)
    assert f["mismatch_masked_seq_frac"] == pytest.approx(1 / 2)
    assert MismatchSums().figures() == {}


def test_no_mismatch_gives_ess_one():
    s = MismatchSums()
    lp = torch.full((2, 4), -1.3)
    s.add(lp, lp, torch.ones(2, 4), torch.ones(2, 4))
    f = s.figures()
    assert f["mismatch_ess"] == pytest.approx(1.0)
    assert f["mismatch_abs_logp_mean"] == 0.0 and f["mismatch_masked_token_frac"] == 0.0


def test_settings_choose_and_validate():
    a = LearnerSettings().algorithm
    assert a.mismatch_correction == "tis" and a.tis_cap is None  # the default corrects nothing, as before
    a = LearnerSettings(algorithm={"mismatch_correction": "icepop", "icepop_band": (0.5, 2.0)}).algorithm
    assert a.icepop_band == (0.5, 2.0)
    with pytest.raises(ValidationError, match="0 < lo <= 1 <= hi"):
        LearnerSettings(algorithm={"seq_mask_band": (1.01, 1.02)})
    with pytest.raises(ValidationError):
        LearnerSettings(algorithm={"mismatch_correction": "bogus"})


def _trainer_step(model_path, shift: float, **algorithm):
    import random

    from searchr1.learner.algo.batch import build_batch
    from searchr1.learner.train.build import build_training
    from searchr1.learner.train.model import DistInfo
    from tests.support.synthetic import synthetic_group

    torch.manual_seed(0)
    s = LearnerSettings(model={"path": str(model_path)}, device="cpu",
                        algorithm={"advantage": "grpo", "use_kl_loss": False, "entropy_coef": 0.0, **algorithm},
                        optim={"lr": 1e-3, "weight_decay": 0.0}, batch={"micro_batch_size": 16})
    training = build_training(s, DistInfo())
    batch = build_batch([synthetic_group("g", group_size=4, vocab=128, rng=random.Random(1), rewards=[1, 0, 1, 0])])
    batch = batch.with_(behavior_logprobs=batch.behavior_logprobs + shift * batch.loss_mask)
    before = [p.detach().clone() for p in training.trainer.policy.parameters()]
    figures = training.trainer.train_step(batch, version=0)
    moved = any(not torch.equal(a, b.detach()) for a, b in zip(before, training.trainer.policy.parameters()))
    return figures, moved


@pytest.mark.parametrize("correction", ["seq_mask", "icepop"])
def test_trainer_masks_a_step_whose_every_ratio_is_out_of_band(tmp_path, correction):
    """Behaviour log-probs shifted 5 nats down (the synthetic ones are not the model's own, so the ratios
    are about e^5 ≈ 148, none below e^4): both maskings
    reject every token, so the policy gradient is zero and the figures say so; `tis` trains."""
    from tests.support.synthetic import tiny_qwen2

    model = tiny_qwen2(tmp_path / "m", vocab=128, hidden=64)
    figures, moved = _trainer_step(model, -5.0, mismatch_correction=correction)
    assert figures["mismatch_masked_token_frac"] == 1.0 and figures["mismatch_masked_seq_frac"] == 1.0
    assert figures["mismatch_seq_log_ratio_mean"] > 4.0 and figures["mismatch_abs_logp_mean"] > 4.0
    assert figures["mismatch_ess"] < 1.0
    assert figures["pg_loss"] == 0.0 and not moved
    figures, moved = _trainer_step(model, -5.0, mismatch_correction="tis", tis_cap=2.0)
    assert figures["mismatch_masked_token_frac"] == 0.0 and moved
