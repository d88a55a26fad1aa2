"""Reading a weight snapshot for loading, verified as it is read (docs/architecture.md, "Weight sync").

`read_verified(dir, digest)` reads every file the snapshot's manifest lists (`manifest.py`)
into this process's memory and returns those bytes, after checking them against the announced `digest`:
the manifest's sha256 first (a manifest that does not match the announcement is refused before any weight
is read), then each chunk's BLAKE3 as it arrives. The chunks are read and hashed in parallel, one pool task
per chunk (`os.preadv` into its slice of the buffer, then its hash), so the read the load needs anyway is
the verification: there is no separate pass. A mismatching chunk stops the read and raises
`SnapshotError` naming the file and chunk; nothing has been handed to the engine by then.

The caller builds its tensors over the returned buffers (`safetensors.py`), so the bytes loaded
are the bytes verified, whatever is written to the files afterwards (hard links on a shared volume share
their inode with the publisher's files). The cost is one copy of the snapshot in memory while it loads
(anonymous memory, freed with the buffers).

A directory without a manifest (a model saved by another tool) is read the same way, its manifest computed
from the chunks as they arrive and its digest compared once every file is read — still before the load.
Blocking: run it in a thread (the vLLM engine runs it in its worker process).
"""

from __future__ import annotations

import mmap
import os
import stat
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import blake3

from searchr1.weightsync.manifest import (
    CHUNK_BYTES,
    MANIFEST,
    FileEntry,
    Manifest,
    SnapshotError,
    content_names,
    hash_pool,
    manifest_digest,
)


def read_manifest(directory: str | Path, digest: str) -> Manifest | None:
    """The manifest of the snapshot in `directory`, checked against the announced `digest`; None when the
    directory has none. Raises `SnapshotError` when it does not match or is malformed (cheap: the
    manifest alone is read)."""
    path = Path(directory) / MANIFEST
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SnapshotError(f"cannot read {path}: {exc}") from exc
    got = manifest_digest(raw)
    if got != digest:
        raise SnapshotError(f"sha256 mismatch for the manifest of {directory}: got {got}, announced {digest}")
    return Manifest.parse(raw)


def _read_chunk(fd: int, view: memoryview, offset: int, n: int) -> str:
    try:
        got = os.preadv(fd, [view[offset:offset + n]], offset)
    except OSError as exc:
        raise SnapshotError(f"cannot read bytes {offset}–{offset + n}: {exc}") from exc
    if got != n:
        raise SnapshotError(f"short read at byte {offset}: {got} of {n} bytes (the file shrank)")
    return blake3.blake3(view[offset:offset + n]).hexdigest()


def _read_file(pool: ThreadPoolExecutor, path: Path, chunk_bytes: int, entry: FileEntry | None
               ) -> tuple[memoryview, list[str]]:
    """(the file's bytes, its chunk digests), read and hashed chunk by chunk in `pool`; checked against
    `entry` (its size, then each chunk in order) when given."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise SnapshotError(f"cannot open {path}: {exc}") from exc
    futures: list[Future[str]] = []
    try:
        n = os.fstat(fd).st_size
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SnapshotError(f"{path} is not a regular file")
        if entry is not None and n != entry.size:
            raise SnapshotError(f"{entry.name}: {n} bytes, its manifest lists {entry.size}")
        view = memoryview(mmap.mmap(-1, n) if n else bytearray())
        futures = [pool.submit(_read_chunk, fd, view, off, min(chunk_bytes, n - off)) for off in range(0, n, chunk_bytes)]
        digests = []
        for i, fut in enumerate(futures):
            d = fut.result()
            if entry is not None and d != entry.chunks[i]:
                raise SnapshotError(f"{entry.name}: chunk {i} (bytes {i * chunk_bytes}–{i * chunk_bytes + chunk_bytes}): "
                                    f"digest mismatch against its manifest")
            digests.append(d)
        return view, digests
    finally:
        for fut in futures:
            fut.cancel()
        wait(futures)  # no task may still read from `fd` once it is closed
        os.close(fd)


def read_verified(directory: str | Path, digest: str) -> dict[str, memoryview]:
    """Every file of the snapshot in `directory` (its relative name → its bytes), verified against the
    announced `digest` as it is read; raises `SnapshotError` on any mismatch, a missing or unreadable
    file, or a malformed manifest. Files the manifest does not list are neither read nor returned."""
    root = Path(directory)
    if not root.is_dir():
        raise SnapshotError(f"snapshot directory {root} does not exist")
    manifest = read_manifest(root, digest)
    out: dict[str, memoryview] = {}
    with hash_pool() as pool:
        if manifest is not None:
            for entry in manifest.files:
                out[entry.name], _ = _read_file(pool, root / entry.name, manifest.chunk_bytes, entry)
            return out
        entries = []
        for name in content_names(root):
            out[name], chunks = _read_file(pool, root / name, CHUNK_BYTES, None)
            entries.append(FileEntry(name, out[name].nbytes, tuple(chunks)))
    got = manifest_digest(Manifest(CHUNK_BYTES, tuple(entries)).encode())
    if got != digest:
        raise SnapshotError(f"sha256 mismatch for {root}: got {got}, announced {digest}")
    return out
