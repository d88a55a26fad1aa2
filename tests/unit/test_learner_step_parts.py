"""The training step's parts: the KL shape chosen once from the settings, the typed pre-pass's slicing, and
a zero KL coefficient read as "no KL term" without rewriting the settings."""

from __future__ import annotations

import pytest
import torch

from searchr1.learner.settings import AlgorithmSettings, LearnerSettings
from searchr1.learner.train import kl_term
from searchr1.learner.train.build import build_training
from searchr1.learner.train.kl_term import KLTerm, kl_shape
from searchr1.learner.train.model import DistInfo
from searchr1.learner.train.prepass import PrePass
from tests.support.synthetic import tiny_qwen2


@pytest.mark.parametrize(("over", "enabled", "shape"), [
    ({}, False, kl_term._no_kl),
    ({"kl_loss_type": "low_var_kl"}, True, kl_term._sampled_kl),
    ({"kl_loss_type": "k4", "kl_importance_weight": True}, True, kl_term._sampled_kl),
    ({"kl_loss_type": "full_reverse", "kl_topk_tokens": 0}, True, kl_term._full_kl),
    ({"kl_loss_type": "full_forward", "kl_topk_tokens": 0}, True, kl_term._full_kl),
    ({"kl_loss_type": "full_reverse", "kl_topk_tokens": 8}, True, kl_term._topk_reverse_kl),
    ({"kl_loss_type": "full_forward", "kl_topk_tokens": 8}, True, kl_term._topk_forward_kl),
])
def test_one_kl_shape_is_chosen_at_start(over, enabled, shape):
    a = AlgorithmSettings(**over)
    assert kl_shape(a, enabled=enabled) is shape
    assert KLTerm(a, enabled=enabled).shape is shape


def test_prepass_rows_slice_every_tensor_and_keep_the_missing_ones_missing():
    old = torch.arange(12.0).reshape(3, 4)
    ids = torch.arange(24).reshape(3, 4, 2)
    pre = PrePass(old=old, topk_ids=ids)
    share = pre.rows([2, 0], 3)
    assert share.old.tolist() == [[8.0, 9.0, 10.0], [0.0, 1.0, 2.0]]
    assert share.topk_ids.shape == (2, 3, 2) and share.topk_ids[0, 0].tolist() == [16, 17]
    assert share.ref is None and share.values is None
    assert PrePass().rows([0], 3) == PrePass()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_qwen2(tmp_path_factory.mktemp("m") / "tiny", vocab=64, hidden=32, layers=1)


def test_a_zero_kl_coefficient_loads_no_reference_and_leaves_the_settings_as_given(model_path):
    s = LearnerSettings(model={"path": str(model_path)}, device="cpu",
                        algorithm={"use_kl_loss": True, "kl_loss_coef": 0.0})
    assert not s.algorithm.kl_loss_on
    trainer = build_training(s, DistInfo()).trainer
    assert trainer.reference is None and trainer.kl_term.shape is kl_term._no_kl
    assert trainer.s.algorithm.use_kl_loss and trainer.s is s  # derived, not rewritten
    on = LearnerSettings(model={"path": str(model_path)}, device="cpu", algorithm={"kl_loss_coef": 0.1})
    assert on.algorithm.kl_loss_on
