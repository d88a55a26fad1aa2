"""One stream of the run consumed by one consumer group, as its producer and its consumer first meet it:
publish, read, ack, dead-letter, trim and the counts (`StreamBase[T]`; `searchr1.streams.redelivery.
TypedStream` adds the paths that deliver an entry again). Each entry carries one pydantic wire model
(field `m`, versioned msgpack):

- `publish(item)` → XADD;
- `read(consumer, count, block_ms)` → XREADGROUP of new entries; a malformed entry is moved to the
  dead stream with its reason and acked, never returned and never crashing the reader;
- `ack(*ids)` → XACK (the caller acks only after the work the entry stands for is safe); with a `fence`
  (the learner's lease, `searchr1.streams.lease`), the XACK runs in one Lua script that first checks the
  writer's fencing token against the run's lease in Redis and refuses a stale one (`LeaseLost`); every
  dead letter, which acks too, is fenced the same way (`searchr1.streams.dead_letters.Burial`);
- trimming (`trim_every`): every `trim_every` acks or publishes through this object, the entries every
  consumer group of the stream has acked are deleted (`searchr1.streams.trim`, never a pending or
  unread one); the dead stream is capped at about `dead_maxlen` entries (XADD MAXLEN ~, oldest first);
- `dead_letter(id, reason)` → a valid entry the consumer refuses goes to the dead stream, acked;
- `burials()` → the stream's dead letters read back as they arrive (its producer replaces what its
  consumers buried); `get(id)` → one entry's value;
- `length()`, `pending()`, `lag()` and `in_flight()` for backpressure and metrics.

Redis going away: with a `RedisLink` (`searchr1.streams.link`), every command waits for Redis to come
back (the retry policy of `searchr1.core.retry`, no bound on the attempts, backoff capped, each retry
logged and counted) and the link reports whether Redis is up, for the service's readiness. Each Redis
command is retried on its own, so no entry a read delivered is dropped by retrying the read around it;
acks are idempotent; a publish whose reply was lost may be applied twice (the learner trains a task id
once: a duplicate group is a replay, a duplicate task a duplicate group). Without a link, errors reach the
caller as before.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence, Sized
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel
from redis import asyncio as aioredis
from redis.exceptions import ResponseError

from searchr1.core.schemas import SchemaError, decode, encode
from searchr1.streams.dead_letters import DEAD_MAXLEN, PAYLOAD_FIELD, Burial, Burials
from searchr1.streams.keys import text
from searchr1.streams.lease import Lease
from searchr1.streams.link import RedisLink, direct
from searchr1.streams.scripts import ACK_FENCED
from searchr1.streams.trim import trim_acked

T = TypeVar("T", bound=BaseModel)

log = logging.getLogger("searchr1.streams")


@dataclass(frozen=True, slots=True)
class Entry(Generic[T]):
    """One stream entry: its id, the decoded value and how often it has been delivered."""

    id: str
    value: T
    deliveries: int = 1


class StreamBase(Generic[T]):
    """A stream of `model` entries consumed by one consumer group: publish, read, ack, dead-letter, trim
    and the counts."""

    def __init__(
        self,
        redis: aioredis.Redis,
        key: str,
        model: type[T],
        group: str,
        *,
        dead_key: str,
        visibility_timeout_ms: int | None = None,
        max_deliveries: int | None = None,
        trim_every: int = 0,
        dead_maxlen: int = DEAD_MAXLEN,
        link: RedisLink | None = None,
        fence: Lease | None = None,
    ) -> None:
        if (visibility_timeout_ms is not None and visibility_timeout_ms <= 0) or dead_maxlen <= 0 \
                or (max_deliveries is not None and max_deliveries <= 0):
            raise ValueError("visibility_timeout_ms, max_deliveries and dead_maxlen must be positive")
        if trim_every < 0:
            raise ValueError("trim_every must be >= 0 (0: never trim)")
        self.redis = redis
        self.key = key
        self.model = model
        self.group = group
        self.dead_key = dead_key
        self.visibility_timeout_ms = visibility_timeout_ms
        """How long an entry stays idle before another consumer may reclaim it (the consumer's settings; None
        on an end that only publishes or counts: the re-delivery paths of `redelivery.TypedStream` refuse)."""
        self.max_deliveries = max_deliveries
        """Deliveries after which an unacked entry is dead-lettered (the consumer's settings, as above)."""
        self.trim_every = trim_every
        self.dead_maxlen = dead_maxlen
        self._since_trim = 0
        self.link = link
        self._call = link.call if link is not None else direct
        self._reread_at = -1  # the link's reconnect count at the last `TypedStream.reread_own`
        self.buried = 0
        """Entries this object moved to the dead stream on its own: malformed ones, and ones delivered
        `max_deliveries` times. A consumer that must replace what it lost reads the change (a
        `dead_letter` its caller asked for is not counted)."""
        self.fence = fence
        """The lease whose token every ack is checked against inside Redis (None: acks are not fenced)."""

    async def ensure_group(self) -> None:
        """Create the consumer group (and the stream) if missing; idempotent."""
        try:
            await self._call(lambda: self.redis.xgroup_create(self.key, self.group, id="0", mkstream=True),
                             "xgroup create")
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def publish(self, item: T) -> str:
        """Append one entry; returns its id."""
        if not isinstance(item, self.model):
            raise TypeError(f"{self.key} carries {self.model.__name__}, not {type(item).__name__}")
        fields = {PAYLOAD_FIELD: encode(item)}
        mid = text(await self._call(lambda: self.redis.xadd(self.key, fields), "xadd"))
        await self._count_towards_trim(1)
        return mid

    async def publish_many(self, items: Sequence[T]) -> list[str]:
        """Append several entries in one round trip."""
        payloads = [encode(item) for item in items]

        async def send() -> list[str]:
            async with self.redis.pipeline(transaction=False) as pipe:
                for payload in payloads:
                    pipe.xadd(self.key, {PAYLOAD_FIELD: payload})
                return [text(r) for r in await pipe.execute()]

        ids = await self._call(send, "xadd")
        await self._count_towards_trim(len(ids))
        return ids

    async def read(self, consumer: str, count: int = 1, block_ms: int | None = None) -> list[Entry[T]]:
        """Read up to `count` new entries for `consumer`. Blocks up to `block_ms` when given.
        Malformed entries are dead-lettered and acked here; only valid ones are returned."""
        resp = await self._call(lambda: self.redis.xreadgroup(self.group, consumer, {self.key: ">"}, count=count,
                                                              block=block_ms), "xreadgroup")
        out: list[Entry[T]] = []
        for _key, entries in resp or []:
            for raw_id, fields in entries:
                entry = await self._decode_or_bury(text(raw_id), fields, deliveries=1)
                if entry is not None:
                    out.append(entry)
        return out

    async def ack(self, *ids: str) -> int:
        """Acknowledge processed entries; returns how many were pending."""
        if not ids:
            return 0
        fence = self.fence
        if fence is None:
            acked = int(await self._call(lambda: self.redis.xack(self.key, self.group, *ids), "xack"))
        else:
            acked = int(await self._call(lambda: self.redis.eval(
                ACK_FENCED, 3, self.key, *fence.fence_keys(), self.group, *fence.fence_args(), *ids), "xack"))
            if acked < 0:
                raise fence.fenced_error(f"ack of {len(ids)} entries of {self.key}")
        await self._count_towards_trim(len(ids))
        return acked

    async def trim(self) -> int:
        """Delete the entries every consumer group of the stream has acked; returns how many went."""
        self._since_trim = 0
        return await trim_acked(self.redis, self.key, self._call)

    async def _count_towards_trim(self, n: int) -> None:
        if self.trim_every:
            self._since_trim += n
            if self._since_trim >= self.trim_every:
                await self.trim()

    async def dead_letter(self, entry_id: str, reason: str) -> None:
        """Move a delivered entry the consumer will not process to the dead stream with `reason`, and
        ack it (the same record a malformed entry gets)."""
        await self._burial().bury_by_id(entry_id, reason)

    def burials(self) -> Burials:
        """This stream's dead letters, read back as they arrive (`dead_letters.Burials`): what its
        consumers buried, for its producer to replace."""
        return Burials(self.redis, self._call, self.dead_key, self.key)

    async def get(self, entry_id: str) -> T | None:
        """The value of one entry still in the stream (None: trimmed, deleted or malformed)."""
        rows = await self._call(lambda: self.redis.xrange(self.key, min=entry_id, max=entry_id), "xrange")
        payload = rows[0][1].get(PAYLOAD_FIELD) if rows else None
        if payload is None:
            return None
        try:
            return decode(self.model, payload)
        except SchemaError:
            return None

    async def length(self) -> int:
        """Entries in the stream (acked or not; the stream is trimmed separately)."""
        return int(await self._call(lambda: self.redis.xlen(self.key), "xlen"))

    async def pending(self) -> int:
        """Entries delivered to a consumer and not yet acked."""
        info = await self._call(lambda: self.redis.xpending(self.key, self.group), "xpending")
        return int(info["pending"])

    async def lag(self) -> int:
        """Entries not yet delivered to any consumer of the group (Redis ≥ 7 reports it; on older
        servers this counts entries after the group's last-delivered id)."""
        groups = await self._call(lambda: self.redis.xinfo_groups(self.key), "xinfo groups")
        for g in groups:
            if text(g["name"]) == self.group:
                lag = g.get("lag")
                if lag is not None:
                    return int(lag)
                after = f"({text(g['last-delivered-id'])}"

                def undelivered(a: str = after) -> Awaitable[Sized]:
                    return self.redis.xrange(self.key, min=a, max="+")

                return len(await self._call(undelivered, "xrange"))
        return await self.length()

    async def in_flight(self) -> int:
        """Undelivered plus delivered-but-unacked entries: the dispatcher's backpressure figure."""
        return await self.lag() + await self.pending()

    async def _decode_or_bury(self, mid: str, fields: dict[bytes, bytes], deliveries: int) -> Entry[T] | None:
        payload = fields.get(PAYLOAD_FIELD)
        if payload is None:
            await self._bury(mid, b"", f"entry has no '{PAYLOAD_FIELD.decode()}' field")
            return None
        try:
            value = decode(self.model, payload)
        except SchemaError as exc:
            await self._bury(mid, payload, str(exc)[:2000])
            return None
        return Entry(mid, value, deliveries)

    async def _bury(self, mid: str, payload: bytes, reason: str) -> None:
        await self._burial().bury(mid, payload, reason)
        self.buried += 1

    def _burial(self) -> Burial:
        """The dead-letter writes of this stream (`dead_letters.Burial`), on its current settings."""
        return Burial(self.redis, self._call, self.key, self.group, self.dead_key, self.dead_maxlen, self.fence)
