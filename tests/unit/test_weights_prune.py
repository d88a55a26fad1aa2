"""A worker's local weight copies older than the version it runs are deleted (`searchr1.weightsync.prune_copies`):
kept, pinned hard links would hold every version's bytes after the publisher pruned its own."""

from __future__ import annotations

from pathlib import Path

from searchr1.weightsync import prune_copies


def _copy(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"w")
    return d


def test_older_copies_go_newer_and_foreign_ones_stay(tmp_path):
    old = [_copy(tmp_path, f"v{v:08d}-{'a' * 16}") for v in (1, 2)]
    current = _copy(tmp_path, f"v00000003-{'b' * 16}")
    ahead = _copy(tmp_path, f"v00000004-{'c' * 16}")  # another worker sharing the directory, ahead
    foreign = _copy(tmp_path, "notes")
    partial = _copy(tmp_path, f".partial-v00000001-{'a' * 16}-123")
    assert sorted(prune_copies(tmp_path, 3)) == sorted(old)
    assert all(not d.exists() for d in old)
    assert current.is_dir() and ahead.is_dir() and foreign.is_dir() and partial.is_dir()
    assert prune_copies(tmp_path / "missing", 3) == []
