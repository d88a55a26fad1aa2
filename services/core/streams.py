"""A small typed layer over Redis Streams with consumer groups, on redis-py's asyncio client (the streams
and their groups: docs/architecture.md, "Streams").

`TypedStream[T]` publishes and reads one pydantic wire model per entry (field `m`, versioned msgpack):

- `publish(item)` → XADD (optionally MAXLEN-trimmed);
- `read(consumer, count, block_ms)` → XREADGROUP of new entries; a malformed entry is moved to the
  dead stream with its reason and acked, never returned and never crashing the reader;
- `ack(*ids)` → XACK (the caller acks only after the work the entry stands for is safe);
- `dead_letter(id, reason)` → a valid entry the consumer refuses goes to the dead stream, acked;
- `reclaim(consumer, count)` → entries pending longer than the visibility timeout are claimed by this
  consumer (XPENDING to see delivery counts, then XCLAIM); past `max_deliveries` they go to the dead
  stream instead with the reason. XAUTOCLAIM would claim in one call but does not report delivery
  counts, which the dead-letter rule needs;
- `length()`, `pending()` and `lag()` for backpressure and metrics;
- `reread_own(consumer, held, count)` → after Redis came back, the entries still pending for `consumer`
  (XREADGROUP from id 0) that the caller does not hold: a read whose reply was lost to the outage left
  them delivered but never seen.

Redis going away: with a `RedisLink` (`searchr1.core.redis_link`), every command waits for Redis to come back (the retry policy of
`searchr1.core.retry`, no bound on the attempts, backoff capped, each retry logged and counted) and the
link reports whether Redis is up, for the service's readiness. Each Redis command is retried on its own,
so no entry a read delivered is dropped by retrying the read around it; acks are idempotent; a publish
whose reply was lost may be applied twice (the learner trains a task id once: a duplicate group is a
replay, a duplicate task a duplicate group). Without a link, errors reach the caller as before.

Keys live under `searchr1:{run}:` (`StreamKeys`). The run's two streams are built only by
`tasks_stream` (Task entries, read by the rollout workers' group `TASKS_GROUP`) and
`trajectories_stream` (TrajectoryGroup entries, read by the learner's group `TRAJECTORIES_GROUP`), so
every service and tool agrees on key, model and group. What this module does not do: decide when to ack or
how many entries to keep in flight; that is each service's loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from redis import asyncio as aioredis
from redis.exceptions import ResponseError

from searchr1.core.redis_link import RedisLink
from searchr1.core.schemas import SchemaError, Task, TrajectoryGroup, decode, encode

T = TypeVar("T", bound=BaseModel)
R = TypeVar("R")

log = logging.getLogger("searchr1.core.streams")

PAYLOAD_FIELD = b"m"

TASKS_GROUP = "rollout"
"""Consumer group of the tasks stream: the rollout workers (the learner's dispatcher only publishes)."""
TRAJECTORIES_GROUP = "learner"
"""Consumer group of the trajectories stream: the learner (rank 0)."""


@dataclass(frozen=True, slots=True)
class StreamKeys:
    """Redis key names of one run."""

    run: str = "default"

    def key(self, name: str) -> str:
        return f"searchr1:{self.run}:{name}"

    @property
    def tasks(self) -> str:
        return self.key("tasks")

    @property
    def trajectories(self) -> str:
        return self.key("trajectories")

    @property
    def dead(self) -> str:
        return self.key("dead")

    @property
    def weights(self) -> str:
        """Hash `latest` {version, uri, sha256, created_at}."""
        return self.key("weights")

    @property
    def weights_channel(self) -> str:
        """Pub/sub channel announcing each new weight version."""
        return self.key("weights:notify")


@dataclass(frozen=True, slots=True)
class Entry(Generic[T]):
    """One stream entry: its id, the decoded value and how often it has been delivered."""

    id: str
    value: T
    deliveries: int = 1


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An entry moved to the dead stream."""

    id: str
    source: str
    source_id: str
    reason: str
    payload: bytes


def connect(url: str) -> aioredis.Redis:
    """An asyncio Redis client (bytes responses)."""
    return aioredis.Redis.from_url(url, decode_responses=False)


def _sid(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


async def _direct(fn: Callable[[], Awaitable[R]], what: str = "") -> R:
    return await fn()


class TypedStream(Generic[T]):
    """A stream of `model` entries consumed by one consumer group."""

    def __init__(
        self,
        redis: aioredis.Redis,
        key: str,
        model: type[T],
        group: str,
        *,
        dead_key: str,
        visibility_timeout_ms: int = 60_000,
        max_deliveries: int = 3,
        maxlen: int | None = None,
        link: RedisLink | None = None,
    ) -> None:
        if visibility_timeout_ms <= 0 or max_deliveries <= 0:
            raise ValueError("visibility_timeout_ms and max_deliveries must be positive")
        self.redis = redis
        self.key = key
        self.model = model
        self.group = group
        self.dead_key = dead_key
        self.visibility_timeout_ms = visibility_timeout_ms
        self.max_deliveries = max_deliveries
        self.maxlen = maxlen
        self.link = link
        self._call = link.call if link is not None else _direct
        self._reread_at = 0  # the link's reconnect count when this stream last re-read its own entries

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
        kwargs: dict[str, Any] = {}
        if self.maxlen is not None:
            kwargs = {"maxlen": self.maxlen, "approximate": True}
        fields = {PAYLOAD_FIELD: encode(item)}
        return _sid(await self._call(lambda: self.redis.xadd(self.key, fields, **kwargs), "xadd"))

    async def publish_many(self, items: Sequence[T]) -> list[str]:
        """Append several entries in one round trip."""
        payloads = [encode(item) for item in items]

        async def send() -> list[str]:
            async with self.redis.pipeline(transaction=False) as pipe:
                for payload in payloads:
                    pipe.xadd(self.key, {PAYLOAD_FIELD: payload})
                return [_sid(r) for r in await pipe.execute()]

        return await self._call(send, "xadd")

    async def read(self, consumer: str, count: int = 1, block_ms: int | None = None) -> list[Entry[T]]:
        """Read up to `count` new entries for `consumer`. Blocks up to `block_ms` when given.
        Malformed entries are dead-lettered and acked here; only valid ones are returned."""
        resp = await self._call(lambda: self.redis.xreadgroup(self.group, consumer, {self.key: ">"}, count=count,
                                                              block=block_ms), "xreadgroup")
        out: list[Entry[T]] = []
        for _key, entries in resp or []:
            for raw_id, fields in entries:
                entry = await self._decode_or_bury(_sid(raw_id), fields, deliveries=1)
                if entry is not None:
                    out.append(entry)
        return out

    async def ack(self, *ids: str) -> int:
        """Acknowledge processed entries; returns how many were pending."""
        if not ids:
            return 0
        return int(await self._call(lambda: self.redis.xack(self.key, self.group, *ids), "xack"))

    def reread_own_next(self) -> None:
        """Make the next `reread_own` run even if Redis never went away: a consumer restarted under its
        old name (the learner, whose lease makes it the only one) takes its pending entries back at once
        instead of after the visibility timeout."""
        self._reread_at = -1

    async def reread_own(self, consumer: str, held: Collection[str], count: int = 16) -> list[Entry[T]]:
        """Once after each time the link saw Redis come back: the entries pending for `consumer` that it
        does not hold (`held`: ids read and not yet acked), oldest first, at most `count`. Otherwise []."""
        if self.link is None or self.link.reconnects == self._reread_at:
            return []
        resp = await self._call(lambda: self.redis.xreadgroup(self.group, consumer, {self.key: "0"},
                                                              count=count + len(held)), "xreadgroup 0")
        out: list[Entry[T]] = []
        for _key, entries in resp or []:
            for raw_id, fields in entries:
                mid = _sid(raw_id)
                if mid in held:
                    continue
                if not fields:  # trimmed away while pending: nothing left to do
                    await self.ack(mid)
                    continue
                if len(out) == count:
                    return out  # more left: look again on the next call
                entry = await self._decode_or_bury(mid, fields, deliveries=1)
                if entry is not None:
                    out.append(entry)
        self._reread_at = self.link.reconnects
        if out:
            log.warning("%s: re-read %d entries still pending for %s after redis came back", self.key,
                        len(out), consumer)
        return out

    async def reclaim(self, consumer: str, count: int = 16) -> list[Entry[T]]:
        """Claim entries idle past the visibility timeout for `consumer`; bury those delivered
        `max_deliveries` times already. Returns the claimed, valid entries."""
        pending = await self._call(lambda: self.redis.xpending_range(
            self.key, self.group, min="-", max="+", count=count, idle=self.visibility_timeout_ms), "xpending")
        if not pending:
            return []
        to_claim: list[str] = []
        for p in pending:
            mid = _sid(p["message_id"])
            if int(p["times_delivered"]) >= self.max_deliveries:
                await self._bury_by_id(mid, f"delivered {p['times_delivered']} times without ack "
                                            f"(max_deliveries={self.max_deliveries})")
            else:
                to_claim.append(mid)
        if not to_claim:
            return []
        delivered = {_sid(p["message_id"]): int(p["times_delivered"]) for p in pending}
        claimed = await self._call(lambda: self.redis.xclaim(
            self.key, self.group, consumer, min_idle_time=self.visibility_timeout_ms, message_ids=to_claim),
            "xclaim")
        out: list[Entry[T]] = []
        for raw_id, fields in claimed:
            if fields is None:  # deleted while pending
                await self.ack(_sid(raw_id))
                continue
            mid = _sid(raw_id)
            entry = await self._decode_or_bury(mid, fields, deliveries=delivered.get(mid, 0) + 1)
            if entry is not None:
                out.append(entry)
        return out

    async def dead_letter(self, entry_id: str, reason: str) -> None:
        """Move a delivered entry the consumer will not process to the dead stream with `reason`, and
        ack it (the same record a malformed entry gets)."""
        await self._bury_by_id(entry_id, reason)

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
            if _sid(g["name"]) == self.group:
                lag = g.get("lag")
                if lag is not None:
                    return int(lag)
                after = f"({_sid(g['last-delivered-id'])}"
                return len(await self._call(lambda a=after: self.redis.xrange(self.key, min=a, max="+"), "xrange"))
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

    async def _bury_by_id(self, mid: str, reason: str) -> None:
        rows = await self._call(lambda: self.redis.xrange(self.key, min=mid, max=mid), "xrange")
        payload = rows[0][1].get(PAYLOAD_FIELD, b"") if rows else b""
        await self._bury(mid, payload, reason)

    async def _bury(self, mid: str, payload: bytes, reason: str) -> None:
        record = {b"source": self.key, b"source_id": mid, b"reason": reason, b"payload": payload,
                  b"at": repr(time.time())}

        async def send() -> None:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xadd(self.dead_key, record)
                pipe.xack(self.key, self.group, mid)
                await pipe.execute()

        await self._call(send, "bury")


def tasks_stream(redis: aioredis.Redis, keys: StreamKeys, *, visibility_timeout_ms: int = 60_000,
                 max_deliveries: int = 3, link: RedisLink | None = None) -> TypedStream[Task]:
    """The run's tasks stream (dispatcher → rollout workers), consumed by `TASKS_GROUP`."""
    return TypedStream(redis, keys.tasks, Task, TASKS_GROUP, dead_key=keys.dead,
                       visibility_timeout_ms=visibility_timeout_ms, max_deliveries=max_deliveries, link=link)


def trajectories_stream(redis: aioredis.Redis, keys: StreamKeys, *, visibility_timeout_ms: int = 60_000,
                        max_deliveries: int = 3, maxlen: int | None = None,
                        link: RedisLink | None = None) -> TypedStream[TrajectoryGroup]:
    """The run's trajectories stream (rollout workers → learner), consumed by `TRAJECTORIES_GROUP`;
    `maxlen` trims it approximately on publish."""
    return TypedStream(redis, keys.trajectories, TrajectoryGroup, TRAJECTORIES_GROUP, dead_key=keys.dead,
                       visibility_timeout_ms=visibility_timeout_ms, max_deliveries=max_deliveries, maxlen=maxlen,
                       link=link)


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
