"""The recovery snapshot of the `broadcast` weight transport (docs/architecture.md, "Weight sync"): besides
the latest announcement (`searchr1.core.weights`, whose URI names the process group), the learner records
the latest *snapshot* it wrote under `searchr1:{run}:weights:snapshot`, so a rollout worker that missed a
broadcast (it died, joined late, or timed out) catches up from it, and acknowledgements of the versions
each worker loaded under `searchr1:{run}:weights:acks` (worker id → `version digest`). The snapshot record
carries the writer's fencing token (`…:weights:snapshot:fence`), so a worker refuses a stale learner's.
"""

from __future__ import annotations

from redis import asyncio as aioredis

from searchr1.core.schemas import WeightVersion, encode
from searchr1.core.streams import StreamKeys
from searchr1.core.weights import read_version


def _snapshot_key(keys: StreamKeys) -> str:
    return keys.key("weights:snapshot")


def _fence_key(keys: StreamKeys) -> str:
    return keys.key("weights:snapshot:fence")


def _acks_key(keys: StreamKeys) -> str:
    return keys.key("weights:acks")


async def record_snapshot(redis: aioredis.Redis, keys: StreamKeys, version: WeightVersion, *, fence: int = 0) -> None:
    """Record `version` (a snapshot directory or URL) as the one to catch up from, with the writer's
    fencing token `fence`; never goes backwards."""
    current = await latest_snapshot(redis, keys)
    if current is None or current.version <= version.version:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.set(_snapshot_key(keys), encode(version))
            pipe.set(_fence_key(keys), int(fence))
            await pipe.execute()


async def latest_snapshot(redis: aioredis.Redis, keys: StreamKeys) -> WeightVersion | None:
    """The snapshot to catch up from, or None."""
    return (await latest_snapshot_fenced(redis, keys))[0]


async def latest_snapshot_fenced(redis: aioredis.Redis, keys: StreamKeys) -> tuple[WeightVersion | None, int]:
    """The snapshot to catch up from (or None) and the fencing token it was recorded with (0: none)."""
    raw, fence = await redis.mget(_snapshot_key(keys), _fence_key(keys))
    return read_version(raw), int(fence) if fence is not None else 0


async def acknowledge(redis: aioredis.Redis, keys: StreamKeys, worker: str, version: int, digest: str) -> None:
    """A worker's record of the version it runs and the digest of what it received."""
    await redis.hset(_acks_key(keys), worker, f"{version} {digest}")


async def acknowledgements(redis: aioredis.Redis, keys: StreamKeys) -> dict[str, tuple[int, str]]:
    raw = await redis.hgetall(_acks_key(keys))
    out = {}
    for k, v in raw.items():
        version, _, digest = (v.decode() if isinstance(v, bytes) else v).partition(" ")
        out[k.decode() if isinstance(k, bytes) else k] = (int(version), digest)
    return out
