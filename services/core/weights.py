"""Weight-version announcements shared by the learner (writer) and rollout workers (readers)
(docs/architecture.md, "Weight sync"): a Redis hash `searchr1:{run}:weights` holding the latest `WeightVersion`
(the workers poll it), plus the snapshot digest both sides compute the same way.

It does not write or load tensors (that is the learner's publisher and the rollout's loader).

The digest is one sha256 over every file, in sorted order of relative path, of a fixed-layout record:
the name's length (8 bytes, little-endian), the name (UTF-8), the file's size (8 bytes) and the sha256 of
its bytes (32 bytes) (`snapshot_digest`). Every field has a known length, so no two snapshots frame to
the same stream (a file's bytes cannot pass for a name or a file boundary).
`DigestBuilder` computes it incrementally, so a writer hashes a snapshot while writing it (the learner's
publisher) and a reader while receiving it (`fetch_snapshot` over HTTP): each side makes one pass over the
bytes, none reads a snapshot back just to hash it.

`snapshot_digest` and the other filesystem helpers are synchronous; `fetch_snapshot` is async and runs
every piece of disk work (hashing gigabytes, `rmtree`, file writes, renames) in a worker thread, so the
event loop of a rollout worker keeps serving while a snapshot is verified or downloaded. A download runs
whole in one worker thread with a blocking client (receive, write and hash each chunk there), with no
hop between the loop and a thread per chunk.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import BinaryIO

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


class SnapshotError(RuntimeError):
    """A snapshot that cannot be fetched or whose digest does not match its announcement."""


def snapshot_listing(directory: str | Path) -> list[str]:
    """Relative file names of a snapshot, as served by `GET {uri}/files` (the HTTP snapshot protocol:
    `GET {uri}/files` → JSON list of names, `GET {uri}/files/{name}` → the file's bytes)."""
    root = Path(directory)
    return [p.relative_to(root).as_posix() for p in snapshot_files(root)]


def _check(digest: str, announced: WeightVersion, what: object) -> None:
    if digest != announced.sha256:
        raise SnapshotError(f"sha256 mismatch for {what}: got {digest}, announced {announced.sha256}")


def _verify_local(path: Path, announced: WeightVersion) -> None:
    if not path.is_dir():
        raise SnapshotError(f"snapshot directory {path} does not exist")
    _check(snapshot_digest(path), announced, path)


def _cached(dest: Path, announced: WeightVersion) -> bool:
    return dest.is_dir() and snapshot_digest(dest) == announced.sha256


def _fresh_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _open_target(partial: Path, name: str) -> BinaryIO:
    """Open `partial/name` for writing, refusing names that escape `partial`."""
    target = (partial / name).resolve()
    if partial.resolve() not in target.parents:
        raise SnapshotError(f"refusing file name outside the snapshot: {name!r}")
    target.parent.mkdir(parents=True, exist_ok=True)
    return target.open("wb")


def _download(base: str, partial: Path, timeout_s: float, headers: dict[str, str], stop: threading.Event) -> str:
    """Download every listed file of the snapshot at `base` into `partial`, hashing each chunk as it is
    written; returns the digest (blocking: run it in a thread). Raises `SnapshotError`."""
    import httpx

    digest = DigestBuilder()
    try:
        with httpx.Client(timeout=timeout_s, headers=headers) as client:
            resp = client.get(f"{base}/files")
            resp.raise_for_status()
            for name in _listing(resp.json(), base):
                with _open_target(partial, name) as f, client.stream("GET", f"{base}/files/{name}") as r:
                    r.raise_for_status()
                    digest.begin(name)
                    for chunk in r.iter_bytes():
                        if stop.is_set():
                            raise SnapshotError(f"download of {base} cancelled")
                        f.write(chunk)
                        digest.update(chunk)
                    digest.end()
    except (httpx.HTTPError, ValueError) as exc:
        raise SnapshotError(f"cannot download snapshot {base}: {exc}") from exc
    return digest.hexdigest()


def _listing(names: object, base: str) -> list[str]:
    """The served names in digest order; a listing that is not a list of distinct names is refused."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SnapshotError(f"{base}/files did not return a list of file names")
    if len(set(names)) != len(names):
        raise SnapshotError(f"{base}/files lists a file name twice")
    return sorted(names)


def _promote(partial: Path, dest: Path) -> Path:
    """Rename the verified `partial` to `dest`, never over it: a `dest` already there was promoted by
    another worker sharing the directory after verifying the same digest (its name holds it), and is
    used as it is."""
    try:
        partial.rename(dest)
    except OSError:
        if not dest.is_dir():
            raise
        shutil.rmtree(partial, ignore_errors=True)
    return dest


def _pin_local(path: Path, announced: WeightVersion, dest_root: Path) -> Path:
    """Hard-link the snapshot at `path` into a private directory, verify those links and return them: the
    files verified are the files then loaded, whatever the publisher renames meanwhile (it writes new
    files and never rewrites one in place). Where links cannot be made (another filesystem), the
    snapshot is verified in place and `path` returned."""
    if not path.is_dir():
        raise SnapshotError(f"snapshot directory {path} does not exist")
    dest = dest_root / _dest_name(announced)
    if _cached(dest, announced):
        return dest
    tmp = dest_root / f".pin-{_dest_name(announced)}-{uuid.uuid4().hex[:12]}"
    try:
        tmp.mkdir(parents=True)
        for f in snapshot_files(path):
            target = tmp / f.relative_to(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(f, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        _verify_local(path, announced)
        return path
    try:
        _check(snapshot_digest(tmp), announced, path)
    except SnapshotError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _promote(tmp, dest)


_COPY_NAME = re.compile(r"^v(\d{8})-[0-9a-f]{16}$")


def prune_copies(dest_root: str | Path, loaded_version: int) -> list[Path]:
    """Delete the local copies (`v{version}-{digest}` directories) in `dest_root` older than
    `loaded_version`, once the engine runs it (blocking: run it in a thread); returns what went. Pinned
    local snapshots are hard links: kept, they would hold every version's bytes on disk after the
    publisher pruned its own. Newer copies (another worker sharing the directory, ahead) and anything not
    named like a copy are left alone."""
    root = Path(dest_root)
    if not root.is_dir():
        return []
    gone = []
    for child in root.iterdir():
        m = _COPY_NAME.match(child.name)
        if m and child.is_dir() and int(m.group(1)) < loaded_version:
            shutil.rmtree(child, ignore_errors=True)
            gone.append(child)
    return gone


def _dest_name(announced: WeightVersion) -> str:
    """A local copy's directory: the version and the digest's first 16 hex digits (a version written
    again with other bytes gets another directory)."""
    return f"v{announced.version:08d}-{announced.sha256[:16]}"


async def fetch_snapshot(announced: WeightVersion, dest_root: str | Path, *, timeout_s: float = 300.0,
                         token: str | None = None) -> Path:
    """Make the announced snapshot available locally and verify its sha256; the path returned holds the
    bytes verified.

    A local `uri` (a path or `file://` URL) is hard-linked into `dest_root/v{version}-{digest}` and those
    links verified (`_pin_local`). An `http(s)://` uri is downloaded into that directory: files are first
    written under a dot-directory of a unique name (workers sharing `dest_root` never write or load one
    another's partial files), every byte hashed as it is written, so the digest is checked when the last
    file ends without reading the download back, then renamed into place. Raises `SnapshotError` on any
    mismatch or failure. All disk work runs in a thread; the caller's event loop is never blocked by it.
    """
    uri = announced.uri
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    if not uri.startswith(("http://", "https://")):
        return await asyncio.to_thread(_pin_local, Path(uri), announced, Path(dest_root))

    from searchr1.core.auth import http_headers

    dest = Path(dest_root) / _dest_name(announced)
    if await asyncio.to_thread(_cached, dest, announced):
        return dest
    partial = Path(dest_root) / f".partial-{_dest_name(announced)}-{uuid.uuid4().hex[:12]}"
    await asyncio.to_thread(_fresh_dir, partial)
    base = uri.rstrip("/")
    stop = threading.Event()
    try:
        digest = await asyncio.to_thread(_download, base, partial, timeout_s, http_headers(token), stop)
        _check(digest, announced, base)
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, partial, True)
        raise
    finally:
        stop.set()  # a cancelled fetch stops its download thread at the next chunk
    return await asyncio.to_thread(_promote, partial, dest)
