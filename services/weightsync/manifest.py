"""Snapshot manifests: the per-chunk digests of a weight snapshot and the one digest announced for it
(docs/architecture.md, "Weight sync").

A snapshot is a directory of files (config.json, model.safetensors, ...). Its manifest, the file
`MANIFEST` beside them, lists every other file in sorted order of relative path, with its size and the
BLAKE3 digest of each `chunk_bytes` slice of it (the last one shorter; an empty file has none), as
canonical JSON (sorted keys, no spaces):

    {"chunk_bytes":16777216,"files":[{"chunks":["<64 hex>",...],"name":"config.json","size":712},...],
     "format":1,"hash":"blake3"}

The snapshot's digest — what the learner announces and `weights:published` records, the
`WeightVersion.sha256` field — is the sha256 of those bytes. Both hashes are cryptographic, so the
announced digest authenticates every byte of every listed file: whoever can write the shared volume
cannot substitute a chunk, nor a manifest. (xxh3 hashes 3× faster than BLAKE3 on these cores but is not
collision resistant: a writer of the volume could forge a chunk with the same xxh3.)

Chunks are independent, so they are hashed in parallel in a thread pool (BLAKE3 releases the GIL): by the
writer while it writes (`ChunkHasher.feed` beside each write), by a reader while it receives or reads the
bytes it then loads (`fetch.py` downloads, `read.read_verified`). Neither side makes a
pass over the bytes only to hash them.

The digest is a function of the listed files alone: `snapshot_digest(dir)` computes it from the files of a
directory without a manifest (a model saved by another tool) exactly as the publisher does while writing.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import blake3

MANIFEST = "snapshot.manifest.json"
"""The manifest's file name in a snapshot directory (listed by none: it lists the others)."""
FORMAT = 1
HASH = "blake3"
CHUNK_BYTES = 16 << 20
"""Chunk size the publisher writes manifests with; a reader takes the manifest's own."""
MIN_CHUNK_BYTES, MAX_CHUNK_BYTES = 1 << 10, 1 << 30
_HEX = frozenset("0123456789abcdef")


class SnapshotError(RuntimeError):
    """A snapshot that cannot be fetched or read, or whose bytes do not match its announcement."""


