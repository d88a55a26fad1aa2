"""Durable checkpoints: fsynced before the rename, a manifest of digests, and a start that falls back to
the newest checkpoint that verifies (a SIGKILL inside `save`, a truncated file, flipped bytes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from torch import nn

from searchr1.learner.train import durable
from searchr1.learner.train.checkpoint import Checkpointer, Component, TrainState

torch.set_num_threads(1)


def _policy(seed: int) -> Component:
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return Component("policy", model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))


def _save(root: Path, step: int, seed: int) -> Path:
    return Checkpointer(root, keep=3).save(TrainState(step=step, version=step, consumed={f"t{step}"}),
                                           [_policy(seed)])


def test_truncated_newest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    _save(tmp_path, 1, 0)
    newest = _save(tmp_path, 2, 1)
    f = newest / "policy.optimizer.safetensors"
    f.write_bytes(f.read_bytes()[:-9])
    ck = Checkpointer(tmp_path, keep=3)
    assert ck.latest() == tmp_path / "step00000001"
    pol = _policy(5)
    state = ck.load([pol])
    assert (state.step, state.consumed) == (1, {"t1"})
    assert torch.equal(pol.model.weight, _policy(0).model.weight)


def test_flipped_bytes_of_equal_size_fail_the_digest(tmp_path):
    _save(tmp_path, 1, 0)
    newest = _save(tmp_path, 2, 1)
    f = newest / "policy.safetensors"
    raw = bytearray(f.read_bytes())
    raw[-1] ^= 0xFF
    f.write_bytes(bytes(raw))
    assert "sha256" in durable.problem(newest)
    assert Checkpointer(tmp_path, keep=3).latest() == tmp_path / "step00000001"


def test_no_checkpoint_verifies_means_a_fresh_start(tmp_path):
    only = _save(tmp_path, 1, 0)
    (only / "state.json").unlink()
    assert Checkpointer(tmp_path, keep=3).load([_policy(0)]) is None


def test_every_file_and_both_directories_are_fsynced_before_and_after_the_rename(tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, Path.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(self, target):
        events.append(("rename", str(target)))
        return real_rename(self, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Path, "rename", rename)
    final = _save(tmp_path, 1, 0)
    renamed = events.index(("rename", str(final)))
    before = {Path(p).name for kind, p in events[:renamed] if kind == "fsync"}
    assert {"policy.safetensors", "policy.optimizer.safetensors", "rng.safetensors", "state.json",
            "manifest.json", ".tmp-step00000001"} <= before
    assert ("fsync", str(tmp_path)) in events[renamed:]


def test_saving_a_step_again_replaces_it_whole(tmp_path):
    _save(tmp_path, 1, 0)
    _save(tmp_path, 1, 3)
    pol = _policy(9)
    Checkpointer(tmp_path, keep=3).load([pol])
    assert torch.equal(pol.model.weight, _policy(3).model.weight)
    assert [p.name for p in tmp_path.iterdir()] == ["step00000001"]


_KILLED_SAVE = textwrap.dedent("""
    import sys, torch
    from pathlib import Path
    from torch import nn
    from searchr1.core.faults import FaultPoints
    from searchr1.learner.train.checkpoint import Checkpointer, Component, TrainState
    torch.manual_seed(1)
    m = nn.Linear(3, 2)
    o = torch.optim.AdamW(m.parameters(), lr=0.1)
    c = Component("policy", m, o, torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0))
    faults = FaultPoints("checkpoint.before_seal")
    Checkpointer(Path(sys.argv[1]), keep=3, faults=faults).save(TrainState(step=2, version=2), [c])
""")


def test_sigkill_inside_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    _save(tmp_path, 1, 0)
    proc = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(tmp_path)], timeout=300)
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / ".tmp-step00000002" / "state.json").is_file()  # killed mid-save, not before it
    ck = Checkpointer(tmp_path, keep=3)
    assert ck.load([_policy(4)]).step == 1
    _save(tmp_path, 2, 2)  # the next save clears what the killed one left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step00000001", "step00000002"]


def test_a_resave_swaps_atomically_and_leaves_no_old_copy(tmp_path, monkeypatch):
    """Re-saving a step is one swap: no moment without a complete copy (no rename of the old one first)."""
    _save(tmp_path, 1, 0)
    renames: list[tuple[str, str]] = []
    real_rename = Path.rename
    monkeypatch.setattr(Path, "rename", lambda self, to: renames.append((self.name, Path(to).name)) or
                        real_rename(self, to))
    _save(tmp_path, 1, 3)
    assert renames == []  # the swap, not final → .old-final, .tmp-final → final
    pol = _policy(9)
    Checkpointer(tmp_path, keep=3).load([pol])
    assert torch.equal(pol.model.weight, _policy(3).model.weight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step00000001"]


def test_a_resave_cut_between_its_renames_keeps_the_step(tmp_path):
    """Where the swap is not available: a crash after `stepN → .old-stepN` and before `.tmp-stepN → stepN`
    leaves the old copy, which the next start restores; leftover `.old-*` beside their step are pruned."""
    _save(tmp_path, 1, 0)
    _save(tmp_path, 2, 1)
    (tmp_path / "step00000002").rename(tmp_path / ".old-step00000002")  # the state the crash leaves
    (tmp_path / ".tmp-step00000002").mkdir()
    latest = Checkpointer(tmp_path, keep=3).latest()
    assert latest is not None and latest.name == "step00000002"
    pol = _policy(9)
    Checkpointer(tmp_path, keep=3).load([pol])
    assert torch.equal(pol.model.weight, _policy(1).model.weight)
    stale = tmp_path / ".old-step00000001"
    stale.mkdir()  # an old copy whose step is in place
    _save(tmp_path, 3, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step00000001", "step00000002", "step00000003"]
