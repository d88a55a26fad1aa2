"""Checkpoints with a weights-only component (the EMA reference): saved, restored, and tolerated when
an older checkpoint lacks it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from searchr1.learner.algo.reference import ema_update_
from searchr1.learner.train.checkpoint import Checkpointer, Component, TrainState

torch.set_num_threads(1)


def _policy(seed: int) -> Component:
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return Component("policy", model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))


def _reference(seed: int) -> Component:
    torch.manual_seed(seed)
    return Component("reference", nn.Linear(3, 2).requires_grad_(False))


def test_reference_weights_round_trip(tmp_path):
    pol, ref = _policy(0), _reference(1)
    ema_update_(ref.model, pol.model, 0.9)
    ck = Checkpointer(tmp_path, keep=2)
    path = ck.save(TrainState(step=3, version=3), [pol, ref])
    assert (path / "reference.safetensors").is_file() and not (path / "reference.optimizer.safetensors").exists()

    pol2, ref2 = _policy(5), _reference(6)
    state = ck.load([pol2, ref2])
    assert state.step == 3
    for a, b in ((pol, pol2), (ref, ref2)):
        for (k, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
            assert torch.equal(x, y), k


def test_missing_reference_keeps_its_weights_and_missing_policy_fails(tmp_path):
    ck = Checkpointer(tmp_path, keep=2)
    ck.save(TrainState(step=1, version=1), [_policy(0)])
    ref = _reference(7)
    before = ref.model.weight.clone()
    ck.load([_policy(1), ref])
    assert torch.equal(ref.model.weight, before)
    ck.save(TrainState(step=2, version=2), [_reference(0)])
    with pytest.raises(ValueError, match="no component 'policy'"):
        ck.load([_policy(1)])
