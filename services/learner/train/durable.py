"""Durable checkpoint directories: every file fsynced, a manifest of sizes and sha256 digests written
last, the directory fsynced, renamed into place, and its parent fsynced; on start, a checkpoint counts
only if its manifest verifies.

A process killed mid-save leaves a dot-directory the loader ignores (and removes); a host that loses its
page cache after the rename still finds every byte the manifest names, because the data reached the disk
before the rename did. A checkpoint whose files do not match its manifest (a truncated file, a torn write
on a filesystem that lied about fsync, bit rot) is skipped in favour of the newest older one that
verifies. A checkpoint without a manifest (written before manifests existed) is accepted as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST = "manifest.json"
_CHUNK = 1 << 20


def fsync_file(path: Path) -> str:
    """fsync `path` and return its sha256 (one read pass, from the page cache just written)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
        os.fsync(f.fileno())
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    """fsync a directory, so the entries created or renamed in it are on disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seal(tmp: Path, final: Path) -> None:
    """Make the checkpoint written to `tmp` durable and move it to `final`: fsync each file, write and
    fsync the manifest, fsync `tmp`, rename it over `final`, fsync the parent."""
    files = {}
    for p in sorted(tmp.iterdir()):
        if p.is_file() and p.name != MANIFEST:
            files[p.name] = {"size": p.stat().st_size, "sha256": fsync_file(p)}
    manifest = tmp / MANIFEST
    with manifest.open("w") as f:
        json.dump({"files": files}, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp)
    old = None
    if final.exists():  # the same step saved again (a resume that re-ran it): the old one goes last
        old = final.with_name(f".old-{final.name}")
        _rmtree(old)
        final.rename(old)
    tmp.rename(final)
    fsync_dir(final.parent)
    if old is not None:
        _rmtree(old)


def problem(path: Path, *, digests: bool = True) -> str | None:
    """Why the checkpoint at `path` cannot be loaded (None: it verifies). Without a manifest, only
    `state.json` must be present (a checkpoint from before manifests)."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return None if (path / "state.json").is_file() else "no state.json and no manifest"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"unreadable manifest: {exc}"
    if "state.json" not in files:
        return "the manifest lists no state.json"
    for name, want in sorted(files.items()):
        p = path / name
        if not p.is_file():
            return f"{name} is missing"
        size = p.stat().st_size
        if size != want["size"]:
            return f"{name} has {size} bytes, the manifest says {want['size']}"
        if digests and _sha256(p) != want["sha256"]:
            return f"{name} does not match its sha256 in the manifest"
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
