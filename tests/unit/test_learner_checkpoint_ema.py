"""The trainer with EMA-PG's KL: a top-k reverse KL step on a tiny Qwen2 (k = vocabulary size gives the
full-vocabulary KL), the EMA update of the reference after the optimizer step, and resuming it from a
checkpoint (save, build a fresh learner, load: the same reference weights, the same next step)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from searchr1.learner.algo.batch import build_batch
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.train.build import build_training
from searchr1.learner.train.checkpoint import Checkpointer, TrainState
from searchr1.learner.train.model import DistInfo
from tests.support.synthetic import synthetic_group, tiny_qwen2

torch.set_num_threads(1)
VOCAB = 128


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_qwen2(tmp_path_factory.mktemp("m") / "tiny", vocab=VOCAB, hidden=64)


def _settings(model_path, **algorithm) -> LearnerSettings:
    return LearnerSettings(
        model={"path": str(model_path)}, device="cpu",
        algorithm={"advantage": "grpo", "use_kl_loss": True, "kl_loss_coef": 0.1, "entropy_coef": 0.0,
                   **algorithm},
        optim={"lr": 1e-2, "weight_decay": 0.0}, batch={"micro_batch_size": 4})


def _batch(version=0):
    rng = random.Random(3)
    return build_batch([synthetic_group(f"g{i}", group_size=4, vocab=VOCAB, rng=rng, policy_version=version)
                        for i in range(2)])


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _exact_reverse_kl(policy, reference, batch) -> float:
    """Token-mean over the loss mask of the full-vocabulary KL(π‖π_ref), from both models' full logits."""
    with torch.no_grad():
        lp = torch.log_softmax(policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1], -1)
        lq = torch.log_softmax(reference(input_ids=batch.input_ids,
                                         attention_mask=batch.attention_mask).logits[:, :-1], -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    return float((kl * batch.loss_mask).sum() / batch.loss_mask.sum())


def test_topk_reverse_kl_step_runs_and_k_equal_vocab_is_the_full_kl(model_path):
    batch = _batch()
    kls = {}
    for k in (4, VOCAB, 0):
        t = build_training(_settings(model_path, kl_loss_type="full_reverse", kl_topk_tokens=k,
                                     kl_importance_weight=True), DistInfo())
        first = t.trainer.train_step(batch, version=0)
        assert first["kl_loss"] == pytest.approx(0.0, abs=1e-6)  # the reference is the initial policy
        exact = _exact_reverse_kl(t.trainer.policy, t.trainer.reference, batch)
        kls[k] = t.trainer.train_step(batch, version=1)["kl_loss"]
        if k != 4:
            assert kls[k] == pytest.approx(exact, rel=1e-4, abs=1e-7)
    # top 4 + the sampled tail is an estimate (a partial head sum and k4 terms can be negative)
    assert kls[VOCAB] > 0 and math.isfinite(kls[4]) and kls[4] != pytest.approx(kls[VOCAB], rel=1e-3)
    assert kls[VOCAB] == pytest.approx(kls[0], rel=1e-4)


def test_two_mini_batches_take_the_reverse_topk_from_the_prepass(model_path):
    s = _settings(model_path, kl_loss_type="full_reverse", kl_topk_tokens=VOCAB, kl_importance_weight=True)
    s = s.model_copy(update={"batch": s.batch.model_copy(update={"mini_batches": 2})})
    t = build_training(s, DistInfo())
    t.trainer.train_step(_batch(), version=0)
    out = t.trainer.train_step(_batch(), version=1)
    assert out["kl_loss"] > 0 and torch.isfinite(torch.tensor(out["loss"]))


def test_ema_reference_update_and_resume(model_path, tmp_path):
    s = _settings(model_path, kl_loss_type="full_reverse", kl_topk_tokens=8, ref_ema_tau=0.75,
                  ref_ema_period=2)
    a = build_training(s, DistInfo())
    names = [c.name for c in a.components]
    assert names == ["policy", "reference"]
    ref0 = _params(a.trainer.reference)
    a.trainer.train_step(_batch(), version=0)
    assert all(torch.equal(v, ref0[k]) for k, v in _params(a.trainer.reference).items())  # step 1: not due
    a.trainer.train_step(_batch(1), version=1)
    pol2, ref2 = _params(a.trainer.policy), _params(a.trainer.reference)
    for k, v in ref2.items():  # step 2: θ_ref ← 0.75·θ_ref + 0.25·θ
        if v.is_floating_point():
            assert torch.allclose(v, 0.75 * ref0[k] + 0.25 * pol2[k], atol=1e-6), k
    assert any(not torch.equal(ref2[k], ref0[k]) for k in ref2)

    ck = Checkpointer(tmp_path / "ck", keep=1)
    ck.save(TrainState(step=2, version=2), a.components)
    b = build_training(s, DistInfo())  # a fresh learner: its reference is the initial weights
    assert ck.load(b.components).step == 2
    assert all(torch.equal(v, ref2[k]) for k, v in _params(b.trainer.reference).items())
    sa = a.trainer.train_step(_batch(2), version=2)
    sb = b.trainer.train_step(_batch(2), version=2)
    assert sa["kl_loss"] > 0 and sa["kl_loss"] == pytest.approx(sb["kl_loss"], rel=1e-6)
    a.trainer.train_step(_batch(3), version=3)  # step 4: both update their reference again
    b.trainer.train_step(_batch(3), version=3)
    ra, rb = _params(a.trainer.reference), _params(b.trainer.reference)
    assert all(torch.allclose(ra[k], rb[k], atol=1e-6) for k in ra)
    assert any(not torch.allclose(ra[k], ref2[k]) for k in ra)
