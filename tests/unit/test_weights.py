"""Snapshot digests: path- and content-sensitive, independent of where the snapshot sits and of how its
bytes were fed; manifests are checked strictly; a snapshot read for loading is verified chunk by chunk
against the announced digest, and refused before anything is returned."""

from __future__ import annotations

import json
import shutil

import pytest

from searchr1.weightsync import SnapshotError, read_verified, snapshot_digest
from searchr1.weightsync.manifest import (
    MANIFEST,
    ChunkHasher,
    Manifest,
    ManifestBuilder,
    hash_pool,
    manifest_digest,
    snapshot_manifest,
)

CHUNK = 4096


def test_digest(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    (a / "model.safetensors").write_bytes(b"\x00\x01" * 100)
    (a / "config.json").write_text("{}")
    (a / ".tmp-ignored").write_text("x")
    d = snapshot_digest(a)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    (b / ".tmp-ignored").write_text("different")
    (b / MANIFEST).write_text("not part of the digest")
    assert snapshot_digest(b) == d
    (b / "config.json").write_text("{ }")
    assert snapshot_digest(b) != d
    (b / "config.json").write_text("{}")
    (b / "config.json").rename(b / "config2.json")
    assert snapshot_digest(b) != d
    with pytest.raises(FileNotFoundError):
        snapshot_digest(tmp_path / "missing")


def test_a_file_fed_in_any_pieces_has_the_digest_of_the_file_read(tmp_path):
    (tmp_path / "sub").mkdir()
    data = bytes(range(256)) * 100  # 25,600 bytes: six full 4 KiB chunks and a short one
    (tmp_path / "model.safetensors").write_bytes(data)
    (tmp_path / "sub" / "config.json").write_text('{"a": 1}')
    with hash_pool() as pool:
        b = ManifestBuilder(pool, CHUNK)
        b.add_file("sub/config.json", tmp_path / "sub" / "config.json")
        h = b.file("model.safetensors")
        for i in range(0, len(data), 1000):  # pieces straddling chunk boundaries
            h.feed(memoryview(data)[i:i + 1000])
        raw = b.encode()
    assert raw == snapshot_manifest(tmp_path, CHUNK)
    m = Manifest.parse(raw)
    assert [(f.name, f.size, len(f.chunks)) for f in m.files] == [("model.safetensors", 25_600, 7), ("sub/config.json", 8, 1)]
    assert m.encode() == raw


def test_a_chunk_hasher_with_expected_digests_stops_at_the_first_bad_chunk():
    data = bytearray(b"x" * (3 * CHUNK))
    with hash_pool() as pool:
        good = ChunkHasher(pool, CHUNK)
        good.feed(data)
        expected = good.digests()
        data[CHUNK + 7] ^= 1
        bad = ChunkHasher(pool, CHUNK, name="model.safetensors", expected=expected, inflight=1)
        with pytest.raises(SnapshotError, match="chunk 1 .*mismatch"):
            bad.feed(data)
            bad.digests()
        long = ChunkHasher(pool, CHUNK, name="f", expected=expected)
        with pytest.raises(SnapshotError, match="longer"):
            long.feed(b"x" * (4 * CHUNK))
            long.digests()


def _entry(**kw):
    e = {"name": "model.safetensors", "size": 5, "chunks": ["0" * 64]}
    return {**e, **kw}


@pytest.mark.parametrize("files, why", [
    ([_entry(name="../x")], "unsafe"),
    ([_entry(name="/abs")], "unsafe"),
    ([_entry(name=".hidden")], "unsafe"),
    ([_entry(name=MANIFEST)], "unsafe"),
    ([_entry(chunks=[])], "chunk digests"),
    ([_entry(chunks=["0" * 64, "0" * 64])], "chunk digests"),
    ([_entry(chunks=["Z" * 64])], "hex"),
    ([_entry(size=-1)], "bad entry"),
    ([_entry(name="b"), _entry(name="a")], "sorted"),
    ([_entry(), _entry()], "sorted"),
])
def test_malformed_manifests_are_refused(files, why):
    doc = {"format": 1, "hash": "blake3", "chunk_bytes": CHUNK, "files": files}
    with pytest.raises(SnapshotError, match=why):
        Manifest.parse(json.dumps(doc).encode())


def test_unknown_hash_or_chunk_size_is_refused():
    for doc in ({"format": 1, "hash": "xxh3", "chunk_bytes": CHUNK, "files": []},
                {"format": 1, "hash": "blake3", "chunk_bytes": 10, "files": []},
                {"format": 2, "hash": "blake3", "chunk_bytes": CHUNK, "files": []}):
        with pytest.raises(SnapshotError, match="malformed"):
            Manifest.parse(json.dumps(doc).encode())


def _snapshot(tmp_path, manifest=True):
    snap = tmp_path / "snap"
    snap.mkdir()
    data = bytes(range(256)) * 64  # 16 KiB: four chunks
    (snap / "model.safetensors").write_bytes(data)
    (snap / "config.json").write_text("{}")
    raw = snapshot_manifest(snap, CHUNK)
    if manifest:
        (snap / MANIFEST).write_bytes(raw)
    return snap, data, manifest_digest(raw) if manifest else snapshot_digest(snap)


def test_read_verified_returns_the_bytes_of_every_listed_file(tmp_path):
    snap, data, digest = _snapshot(tmp_path)
    (snap / "extra.safetensors").write_bytes(b"never listed")
    files = read_verified(snap, digest)
    assert set(files) == {"config.json", "model.safetensors"}
    assert bytes(files["model.safetensors"]) == data and bytes(files["config.json"]) == b"{}"


def test_one_corrupted_chunk_is_refused_naming_it(tmp_path):
    snap, data, digest = _snapshot(tmp_path)
    bad = bytearray(data)
    bad[2 * CHUNK + 5] ^= 0x40
    (snap / "model.safetensors").write_bytes(bad)
    with pytest.raises(SnapshotError, match=r"model.safetensors: chunk 2 .*mismatch"):
        read_verified(snap, digest)
    (snap / "model.safetensors").write_bytes(data[:-1])
    with pytest.raises(SnapshotError, match="bytes, its manifest lists"):
        read_verified(snap, digest)
    (snap / "model.safetensors").unlink()
    with pytest.raises(SnapshotError, match="cannot open"):
        read_verified(snap, digest)


def test_a_manifest_that_does_not_match_the_announcement_is_refused(tmp_path):
    snap, data, digest = _snapshot(tmp_path)
    with pytest.raises(SnapshotError, match="mismatch for the manifest"):
        read_verified(snap, "0" * 64)
    # a manifest rewritten to match substituted weights: its digest is not the announced one
    (snap / "model.safetensors").write_bytes(b"substituted" * 100)
    (snap / MANIFEST).write_bytes(snapshot_manifest(snap, CHUNK))
    with pytest.raises(SnapshotError, match="mismatch for the manifest"):
        read_verified(snap, digest)


def test_a_directory_without_a_manifest_is_verified_as_read(tmp_path):
    snap, data, digest = _snapshot(tmp_path, manifest=False)
    assert bytes(read_verified(snap, digest)["model.safetensors"]) == data
    (snap / "model.safetensors").write_bytes(data[:-1] + b"\0")
    with pytest.raises(SnapshotError, match="mismatch"):
        read_verified(snap, digest)
