"""Checkpoint metadata that is missing or corrupt is named and skipped, never trusted or fatal: a step
directory without a manifest is skipped for the newest one that verifies; an empty or corrupt
`fences.json` is logged with its path, read as no takeovers, and moved aside by the next takeover; a start
removes the temporary directories that older saves left behind; the highest token on disk is found
wherever it is recorded."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from searchr1.learner.train.checkpoint import Checkpointer, Component, TrainState
from searchr1.learner.train.fences import FENCES, highest_token, read_takeovers, record_takeover

torch.set_num_threads(1)


def _policy(seed: int) -> Component:
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return Component("policy", model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))


def _save(root: Path, step: int, seed: int) -> Path:
    return Checkpointer(root, keep=3).save(TrainState(step=step, version=step), [_policy(seed)])


def test_a_checkpoint_without_a_manifest_is_named_and_skipped(tmp_path, caplog):
    _save(tmp_path, 1, 0)
    newest = _save(tmp_path, 2, 1)
    (newest / "manifest.json").unlink()
    with caplog.at_level(logging.WARNING, logger="searchr1.learner"):
        assert Checkpointer(tmp_path, keep=3).latest() == tmp_path / "step00000001"
    assert f"skipping checkpoint {newest}: no manifest.json: its files cannot be verified" in caplog.text


@pytest.mark.parametrize("content", ["", "   \n", "{not json", "[1, 2]", '{"3": "two"}', "\udcff"])
def test_an_empty_or_corrupt_fences_json_is_named_and_read_as_no_takeovers(tmp_path, caplog, content):
    record = tmp_path / FENCES
    if content == "\udcff":
        record.write_bytes(b"\xff\xfe")  # not UTF-8
    else:
        record.write_text(content)
    _save(tmp_path, 1, 0)
    with caplog.at_level(logging.ERROR, logger="searchr1.learner"):
        assert read_takeovers(tmp_path) == {}
        assert Checkpointer(tmp_path, keep=3).load([_policy(2)]).step == 1  # a start goes on
    assert f"ignoring the record of takeovers: {record} is " in caplog.text


def test_the_next_takeover_moves_a_corrupt_record_aside(tmp_path, caplog):
    (tmp_path / FENCES).write_text("")
    with caplog.at_level(logging.ERROR, logger="searchr1.learner"):
        record_takeover(tmp_path, 7, 3)
    assert read_takeovers(tmp_path) == {7: 3}
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(f"{FENCES}.corrupt-")]
    assert len(aside) == 1 and aside[0].read_text() == ""
    assert f"{tmp_path / FENCES} is empty; moved aside to {aside[0]}" in caplog.text


class _Lease:
    """The part of a lease a checkpointer reads (a token, checked valid)."""

    def __init__(self, token: int) -> None:
        self.token, self.lost = token, None

    def check(self) -> None:
        pass


def test_a_start_removes_what_saves_of_its_token_or_older_left_and_keeps_newer_ones(tmp_path):
    _save(tmp_path, 1, 0)
    for name in (".tmp-t2-step00000002", ".tmp-t3-step00000002", ".tmp-t5-step00000002", ".tmp-step00000002"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "policy.safetensors").write_bytes(b"partial")
    Checkpointer(tmp_path, keep=3, lease=_Lease(3)).latest()  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-t5-step00000002", "step00000001"]


def test_the_highest_token_on_disk_is_found_in_the_record_and_in_the_checkpoints(tmp_path):
    assert highest_token(tmp_path / "missing") == 0
    _save(tmp_path, 1, 0)
    assert highest_token(tmp_path) == 0  # written without a lease
    record_takeover(tmp_path, 4, 1)
    assert highest_token(tmp_path) == 4
    step = tmp_path / "step00000002"
    step.mkdir()
    (step / "state.json").write_text(json.dumps({"fence": 9}))
    assert highest_token(tmp_path) == 9
    (tmp_path / "step00000003").mkdir()  # unreadable: never loaded, not counted
    (tmp_path / FENCES).write_text("{")
    assert highest_token(tmp_path) == 9
