"""Burying a stream's entry: the writes that move it to the run's dead stream and ack it in one step
(`searchr1.core.streams` calls these; `searchr1.core.dead_letters` reads the dead stream back).

- `bury(mid, payload, reason)`: a malformed entry, or a valid one its consumer refuses, is recorded
  (`dead_letters.dead_record`, bounded in bytes) and acked in one MULTI/EXEC; with a `fence` (the
  learner's lease) a dead letter is an ack and is fenced like one: one Lua script checks the writer's
  token against the run's lease and refuses a stale one (`LeaseLost`);
- `bury_by_id(mid, reason)`: the same, the payload read back from the stream first;
- `bury_if(mid, reason, consumer, min_idle_ms)`: an entry delivered `max_deliveries` times, buried by one
  Lua script only while it is still pending (for `consumer`, '' any) and idle `min_idle_ms`, so a
  consumer that took it back meanwhile keeps it; with a `fence`, the same script checks the token first,
  as `bury` does (the re-delivery paths of a stale learner cannot ack through it).

The dead stream is capped at about `dead_maxlen` entries (XADD MAXLEN ~, oldest first).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from redis import asyncio as aioredis

from searchr1.core import stream_scripts as scripts
from searchr1.core.dead_letters import DEAD_PAYLOAD_MAX_BYTES, dead_record
from searchr1.core.lease import Lease
from searchr1.core.stream_trim import Call

log = logging.getLogger("searchr1.core.streams")

PAYLOAD_FIELD = b"m"
"""The stream entry field holding the encoded wire model."""
DEAD_MAXLEN = 1_000
"""About how many dead letters the dead stream keeps (the oldest go first; the reason of each is also
logged by the process that buried it). Each is at most about 66 KB (`dead_letters.dead_record`), so the
dead stream stays under about 66 MB."""


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
                scripts.BURY_FENCED, 4, self.key, self.dead_key, *fence.fence_keys(), self.group, mid,
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
            scripts.BURY_IF, 2 + len(keys), self.key, self.dead_key, *keys, self.group, mid, consumer, min_idle_ms,
            reason, repr(time.time()), self.dead_maxlen, DEAD_PAYLOAD_MAX_BYTES, *fence_args), "bury")
        if fence is not None and int(done) < 0:
            raise fence.fenced_error(f"dead letter of {mid} of {self.key}")
        if int(done):
            log.warning("%s: dead-lettered %s: %s", self.key, mid, reason)
        return bool(int(done))
