"""Weights integrity: the digest's framing is unambiguous, the bytes a worker verified are the bytes it
loads (a snapshot re-written after verification does not reach it), and workers sharing a download
directory never write into or load one another's partial download."""

from __future__ import annotations

import asyncio
import shutil

from searchr1.core.schemas import WeightVersion
from searchr1.weightsync import fetch_snapshot, snapshot_digest
from tests.support.snapshot_server import serve_snapshot


def test_a_file_boundary_cannot_be_forged_inside_a_file(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "a").write_bytes(b"x\0b\0y")  # under a name\0bytes\0 framing this equals the two files below
    (two / "a").write_bytes(b"x")
    (two / "b").write_bytes(b"y")
    assert snapshot_digest(one) != snapshot_digest(two)


async def test_the_verified_bytes_are_the_loaded_bytes_when_the_snapshot_is_rewritten(tmp_path):
    snap = tmp_path / "weights" / "v00000005"
    snap.mkdir(parents=True)
    (snap / "model.safetensors").write_bytes(b"good" * 1000)
    digest = snapshot_digest(snap)
    got = await fetch_snapshot(WeightVersion(version=5, uri=str(snap), sha256=digest), tmp_path / "dl")
    # the publisher writes version 5 again (a learner resumed from an older checkpoint): new files, renamed
    tmp = tmp_path / "weights" / ".tmp-v00000005"
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(b"other" * 1000)
    shutil.rmtree(snap)
    tmp.rename(snap)
    assert snapshot_digest(got) == digest  # what the engine loads from `got` is what was verified


async def test_workers_sharing_a_download_dir_fetch_the_same_version_at_once(tmp_path):
    snap = tmp_path / "snap"
    snap.mkdir()
    for i in range(4):
        (snap / f"part{i}.bin").write_bytes(bytes([i]) * (1 << 20))
    digest = snapshot_digest(snap)
    async with serve_snapshot(snap) as base:
        wv = WeightVersion(version=1, uri=base, sha256=digest)
        dl = tmp_path / "shared-dl"
        got = await asyncio.gather(*(fetch_snapshot(wv, dl) for _ in range(4)))
    assert len(set(got)) == 1 and snapshot_digest(got[0]) == digest
    assert [p.name for p in dl.iterdir()] == [got[0].name], "no partial download left behind"
