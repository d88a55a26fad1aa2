"""The recovery snapshot of the `broadcast` weight transport (docs/architecture.md, "Weight sync"): besides
the latest announcement (`announce.py`, whose URI names the process group), the learner records
the latest *snapshot* it wrote under `searchr1:{run}:weights:snapshot`, so a rollout worker that missed a
broadcast (it died, joined late, or timed out) catches up from it, and acknowledgements of the versions
each worker loaded under `searchr1:{run}:weights:acks` (worker id → `version digest`). The snapshot record
carries the writer's fencing token (`…:weights:snapshot:fence`), so a worker refuses a stale learner's,
and is written by one Lua script that refuses a writer whose token is older than the stored one or, given
the writer's lease, one that the lease fences off in Redis (`searchr1.streams.FENCE_CHECK`: a newer
token was handed out, even with the lease key itself lost).
"""

from __future__ import annotations

from redis import asyncio as aioredis

from searchr1.core.schemas import WeightVersion, encode
from searchr1.streams import FENCE_CHECK, Lease, StreamKeys
from searchr1.weightsync.announce import FencedOff, read_version

_RECORD = FENCE_CHECK + """
if tonumber(ARGV[2]) < tonumber(redis.call('GET', KEYS[2]) or '0') then return -1 end
if ARGV[4] == '1' and fenced_off(KEYS[3], KEYS[4], ARGV[2], ARGV[3]) then return -1 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""
"""Record ARGV[1] with token ARGV[2], unless a newer token recorded one already or (ARGV[4] '1') the
lease KEYS[3..4] fences ARGV[2] off."""


def _snapshot_key(keys: StreamKeys) -> str:
    return keys.key("weights:snapshot")


def _fence_key(keys: StreamKeys) -> str:
    return keys.key("weights:snapshot:fence")


def _acks_key(keys: StreamKeys) -> str:
    return keys.key("weights:acks")


async def record_snapshot(redis: aioredis.Redis, keys: StreamKeys, version: WeightVersion, *, fence: int = 0,
                          lease: Lease | None = None) -> None:
    """Record `version` (a snapshot directory or URL) as the one to catch up from, with the writer's
    fencing token `fence` (the lease's token when `lease` is given); never goes backwards. Raises
    `FencedOff` (`LeaseLost` with a lease) when a newer token recorded one, or the lease fences it off."""
    current = await latest_snapshot(redis, keys)
    if current is not None and current.version > version.version:
        return
    token = lease.token if lease is not None else int(fence)
    lease_keys = lease.fence_keys() if lease is not None else ["", ""]
    value = lease.value if lease is not None else ""
    done = await redis.eval(_RECORD, 4, _snapshot_key(keys), _fence_key(keys), *lease_keys,
                            encode(version), token, value, "1" if lease is not None else "0")
    if int(done) < 0:
        what = f"recovery snapshot record of version {version.version} with fencing token {token}"
        if lease is not None:
            raise lease.fenced_error(what)
        raise FencedOff(f"{what}: a newer token recorded one: another learner holds the run")


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
