"""Weight-version announcements shared by the learner (writer) and rollout workers (readers)
(docs/architecture.md, "Weight sync"): a Redis hash `searchr1:{run}:weights` holding the latest `WeightVersion`
(the workers poll it), and `fetch_snapshot`, which makes an announced snapshot available to a worker.

It does not write or load tensors (that is the learner's publisher and the rollout's loader). The snapshot
digest (the sha256 of a snapshot's manifest of per-chunk BLAKE3 digests) is `core/snapshot_manifest.py`'s,
making an announced snapshot available to a worker is `core/snapshot_fetch.py`'s, and reading it verified
for loading is `core/snapshot_read.py`'s; their public names are re-exported here.
"""

from __future__ import annotations

import time

from redis import asyncio as aioredis

from searchr1.core.schemas import SchemaError, WeightVersion, decode, encode
from searchr1.core.snapshot_fetch import fetch_snapshot, prune_copies, snapshot_listing
from searchr1.core.snapshot_manifest import SnapshotError, snapshot_digest, snapshot_files
from searchr1.core.streams import StreamKeys

__all__ = [
    "FencedOff", "SnapshotError", "announce", "announced_fence", "fetch_snapshot", "is_published", "latest",
    "latest_fenced", "prune_copies", "published", "published_key", "read_version", "rollback",
    "snapshot_digest", "snapshot_files", "snapshot_listing",
]


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