def hash_threads() -> int:
    """Threads that hash chunks: one per core this process may run on (at most 16)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(16, n))


def hash_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(hash_threads(), thread_name_prefix="snapshot-hash")


def snapshot_files(directory: str | Path) -> list[Path]:
    """The files that make up a snapshot directory, sorted by relative path (dotfiles excluded; the
    manifest included)."""
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"snapshot directory not found: {root}")
    return sorted(
        (p for p in root.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)),
        key=lambda p: p.relative_to(root).as_posix(),
    )


def snapshot_listing(directory: str | Path) -> list[str]:
    """Relative file names of a snapshot (its manifest included), as served by `GET {uri}/files`."""
    root = Path(directory)
    return [p.relative_to(root).as_posix() for p in snapshot_files(root)]


def content_names(directory: str | Path) -> list[str]:
    """The relative names a manifest of `directory` lists: every snapshot file but the manifest."""
    root = Path(directory)
    return [n for n in (p.relative_to(root).as_posix() for p in snapshot_files(root)) if n != MANIFEST]


def _hash_pieces(pieces: list[memoryview]) -> str:
    h = blake3.blake3()
    for p in pieces:
        h.update(p)
    return h.hexdigest()


class ChunkHasher:
    """The chunk digests of one file's bytes, fed in pieces of any size (`feed`), each full chunk hashed in
    `pool` while the caller goes on. Pieces are referenced, not copied, until their chunk is hashed: they
    must not change meanwhile; at most `inflight` chunks wait, which bounds what is held. With `expected`
    (a manifest's digests), a chunk that differs raises `SnapshotError` as soon as it is hashed."""

    def __init__(self, pool: ThreadPoolExecutor, chunk_bytes: int = CHUNK_BYTES, *, name: str = "",
                 expected: list[str] | None = None, inflight: int | None = None) -> None:
        self._pool, self.chunk_bytes, self.name, self._expected = pool, chunk_bytes, name, expected
        self._inflight = inflight or 2 * hash_threads()
        self._pieces: list[memoryview] = []
        self._fill = 0
        self._pending: deque[tuple[int, Future[str]]] = deque()
        self._done: list[str] = []
        self.size = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        mv = memoryview(data).cast("B")
        while len(mv):
            take = min(len(mv), self.chunk_bytes - self._fill)
            self._pieces.append(mv[:take])
            self._fill += take
            self.size += take
            mv = mv[take:]
            if self._fill == self.chunk_bytes:
                self._submit()

    def _submit(self) -> None:
        pieces, self._pieces, self._fill = self._pieces, [], 0
        index = len(self._done) + len(self._pending)
        if self._expected is not None and index >= len(self._expected):
            raise SnapshotError(f"{self.name}: longer than its manifest says ({len(self._expected)} chunks)")
        self._pending.append((index, self._pool.submit(_hash_pieces, pieces)))
        while len(self._pending) > self._inflight or (self._pending and self._pending[0][1].done()):
            self._collect()

    def _collect(self) -> None:
        index, fut = self._pending.popleft()
        digest = fut.result()
        if self._expected is not None and digest != self._expected[index]:
            self.cancel()
            raise SnapshotError(f"{self.name}: chunk {index} (bytes {index * self.chunk_bytes}–"
                                f"{(index + 1) * self.chunk_bytes}): digest mismatch against its manifest")
        self._done.append(digest)

    def digests(self) -> list[str]:
        """Every chunk's digest, in order (waits for the hashing; checks the count against `expected`)."""
        if self._fill:
            self._submit()
        while self._pending:
            self._collect()
        if self._expected is not None and len(self._done) != len(self._expected):
            raise SnapshotError(f"{self.name}: {len(self._done)} chunks, its manifest lists {len(self._expected)}")
        return list(self._done)

    def cancel(self) -> None:
        for _, fut in self._pending:
            fut.cancel()
        self._pending.clear()


@dataclass(frozen=True, slots=True)
class FileEntry:
    name: str
    size: int
    chunks: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Manifest:
    """A parsed, checked manifest (`parse`); `encode` gives its canonical bytes back."""

    chunk_bytes: int
    files: tuple[FileEntry, ...]

    def encode(self) -> bytes:
        doc = {"format": FORMAT, "hash": HASH, "chunk_bytes": self.chunk_bytes,
               "files": [{"name": f.name, "size": f.size, "chunks": list(f.chunks)} for f in self.files]}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, raw: bytes) -> Manifest:
        """The manifest in `raw`, refused (`SnapshotError`) unless it is well formed: the known format
        and hash, a chunk size in bounds, distinct safe relative names in sorted order, each with the
        number of 64-hex-digit chunk digests its size needs."""
        try:
            doc = json.loads(raw)
            chunk = doc["chunk_bytes"]
            if doc["format"] != FORMAT or doc["hash"] != HASH or set(doc) != {"format", "hash", "chunk_bytes", "files"}:
                raise ValueError("unknown format or hash")
            if type(chunk) is not int or not MIN_CHUNK_BYTES <= chunk <= MAX_CHUNK_BYTES:
                raise ValueError(f"chunk size {chunk!r} out of bounds")
            files = tuple(_entry(f, chunk) for f in doc["files"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"malformed snapshot manifest: {exc}") from exc
        names = [f.name for f in files]
        if names != sorted(set(names)):
            raise SnapshotError("malformed snapshot manifest: file names not distinct and sorted")
        return cls(chunk, files)


def _entry(doc: dict, chunk: int) -> FileEntry:
    name, size, chunks = doc["name"], doc["size"], doc["chunks"]
    if set(doc) != {"name", "size", "chunks"} or type(size) is not int or size < 0:
        raise ValueError(f"bad entry {doc.get('name')!r}")
    if not safe_name(name):
        raise ValueError(f"unsafe file name {name!r}")
    if not isinstance(chunks, list) or len(chunks) != -(-size // chunk):
        raise ValueError(f"{name}: {len(chunks) if isinstance(chunks, list) else '?'} chunk digests for {size} bytes")
    if not all(isinstance(c, str) and len(c) == 64 and set(c) <= _HEX for c in chunks):
        raise ValueError(f"{name}: a chunk digest is not 64 lowercase hex digits")
    return FileEntry(name, size, tuple(chunks))


def safe_name(name: object) -> bool:
    """A relative POSIX path inside the snapshot: no absolute path, `..`, dot-component, NUL or
    backslash, and not the manifest itself."""
    if not isinstance(name, str) or not name or "\0" in name or "\\" in name or name == MANIFEST:
        return False
    p = PurePosixPath(name)
    return not p.is_absolute() and all(part and not part.startswith(".") for part in name.split("/"))


def manifest_digest(raw: bytes) -> str:
    """The snapshot digest a manifest's bytes stand for (sha256, hex)."""
    return hashlib.sha256(raw).hexdigest()


class ManifestBuilder:
    """Builds a manifest from the files' bytes: `file(name)` gives the `ChunkHasher` to feed one file's
    bytes to (in any order of names), `add_file` reads a file on disk into one; `encode` waits for the
    hashing and returns the manifest's bytes."""

    def __init__(self, pool: ThreadPoolExecutor, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._pool, self.chunk_bytes = pool, chunk_bytes
        self._files: dict[str, ChunkHasher] = {}

    def file(self, name: str) -> ChunkHasher:
        if not safe_name(name) or name in self._files:
            raise ValueError(f"snapshot file name {name!r} is unsafe or given twice")
        self._files[name] = ChunkHasher(self._pool, self.chunk_bytes, name=name)
        return self._files[name]

    def add_file(self, name: str, path: Path) -> None:
        hasher = self.file(name)
        with path.open("rb", buffering=0) as f:
            while chunk := f.read(self.chunk_bytes):
                hasher.feed(chunk)

    def entries(self) -> Iterable[FileEntry]:
        for name in sorted(self._files):
            h = self._files[name]
            yield FileEntry(name, h.size, tuple(h.digests()))

    def encode(self) -> bytes:
        return Manifest(self.chunk_bytes, tuple(self.entries())).encode()


def snapshot_manifest(directory: str | Path, chunk_bytes: int = CHUNK_BYTES) -> bytes:
    """The manifest of the files in `directory` (any manifest file there is not one of them), hashed in
    parallel (blocking: run it in a thread)."""
    root = Path(directory)
    names = content_names(root)
    with hash_pool() as pool:
        builder = ManifestBuilder(pool, chunk_bytes)
        for name in names:
            builder.add_file(name, root / name)
        return builder.encode()


def snapshot_digest(directory: str | Path) -> str:
    """The digest of the snapshot in `directory`, computed from its files (`snapshot_manifest`): equal
    digests mean equal files under equal names, whatever directory they were copied to."""
    return manifest_digest(snapshot_manifest(directory))
