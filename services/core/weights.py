"""Weight-version announcements shared by the learner (writer) and rollout workers (readers)
(docs/architecture.md, "Weight sync"): a Redis hash `searchr1:{run}:weights` holding the latest `WeightVersion` and a pub/sub
notice per publication, plus the snapshot digest both sides compute the same way.

It does not write or load tensors (that is the learner's publisher and the rollout's loader).

`snapshot_digest` and the other filesystem helpers are synchronous; `fetch_snapshot` is async and runs
every piece of disk work (hashing gigabytes, `rmtree`, file writes, renames) in a worker thread, so the
event loop of a rollout worker keeps serving while a snapshot is verified or downloaded.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
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


def snapshot_digest(directory: str | Path) -> str:
    """sha256 over each file's relative path and bytes, in sorted order: equal digests mean equal
    snapshots, whatever directory they were copied to."""
    root = Path(directory)
    h = hashlib.sha256()
    for path in snapshot_files(root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


async def announce(redis: aioredis.Redis, keys: StreamKeys, version: WeightVersion) -> None:
    """Record `version` as the latest and notify subscribers. Versions never go backwards: an older
    announcement than the one stored is ignored (a restarted learner resumes from its checkpoint)."""
    current = await latest(redis, keys)
    if current is not None and current.version > version.version:
        return
    payload = encode(version)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(keys.weights, mapping={b"latest": payload, b"version": str(version.version)})
        pipe.publish(keys.weights_channel, payload)
        await pipe.execute()


async def latest(redis: aioredis.Redis, keys: StreamKeys) -> WeightVersion | None:
    """The latest announced version, or None if none was announced (or the record is unreadable)."""
    raw = await redis.hget(keys.weights, b"latest")
    if raw is None:
        return None
    try:
        return decode(WeightVersion, raw)
    except SchemaError:
        return None


class SnapshotError(RuntimeError):
    """A snapshot that cannot be fetched or whose digest does not match its announcement."""


def snapshot_listing(directory: str | Path) -> list[str]:
    """Relative file names of a snapshot, as served by `GET {uri}/files` (the HTTP snapshot protocol:
    `GET {uri}/files` → JSON list of names, `GET {uri}/files/{name}` → the file's bytes)."""
    root = Path(directory)
    return [p.relative_to(root).as_posix() for p in snapshot_files(root)]


def _verify(path: Path, announced: WeightVersion, what: object) -> None:
    """Raise `SnapshotError` unless `path`'s digest is the announced one (blocking: run in a thread)."""
    digest = snapshot_digest(path)
    if digest != announced.sha256:
        raise SnapshotError(f"sha256 mismatch for {what}: got {digest}, announced {announced.sha256}")


def _verify_local(path: Path, announced: WeightVersion) -> None:
    if not path.is_dir():
        raise SnapshotError(f"snapshot directory {path} does not exist")
    _verify(path, announced, path)


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


def _promote(partial: Path, dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)


async def fetch_snapshot(announced: WeightVersion, dest_root: str | Path, *, timeout_s: float = 300.0,
                         token: str | None = None) -> Path:
    """Make the announced snapshot available locally and verify its sha256.

    A local `uri` (a path or `file://` URL) is verified in place and returned. An `http(s)://` uri is
    downloaded into `dest_root/v{version}` (files first written under a dot-name, so a half-finished
    download never verifies) and verified there. Raises `SnapshotError` on any mismatch or failure.
    All disk work runs in a thread; the caller's event loop is never blocked by it.
    """
    uri = announced.uri
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    if not uri.startswith(("http://", "https://")):
        path = Path(uri)
        await asyncio.to_thread(_verify_local, path, announced)
        return path

    import httpx

    from searchr1.core.auth import http_headers

    dest = Path(dest_root) / f"v{announced.version:08d}"
    if await asyncio.to_thread(_cached, dest, announced):
        return dest
    partial = Path(dest_root) / f".partial-v{announced.version:08d}"
    await asyncio.to_thread(_fresh_dir, partial)
    base = uri.rstrip("/")
    try:
        async with httpx.AsyncClient(timeout=timeout_s, headers=http_headers(token)) as client:
            resp = await client.get(f"{base}/files")
            resp.raise_for_status()
            names = resp.json()
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise SnapshotError(f"{base}/files did not return a list of file names")
            for name in names:
                f = await asyncio.to_thread(_open_target, partial, name)
                try:
                    async with client.stream("GET", f"{base}/files/{name}") as r:
                        r.raise_for_status()
                        async for chunk in r.aiter_bytes(_CHUNK):
                            await asyncio.to_thread(f.write, chunk)
                finally:
                    await asyncio.to_thread(f.close)
    except httpx.HTTPError as exc:
        await asyncio.to_thread(shutil.rmtree, partial, True)
        raise SnapshotError(f"cannot download snapshot {base}: {exc}") from exc
    try:
        await asyncio.to_thread(_verify, partial, announced, base)
    except SnapshotError:
        await asyncio.to_thread(shutil.rmtree, partial, True)
        raise
    await asyncio.to_thread(_promote, partial, dest)
    return dest
