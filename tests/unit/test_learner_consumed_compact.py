"""The task ids a checkpoint holds stay compact: 850,000 ids (three epochs of a 283k-question dataset)
make a `state.json` of a few MB, not the ~18 MB of a JSON list, and an older checkpoint's list still
loads."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from searchr1.learner.algo import consumed
from searchr1.learner.train.checkpoint import Checkpointer, Component, TrainState
from searchr1.learner.train.durable import seal

IDS = {f"nq_train_{i}@e{e}" for e in range(3) for i in range(283_334)}


def _component() -> Component:
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Component("policy", model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))


def test_850k_task_ids_make_a_state_json_of_a_few_mb_and_load_back(tmp_path):
    assert len(json.dumps(sorted(IDS))) > 18_000_000  # the list the checkpoint would otherwise hold
    ck = Checkpointer(tmp_path, keep=1)
    path = ck.save(TrainState(step=1, version=1, consumed=IDS), [_component()])
    assert (path / "state.json").stat().st_size < 3_000_000
    assert ck.load([_component()]).consumed == IDS


def test_an_older_checkpoints_list_of_task_ids_still_loads(tmp_path):
    ck = Checkpointer(tmp_path, keep=1)
    path = ck.save(TrainState(step=1, version=1, consumed={"a", "b"}), [_component()])
    meta = json.loads((path / "state.json").read_text())
    for k in ("consumed_z", "consumed_count"):
        del meta[k]
    (path / "state.json").write_text(json.dumps({**meta, "consumed": ["a", "b"]}))
    resealed = path.with_name(".reseal")
    path.rename(resealed)
    (resealed / "manifest.json").unlink()
    seal(resealed, path)  # its manifest written again over the edited state.json
    assert ck.load([_component()]).consumed == {"a", "b"}


def test_the_encoding_round_trips_and_checks_its_count():
    assert consumed.decode(consumed.encode(set())) == set()
    fields = consumed.encode({"x@e0", "y@e1"})
    assert consumed.decode(fields) == {"x@e0", "y@e1"}
    with pytest.raises(ValueError):
        consumed.decode({**fields, "consumed_count": 3})
    with pytest.raises(ValueError):
        consumed.encode({"bad\nid"})
