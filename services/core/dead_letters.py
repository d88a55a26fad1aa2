"""The run's dead stream, read back: each entry a stream refused (malformed, or delivered `max_deliveries`
times without an ack, or refused by its consumer) with the reason (`searchr1.core.streams` buries them).
"""

from __future__ import annotations

from dataclasses import dataclass

from redis import asyncio as aioredis


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
