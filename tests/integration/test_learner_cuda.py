"""The learner on a CUDA device in the recipe's dtype (`model.dtype = "bfloat16"`, one rank: FSDP2 over a
mesh of one with the mixed-precision policy, NCCL): fp32 masters that every step moves at lr 1e-6, bf16
published values, a checkpoint that restores the masters bit for bit, and a frozen bf16 reference that
starts at KL 0 from the policy. Skipped where torch sees no CUDA device (these machines run it when one is
lent: see docs/learner.md, "Precision")."""

from __future__ import annotations

import pytest
import torch

from tests.support.recipe_numerics import LR, STEPS, masters, recipe_settings, train_recipe
from tests.support.synthetic import qwen2_layer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return qwen2_layer(tmp_path_factory.mktemp("cuda") / "m")


def test_bf16_compute_moves_fp32_masters_on_cuda(model):
    run = train_recipe(model, "bfloat16", device="cuda")
    assert run.stored == torch.float32
    assert run.share_changed() > 0.99
    assert LR <= run.rms() <= STEPS * LR * 1.01
    assert all(0.0 < s < 0.5 for s in run.published_shares), run.published_shares


def test_a_checkpoint_restores_the_masters_on_cuda(model, tmp_path):
    from searchr1.learner.algo.batch import build_batch
    from searchr1.learner.train.build import build_training
    from searchr1.learner.train.checkpoint import Checkpointer, TrainState
    from searchr1.learner.train.model import DistInfo
    from tests.support.synthetic import synthetic_group

    settings = recipe_settings(model, "bfloat16", "cuda")
    first = build_training(settings, DistInfo())
    first.trainer.train_step(build_batch([synthetic_group("g", group_size=4, vocab=2048, rewards=[1, 0, 1, 0])]), 0)
    Checkpointer(tmp_path, keep=1).save(TrainState(step=1, version=1), first.components)
    second = build_training(settings, DistInfo())
    Checkpointer(tmp_path, keep=1).load(second.components)
    a, b = masters(first.trainer.policy), masters(second.trainer.policy)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(v.dtype == torch.float32 for v in b.values())


def test_the_frozen_reference_starts_at_kl_zero(model):
    from searchr1.learner.train.build import build_training
    from searchr1.learner.train.model import DistInfo, forward_logprobs

    training = build_training(recipe_settings(model, "bfloat16", "cuda"), DistInfo())
    ref = training.trainer.reference
    assert next(ref.parameters()).dtype == torch.bfloat16
    ids = torch.randint(2, 2048, (2, 32), device="cuda")
    attn = torch.ones_like(ids)
    with torch.no_grad():
        lp, _ = forward_logprobs(training.trainer.policy, ids, attn)
        lr_, _ = forward_logprobs(ref, ids, attn)
    assert float((lp - lr_).abs().max()) < 0.05
