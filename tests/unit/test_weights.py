"""Snapshot digests are path- and content-sensitive and independent of where the snapshot sits."""

from __future__ import annotations

import shutil

import pytest

from searchr1.core.weights import DigestBuilder, snapshot_digest


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
    assert snapshot_digest(b) == d
    (b / "config.json").write_text("{ }")
    assert snapshot_digest(b) != d
    (b / "config.json").write_text("{}")
    (b / "config.json").rename(b / "config2.json")
    assert snapshot_digest(b) != d
    with pytest.raises(FileNotFoundError):
        snapshot_digest(tmp_path / "missing")


def test_digest_builder_is_the_snapshot_digest_fed_incrementally(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "model.safetensors").write_bytes(bytes(range(256)) * 9)
    (tmp_path / "sub" / "config.json").write_text('{"a": 1}')
    d = DigestBuilder()
    d.begin("model.safetensors")
    data = (tmp_path / "model.safetensors").read_bytes()
    for i in range(0, len(data), 1000):  # any chunking
        d.update(data[i:i + 1000])
    d.end()
    d.add_file("sub/config.json", tmp_path / "sub" / "config.json")
    assert d.hexdigest() == snapshot_digest(tmp_path)


def test_digest_builder_refuses_misuse():
    d = DigestBuilder()
    d.begin("b")
    with pytest.raises(ValueError, match="not ended"):
        d.begin("c")
    with pytest.raises(ValueError, match="not ended"):
        d.hexdigest()
    d.end()
    with pytest.raises(ValueError, match="sorted order"):
        d.begin("a")
    with pytest.raises(ValueError, match="sorted order"):
        d.begin("b")
    with pytest.raises(ValueError, match="outside a file"):
        d.update(b"x")
