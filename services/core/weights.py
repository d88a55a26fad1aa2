"""Weight-version announcements shared by the learner (writer) and rollout workers (readers)
(docs/architecture.md, "Weight sync"): a Redis hash `searchr1:{run}:weights` holding the latest `WeightVersion`
(the workers poll it), plus the snapshot digest both sides compute the same way.

It does not write or load tensors (that is the learner's publisher and the rollout's loader), nor fetch a
snapshot to a worker's disk (`snapshot_fetch.py`).

The digest is one sha256 over every file, in sorted order of relative path, of a fixed-layout record:
the name's length (8 bytes, little-endian), the name (UTF-8), the file's size (8 bytes) and the sha256 of
its bytes (32 bytes) (`snapshot_digest`). Every field has a known length, so no two snapshots frame to
the same stream (a file's bytes cannot pass for a name or a file boundary).
`DigestBuilder` computes it incrementally, so a writer hashes a snapshot while writing it (the learner's
publisher) and a reader while receiving it (`core.snapshot_fetch.fetch_snapshot` over HTTP): each side
makes one pass over the bytes, none reads a snapshot back just to hash it. `snapshot_digest` and the
other filesystem helpers here are synchronous.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from redis import asyncio as aioredis

from searchr1.core.schemas import SchemaError, WeightVersion, decode, encode
from searchr1.core.streams import StreamKeys

_CHUNK = 1 << 20


def snapshot_files(directory: str | Path) -> list[Path]:
    """The files that make up a snapshot directory, sorted by relative path (dotfiles excluded)."""
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"snapshot directory not found: {root}")
    return sorted(
        (p for p in root.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)),
        key=lambda p: p.relative_to(root).as_posix(),
    )


class DigestBuilder:
    """`snapshot_digest` computed incrementally: `begin(name)`, `update(bytes)`..., `end()` per file, files
    in sorted order of their relative names (enforced: a name out of order raises `ValueError`)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self._file = hashlib.sha256()
        self._size = 0
        self._last: str | None = None
        self._open = False

    def begin(self, name: str) -> None:
        if self._open:
            raise ValueError(f"file {self._last!r} was not ended before {name!r}")
        if self._last is not None and name <= self._last:
            raise ValueError(f"snapshot files must be digested in sorted order: {name!r} after {self._last!r}")
        self._last, self._open = name, True
        raw = name.encode()
        self._h.update(len(raw).to_bytes(8, "little") + raw)
        self._file, self._size = hashlib.sha256(), 0

    def update(self, data: bytes | memoryview) -> None:
        if not self._open:
            raise ValueError("update() outside a file")
        self._file.update(data)
        self._size += data.nbytes if isinstance(data, memoryview) else len(data)

    def end(self) -> None:
        if not self._open:
            raise ValueError("end() outside a file")
        self._open = False
        self._h.update(self._size.to_bytes(8, "little") + self._file.digest())

    def add_file(self, name: str, path: Path) -> None:
        """Digest the file at `path` under the relative name `name`."""
        self.begin(name)
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                self.update(chunk)
        self.end()

    def hexdigest(self) -> str:
        if self._open:
            raise ValueError(f"file {self._last!r} was not ended")
        return self._h.hexdigest()


def snapshot_digest(directory: str | Path) -> str:
    """sha256 over each file's framed relative path, size and sha256, in sorted order: equal digests mean equal
    snapshots, whatever directory they were copied to."""
    root = Path(directory)
    d = DigestBuilder()
    for path in snapshot_files(root):
        d.add_file(path.relative_to(root).as_posix(), path)
    return d.hexdigest()


_ANNOUNCE = """
local fence = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
local version = tonumber(redis.call('HGET', KEYS[1], 'version') or '-1')
if tonumber(ARGV[2]) < fence then return -1 end
if ARGV[4] ~= '1' and tonumber(ARGV[3]) < version then return 0 end
redis.call('HSET', KEYS[1], 'latest', ARGV[1], 'version', ARGV[3], 'fence', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[1])
return 1
"""


class FencedOff(RuntimeError):
    """An announcement by a writer whose fencing token is older than the one stored: another learner
    has taken the run over."""


