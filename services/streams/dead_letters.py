"""The run's dead stream, both ways: burying a stream's entry (the writes that move it there and ack it
in one step, `Burial`) and reading dead letters back (`read_dead`, `redrive`).

An entry is buried when it is malformed, delivered `max_deliveries` times without an ack, or refused by
its consumer (`searchr1.streams.delivery` and `searchr1.streams.redelivery` call `Burial`):

- `bury(mid, payload, reason)`: the entry is recorded (`dead_record`, bounded in bytes) and acked in one
  MULTI/EXEC; with a `fence` (the learner's lease) a dead letter is an ack and is fenced like one: one
  Lua script checks the writer's token against the run's lease and refuses a stale one (`LeaseLost`);
- `bury_by_id(mid, reason)`: the same, the payload read back from the stream first;
- `bury_if(mid, reason, consumer, min_idle_ms)`: an entry delivered `max_deliveries` times, buried by one
  Lua script only while it is still pending (for `consumer`, '' any) and idle `min_idle_ms`, so a
  consumer that took it back meanwhile keeps it; with a `fence`, the same script checks the token first,
  as `bury` does (the re-delivery paths of a stale learner cannot ack through it).

`Burials` reads one source stream's dead letters back as they arrive (the learner's dispatcher, which must
replace the tasks the rollout workers buried).

`redrive` puts dead letters back on the stream they came from (a new entry with the same payload, the
dead letter deleted in the same transaction), selected by source stream and a substring of the reason:
after a fix, or a rolling upgrade that refused entries an older or newer version wrote, the work is
done instead of stranded. Entries without a payload (it was never readable, or it was over
`DEAD_PAYLOAD_MAX_BYTES`) stay where they are.

Each dead letter is bounded in bytes (`dead_record`) and the stream in entries (about `DEAD_MAXLEN`, XADD
MAXLEN ~, oldest first), so the dead stream holds at most about `dead_maxlen` × (64 KiB + 2 KB).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from redis import asyncio as aioredis

from searchr1.streams.keys import text
from searchr1.streams.lease import Lease
from searchr1.streams.link import Call
from searchr1.streams.scripts import BURY_FENCED, BURY_IF

log = logging.getLogger("searchr1.streams")

PAYLOAD_FIELD = b"m"
"""The stream entry field holding the encoded wire model."""
DEAD_MAXLEN = 1_000
"""About how many dead letters the dead stream keeps (the oldest go first; the reason of each is also
logged by the process that buried it). Each is at most about 66 KB (`dead_record`), so the dead stream
stays under about 66 MB."""
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
class Burial:
    """Where and how one stream's entries are buried: its key and group, the dead stream and its cap,
    the Redis call wrapper (retries while Redis is away) and the fence, if acks are fenced."""

    redis: aioredis.Redis
    call: Call
    key: str
    group: str
    dead_key: str
    dead_maxlen: int
    fence: Lease | None

    async def bury(self, mid: str, payload: bytes, reason: str) -> None:
        """Record `mid` in the dead stream with `reason` and ack it, in one atomic step."""
        record = dead_record(self.key, mid, reason, payload)  # bounded in bytes
        fence = self.fence
        if fence is not None:  # a dead letter is an ack: fenced like one
            flat = [x for kv in record.items() for x in kv]
            done = await self.call(lambda: self.redis.eval(
                BURY_FENCED, 4, self.key, self.dead_key, *fence.fence_keys(), self.group, mid,
                *fence.fence_args(), self.dead_maxlen, *flat), "bury")
            if int(done) < 0:
                raise fence.fenced_error(f"dead letter of {mid} of {self.key}")
            return

        async def send() -> None:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xadd(self.dead_key, record, maxlen=self.dead_maxlen, approximate=True)
                pipe.xack(self.key, self.group, mid)
                await pipe.execute()

        await self.call(send, "bury")

    async def bury_by_id(self, mid: str, reason: str) -> None:
        """`bury` with the payload read back from the stream (empty when the entry is gone)."""
        rows = await self.call(lambda: self.redis.xrange(self.key, min=mid, max=mid), "xrange")
        payload = rows[0][1].get(PAYLOAD_FIELD, b"") if rows else b""
        await self.bury(mid, payload, reason)

    async def bury_if(self, mid: str, reason: str, *, consumer: str, min_idle_ms: int) -> bool:
        """Dead-letter `mid` while it is still pending for `consumer` ('' any) and idle `min_idle_ms`;
        True when it was. With a `fence`, the same script first checks the writer's token (`LeaseLost`)."""
        fence = self.fence
        keys, fence_args = (fence.fence_keys(), fence.fence_args()) if fence is not None else ([], [])
        done = await self.call(lambda: self.redis.eval(
            BURY_IF, 2 + len(keys), self.key, self.dead_key, *keys, self.group, mid, consumer, min_idle_ms,
            reason, repr(time.time()), self.dead_maxlen, DEAD_PAYLOAD_MAX_BYTES, *fence_args), "bury")
        if fence is not None and int(done) < 0:
            raise fence.fenced_error(f"dead letter of {mid} of {self.key}")
        if int(done):
            log.warning("%s: dead-lettered %s: %s", self.key, mid, reason)
        return bool(int(done))


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An entry moved to the dead stream."""

    id: str
    source: str
    source_id: str
    reason: str
    payload: bytes


def _letter(rid: bytes | str, f: dict[bytes, bytes]) -> DeadLetter:
    return DeadLetter(id=text(rid), source=text(f[b"source"]), source_id=text(f[b"source_id"]),
                      reason=text(f[b"reason"]), payload=f[b"payload"])


@dataclass
class Burials:
    """The dead letters of one source stream, read back as they arrive by a process that did not bury them
    (the learner's dispatcher learns which tasks the rollout workers dead-lettered: a step counting on such
    a task would otherwise wait for its group for good). `poll` returns those buried since the last poll,
    the first poll everything the dead stream still holds; the cursor is this object's, in memory (the dead
    stream is bounded, so a new reader reads it whole once)."""

    redis: aioredis.Redis
    call: Call
    dead_key: str
    source: str
    after: str = "0-0"
    """The last dead-stream id read (any source)."""

    async def poll(self, count: int = 100) -> list[DeadLetter]:
        """The dead letters of `source` after `after`, oldest first; moves `after` past every entry read."""
        out: list[DeadLetter] = []
        while True:
            start = f"({self.after}"

            def page(s: str = start) -> Awaitable[Any]:
                return self.redis.xrange(self.dead_key, min=s, max="+", count=count)

            rows = await self.call(page, "xrange dead")
            for rid, f in rows:
                self.after = text(rid)
                d = _letter(rid, f)
                if d.source == self.source:
                    out.append(d)
            if len(rows) < count:
                return out


async def read_dead(redis: aioredis.Redis, dead_key: str, count: int = 100) -> list[DeadLetter]:
    """The oldest `count` dead letters (for tests, the CLI and operators)."""
    rows = await redis.xrange(dead_key, min="-", max="+", count=count)
    return [_letter(rid, f) for rid, f in rows]


async def redrive(redis: aioredis.Redis, dead_key: str, *, source: str | None = None, reason_contains: str = "",
                  count: int = 100, dry_run: bool = False) -> list[DeadLetter]:
    """Requeue up to `count` of the oldest dead letters whose source stream is `source` (any when None)
    and whose reason contains `reason_contains`; returns those requeued (or that would be, `dry_run`)."""
    picked: list[DeadLetter] = []
    start = "-"
    while len(picked) < count:
        rows = await redis.xrange(dead_key, min=start, max="+", count=500)
        for rid, f in rows:
            d = _letter(rid, f)
            if d.payload and (source is None or d.source == source) and reason_contains in d.reason:
                picked.append(d)
                if len(picked) == count:
                    break
        if len(rows) < 500:
            break
        start = "(" + text(rows[-1][0])
    if dry_run:
        return picked
    for d in picked:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.xadd(d.source, {PAYLOAD_FIELD: d.payload})
            pipe.xdel(dead_key, d.id)
            await pipe.execute()
    return picked
