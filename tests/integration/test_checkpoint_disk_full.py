"""A checkpoint save that fails for lack of room removes its partial copy at once, on a real full
filesystem: a tmpfs mounted small enough for two checkpoints (needs root; skipped otherwise). A brief
disk-full — a filler file taking the room during one save — costs that save only: the next one, once the
room is back, succeeds. With the failed save's partial copy left in place (the baseline: a save that
leaves its partial copy until a later save succeeds), the same next save fails too, and so would every
one after it."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

from searchr1.learner.train.checkpoint import Checkpointer, Component, TrainState

torch.set_num_threads(1)


def _policy() -> Component:
    torch.manual_seed(0)
    model = nn.Linear(256, 256)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    opt.zero_grad()
    model(torch.ones(1, 256)).sum().backward()
    opt.step()  # AdamW state: the checkpoint is about three times the weights
    return Component("policy", model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))


def _free(volume: Path) -> int:
    st = os.statvfs(volume)
    return st.f_bavail * st.f_frsize


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@pytest.fixture
def small_volume(tmp_path):
    """Yields a function mounting a tmpfs of `size` bytes (page-rounded) under tmp_path."""
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        where = tmp_path / "volume"
        where.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode != 0:
            pytest.skip("mounting a small tmpfs needs root")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=False)


def test_a_brief_disk_full_costs_one_save_not_every_later_one(tmp_path, small_volume, caplog):
    comp = _policy()
    size = _size(Checkpointer(tmp_path / "probe", keep=1).save(TrainState(step=1, version=1), [comp]))
    volume = small_volume(int(2.4 * size))
    ck = Checkpointer(volume / "checkpoints", keep=1)
    ck.save(TrainState(step=1, version=1), [comp])
    filler = volume / "filler"
    filler.write_bytes(b"\0" * int(0.9 * size))  # something else takes the room for a moment
    room = _free(volume)  # what the failing save will have written when the disk fills
    with caplog.at_level(logging.ERROR, logger="searchr1.learner"), \
            pytest.raises(Exception, match="No space left on device"):  # safetensors' own error, or OSError
        ck.save(TrainState(step=2, version=2), [comp])
    assert sorted(p.name for p in (volume / "checkpoints").iterdir()) == ["step00000001"]  # no partial copy
    assert "checkpoint of step 2 failed (" in caplog.text and "was removed" in caplog.text
    filler.unlink()

    # the baseline: step 2's partial copy left in place
    partial = volume / "checkpoints" / ".tmp-step00000002"
    partial.mkdir()
    (partial / "policy.optimizer.safetensors").write_bytes(b"\0" * (room - 8192))
    print(f"\ncheckpoint {size / 1e6:.2f} MB on a {int(2.4 * size) / 1e6:.2f} MB volume; free with step 1 and a "
          f"partial copy of {_size(partial) / 1e6:.2f} MB left: {_free(volume) / 1e6:.2f} MB")
    with pytest.raises(Exception, match="No space left on device"):
        ck.save(TrainState(step=3, version=3), [comp])  # the leftover takes the room the next save needs
    shutil.rmtree(partial)

    path = ck.save(TrainState(step=3, version=3), [comp])  # with the failed save cleaned up at once
    assert sorted(p.name for p in (volume / "checkpoints").iterdir()) == ["step00000003"]
    assert ck.load([_policy()]).step == 3 and path.name == "step00000003"
