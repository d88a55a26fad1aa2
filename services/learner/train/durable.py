"""Durable checkpoint directories: every file fsynced, a manifest of sizes and sha256 digests written
last, the directory fsynced, renamed into place, and its parent fsynced; on start, a checkpoint counts
only if its manifest verifies.

A step saved again (a resume that re-ran it) replaces the old copy with one atomic swap of the two
directories (`exchange`); where the swap is not available it takes two renames, and a process killed
between them leaves the old copy as `.old-<step>`, which the next start renames back
(`restore_old_copies`), so a step is never without a copy. A process killed mid-save leaves a
dot-directory the loader ignores (and removes); a host that loses its
page cache after the rename still finds every byte the manifest names, because the data reached the disk
before the rename did. A checkpoint whose files do not match its manifest (a truncated file, a torn write
on a filesystem that lied about fsync, bit rot) is skipped in favour of the newest older one that
verifies. A checkpoint without a manifest is skipped the same way and named: every save writes one, so a
step directory without it was not sealed here (written before manifests existed, copied in part, or
edited by hand), and nothing says its files are whole.
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
    if final.exists() and exchange(tmp, final):  # a re-save: one atomic swap, `tmp` now holds the old copy
        fsync_dir(final.parent)
        _rmtree(tmp)
        return
    old = None
    if final.exists():  # no atomic swap here: two renames, and `restore_old_copies` covers a crash between
        old = final.with_name(f"{OLD_PREFIX}{final.name}")
        _rmtree(old)
        final.rename(old)
    tmp.rename(final)
    fsync_dir(final.parent)
    if old is not None:
        _rmtree(old)


OLD_PREFIX = ".old-"
"""A checkpoint being replaced by a re-save of its step (where no atomic swap is available)."""
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one atomic step (Linux `renameat2(RENAME_EXCHANGE)`), so a re-saved step has
    a complete copy at every instant; False where the system or filesystem cannot (then nothing moved)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def restore_old_copies(root: Path) -> list[Path]:
    """Settle what a re-save cut between its two renames left under `root`: a `.old-<name>` whose `<name>`
    is missing is the only copy of that step and is renamed back; one whose `<name>` is in place is a
    leftover and is removed. Returns the restored paths. Called on start and after every save."""
    restored = []
    for old in sorted(root.glob(f"{OLD_PREFIX}*")):
        final = old.with_name(old.name.removeprefix(OLD_PREFIX))
        if final.exists():
            _rmtree(old)
        elif old.is_dir():
            old.rename(final)
            fsync_dir(root)
            restored.append(final)
    return restored


def problem(path: Path, *, digests: bool = True) -> str | None:
    """Why the checkpoint at `path` cannot be loaded (None: it verifies against its manifest)."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return (f"no {MANIFEST}: its files cannot be verified (every save writes one; this directory was "
                "written before manifests, copied in part or edited)")
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