async def announce(redis: aioredis.Redis, keys: StreamKeys, version: WeightVersion, *, fence: int = 0,
                   force: bool = False) -> bool:
    """Record `version` as the latest, atomically (one Lua script). Versions never
    go backwards: an older announcement than the one stored is ignored (a restarted learner resumes from
    its checkpoint) unless `force` (a rollback). `fence` is the writer's fencing token (core/lease.py),
    stored beside the announcement in the hash's `fence` field; a writer with an older token than the
    stored one raises `FencedOff`. Every announcement is also recorded by version in
    `searchr1:{run}:weights:published` (what `rollback` may re-announce). Returns True when announced,
    False when ignored."""
    done = await redis.eval(_ANNOUNCE, 2, keys.weights, published_key(keys),
                            encode(version), int(fence),
                            int(version.version), "1" if force else "0")
    if int(done) < 0:
        raise FencedOff(f"weight version {version.version} announced with fencing token {fence}, older than "
                        f"the stored one: another learner holds the run")
    return bool(int(done))


def read_version(raw: bytes | None) -> WeightVersion | None:
    """A stored `WeightVersion` record, or None when there is none or it is unreadable."""
    if raw is None:
        return None
    try:
        return decode(WeightVersion, raw)
    except SchemaError:
        return None


def published_key(keys: StreamKeys) -> str:
    """Hash {version: announcement} of every version the learner announced."""
    return keys.key("weights:published")


async def published(redis: aioredis.Redis, keys: StreamKeys, version: int) -> WeightVersion | None:
    """The announcement the learner made for `version`, or None if it never announced it."""
    return read_version(await redis.hget(published_key(keys), str(version)))


async def rollback(redis: aioredis.Redis, keys: StreamKeys, version: int) -> WeightVersion:
    """Announce again the learner's own announcement of `version` (its uri and digest, unchanged), so
    workers go back to it; the stored fencing token is kept. Raises `LookupError` for a version the
    learner never announced: a worker can only be sent to weights the learner published. A running
    learner announces its next version over it: stop it first to stay on `version`."""
    wv = await published(redis, keys, version)
    if wv is None:
        known = sorted(int(v) for v in await redis.hkeys(published_key(keys)))
        raise LookupError(f"weight version {version} was never announced by the learner of this run "
                          f"(announced: {known[-10:] if known else 'none'})")
    wv = wv.model_copy(update={"created_at": time.time()})
    await announce(redis, keys, wv, fence=await announced_fence(redis, keys), force=True)
    return wv


async def announced_fence(redis: aioredis.Redis, keys: StreamKeys) -> int:
    """The fencing token of the writer of the latest announcement (0: none, or a writer without a lease)."""
    raw = await redis.hget(keys.weights, b"fence")
    return int(raw) if raw is not None else 0


async def latest(redis: aioredis.Redis, keys: StreamKeys) -> WeightVersion | None:
    """The latest announced version, or None if none was announced (or the record is unreadable)."""
    return read_version(await redis.hget(keys.weights, b"latest"))


async def latest_fenced(redis: aioredis.Redis, keys: StreamKeys) -> tuple[WeightVersion | None, int]:
    """The latest announced version and the fencing token it was announced with, read together."""
    raw, fence = await redis.hmget(keys.weights, [b"latest", b"fence"])
    return read_version(raw), int(fence) if fence is not None else 0


async def is_published(redis: aioredis.Redis, keys: StreamKeys, announced: WeightVersion) -> bool:
    """Whether the learner announced exactly `announced` (same version, uri and digest) through `announce`,
    which records every announcement it makes: a record written any other way is not a published version."""
    record = await published(redis, keys, announced.version)
    return record is not None and (record.uri, record.sha256) == (announced.uri, announced.sha256)


def snapshot_listing(directory: str | Path) -> list[str]:
    """Relative file names of a snapshot, as served by `GET {uri}/files` (the HTTP snapshot protocol:
    `GET {uri}/files` → JSON list of names, `GET {uri}/files/{name}` → the file's bytes)."""
    root = Path(directory)
    return [p.relative_to(root).as_posix() for p in snapshot_files(root)]
