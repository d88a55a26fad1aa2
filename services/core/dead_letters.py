"""The run's dead stream, read back: each entry a stream refused (malformed, or delivered `max_deliveries`
times without an ack, or refused by its consumer) with the reason (`searchr1.core.streams` buries them).

`redrive` puts dead letters back on the stream they came from (a new entry with the same payload, the
dead letter deleted in the same transaction), selected by source stream and a substring of the reason:
after a fix, or a rolling upgrade that refused entries an older or newer version wrote, the work is
done instead of stranded. Entries without a payload (it was never readable, or it was over
`DEAD_PAYLOAD_MAX_BYTES`) stay where they are.

Each dead letter is bounded in bytes (`dead_record`), and the stream in entries (`dead_maxlen` in
`searchr1.core.streams`), so the dead stream holds at most about `dead_maxlen` × (64 KiB + 2 KB).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from redis import asyncio as aioredis

DEAD_PAYLOAD_MAX_BYTES = 64 * 1024
"""A dead letter keeps its payload up to this size; a larger one keeps its size and sha256 in the reason
instead (it cannot be redriven: the payload that killed its consumer is in the sender's log or archive)."""
DEAD_REASON_MAX_CHARS = 2000
"""Reasons are cut to this length."""


def dead_record(source: str, source_id: str, reason: str, payload: bytes) -> dict[bytes, bytes | str]:
    """The dead-stream entry of a refused entry, bounded in bytes: at most `DEAD_PAYLOAD_MAX_BYTES` of
    payload and `DEAD_REASON_MAX_CHARS` of reason, so `dead_maxlen` entries bound the dead stream."""
    reason = reason[:DEAD_REASON_MAX_CHARS]
    if len(payload) > DEAD_PAYLOAD_MAX_BYTES:
        reason = (f"{reason} [payload of {len(payload)} bytes not kept, sha256 "
                  f"{hashlib.sha256(payload).hexdigest()}]")
        payload = b""
    return {b"source": source, b"source_id": source_id, b"reason": reason, b"payload": payload,
            b"at": repr(time.time())}


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An entry moved to the dead stream."""

    id: str
    source: str
    source_id: str
    reason: str
    payload: bytes


def _sid(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


async def read_dead(redis: aioredis.Redis, dead_key: str, count: int = 100) -> list[DeadLetter]:
    """The oldest `count` dead letters (for tests, the CLI and operators)."""
    rows = await redis.xrange(dead_key, min="-", max="+", count=count)
    return [
        DeadLetter(
            id=_sid(rid),
            source=_sid(f[b"source"]),
            source_id=_sid(f[b"source_id"]),
            reason=_sid(f[b"reason"]),
            payload=f[b"payload"],
        )
        for rid, f in rows
    ]


async def redrive(redis: aioredis.Redis, dead_key: str, *, source: str | None = None, reason_contains: str = "",
                  count: int = 100, dry_run: bool = False) -> list[DeadLetter]:
    """Requeue up to `count` of the oldest dead letters whose source stream is `source` (any when None)
    and whose reason contains `reason_contains`; returns those requeued (or that would be, `dry_run`)."""
    picked: list[DeadLetter] = []
    start = "-"
    while len(picked) < count:
        rows = await redis.xrange(dead_key, min=start, max="+", count=500)
        for rid, f in rows:
            d = DeadLetter(id=_sid(rid), source=_sid(f[b"source"]), source_id=_sid(f[b"source_id"]),
                           reason=_sid(f[b"reason"]), payload=f[b"payload"])
            if d.payload and (source is None or d.source == source) and reason_contains in d.reason:
                picked.append(d)
                if len(picked) == count:
                    break
        if len(rows) < 500:
            break
        start = "(" + _sid(rows[-1][0])
    if dry_run:
        return picked
    for d in picked:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.xadd(d.source, {b"m": d.payload})
            pipe.xdel(dead_key, d.id)
            await pipe.execute()
    return picked
