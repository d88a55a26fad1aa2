"""What the learner tells the rollout workers about weights, in Redis (docs/architecture.md, "Weight
sync"): the announcement of the latest `WeightVersion` (the hash `searchr1:{run}:weights`, which the
workers poll), the record of every version it announced (`…:weights:published`, what `rollback` may
re-announce and what a worker checks an announcement against), and a per-worker re-sync request
(`…:resync:{worker}`).

Announcements carry the writer's fencing token (`searchr1.streams.Lease`) and are made by one Lua script
that refuses an older token than the stored one (`FencedOff`) and never goes backwards unless forced (a
rollback). A re-sync request is set when the learner's desync screen found a worker's groups out of sync
with the announced weights (`learner/algo/desync.py`); the worker takes it (read and deleted) before its
next tasks and reloads the announced weights (`loader.WeightLoader.resync`).

It does not write or load tensors: that is the publisher's (`publish.py`) and the loader's (`loader.py`).
"""

from __future__ import annotations

import time

from redis import asyncio as aioredis

from searchr1.core.schemas import SchemaError, WeightVersion, decode, encode
from searchr1.streams import StreamKeys

_ANNOUNCE = """
local fence = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
local version = tonumber(redis.call('HGET', KEYS[1], 'version') or '-1')
if tonumber(ARGV[2]) < fence then return -1 end
if ARGV[4] ~= '1' and tonumber(ARGV[3]) < version then return 0 end
redis.call('HSET', KEYS[1], 'latest', ARGV[1], 'version', ARGV[3], 'fence', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[1])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[3], ARGV[6], ARGV[5]) end
return 1
"""


class FencedOff(RuntimeError):
    """An announcement by a writer whose fencing token is older than the one stored: another learner
    has taken the run over."""


async def announce(redis: aioredis.Redis, keys: StreamKeys, version: WeightVersion, *, fence: int = 0,
                   force: bool = False, full: WeightVersion | None = None) -> bool:
    """Record `version` as the latest, atomically (one Lua script). Versions never
    go backwards: an older announcement than the one stored is ignored (a restarted learner resumes from
    its checkpoint) unless `force` (a rollback). `fence` is the writer's fencing token (`streams.Lease`),
    stored beside the announcement in the hash's `fence` field; a writer with an older token than the
    stored one raises `FencedOff`. Every announcement is also recorded by version in
    `searchr1:{run}:weights:published` (what `rollback` may re-announce), and every full snapshot in
    `…:weights:fulls` (`full`, or `version` itself when it is not a delta): where a worker that cannot
    apply a delta starts. Returns True when announced, False when ignored."""
    if full is None and version.base is None:
        full = version
    if full is not None and full.base is not None:
        raise ValueError("the full record of a version must name a full snapshot")
    done = await redis.eval(_ANNOUNCE, 3, keys.weights, published_key(keys), fulls_key(keys),
                            encode(version), int(fence),
                            int(version.version), "1" if force else "0",
                            encode(full) if full is not None else "", int(full.version) if full is not None else 0)
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


def fulls_key(keys: StreamKeys) -> str:
    """Hash {version: full snapshot record} of every full version the learner announced."""
    return keys.key("weights:fulls")


async def newest_full(redis: aioredis.Redis, keys: StreamKeys, at_most: int) -> WeightVersion | None:
    """The newest full snapshot the learner announced at or before version `at_most`, or None."""
    versions = sorted((int(v) for v in await redis.hkeys(fulls_key(keys)) if int(v) <= at_most), reverse=True)
    for v in versions:
        record = read_version(await redis.hget(fulls_key(keys), str(v)))
        if record is not None and record.base is None:
            return record
    return None


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


RESYNC_TTL_S = 3600
"""How long a re-sync request waits for its worker (a worker gone for good leaves no key behind)."""


def resync_key(keys: StreamKeys, worker_id: str) -> str:
    """The key the learner sets to tell one worker to reload the announced weights (its groups showed a
    train–inference mismatch far beyond its peers': `learner/algo/desync.py`)."""
    return keys.key(f"resync:{worker_id}")


async def request_resync(redis: aioredis.Redis, keys: StreamKeys, worker_id: str, reason: str) -> None:
    """Ask `worker_id` to reload the announced weights before its next task (the reason is kept for the
    worker's log)."""
    await redis.set(resync_key(keys, worker_id), reason.encode(), ex=RESYNC_TTL_S)


async def take_resync(redis: aioredis.Redis, keys: StreamKeys, worker_id: str) -> str | None:
    """The pending re-sync request of `worker_id` (taken: deleted as it is read), or None."""
    raw = await redis.getdel(resync_key(keys, worker_id))
    return None if raw is None else raw.decode(errors="replace")
