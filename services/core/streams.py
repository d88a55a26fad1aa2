"""A small typed layer over Redis Streams with consumer groups, on redis-py's asyncio client (the streams
and their groups: docs/architecture.md, "Streams").

`TypedStream[T]` publishes and reads one pydantic wire model per entry (field `m`, versioned msgpack):

- `publish(item)` → XADD;
- `read(consumer, count, block_ms)` → XREADGROUP of new entries; a malformed entry is moved to the
  dead stream with its reason and acked, never returned and never crashing the reader;
- `ack(*ids)` → XACK (the caller acks only after the work the entry stands for is safe); with a `fence`
  (the learner's lease, `searchr1.core.lease`), the XACK runs in one Lua script that first checks the
  writer's fencing token against the run's lease in Redis and refuses a stale one (`LeaseLost`; a dead
  letter, which acks too, is fenced the same way);
- trimming (`trim_every`): every `trim_every` acks or publishes through this object, the entries every
  consumer group of the stream has acked are deleted (`searchr1.core.stream_trim`, never a pending or
  unread one); the dead stream is capped at about `dead_maxlen` entries (XADD MAXLEN ~, oldest first);
- `dead_letter(id, reason)` → a valid entry the consumer refuses goes to the dead stream, acked (the
  writes that bury an entry: `searchr1.core.stream_bury`);
- `reclaim(consumer, count, held)` → entries pending longer than the visibility timeout are claimed by
  this consumer (XPENDING to see delivery counts, then XCLAIM); past `max_deliveries` they go to the dead
  stream instead with the reason (one Lua script per entry, which buries it only while it is still idle
  past the timeout). Entries this consumer holds (`held`) are left out before anything is counted, so
  a consumer never buries what it is still working on. XAUTOCLAIM would claim in one call but does not
  report delivery counts, which the dead-letter rule needs;
- `length()`, `pending()` and `lag()` for backpressure and metrics;
- `reread_own(consumer, held, count)` → on the first call, and after each time Redis came back, the
  entries still pending for `consumer` that the caller does not hold: a restarted consumer under the
  same name gets its own unfinished entries at once (not after the visibility timeout), and a read whose
  reply was lost to an outage left them delivered but never seen. Each is claimed again (its delivery
  count goes up) by a script that takes only what is still this consumer's; one already delivered
  `max_deliveries` times is dead-lettered instead, so an input that crashes its consumer is not handed
  back to the restarted consumer forever;
- `heartbeat(consumer, ids)` → the entries of `ids` still pending for `consumer` have their idle time
  reset (XCLAIM … JUSTID to itself, delivery count unchanged) by one Lua script that checks each entry's
  owner and claims it in the same atomic step, so a heartbeat never takes back an entry another consumer
  reclaimed: a live consumer heartbeating its entries more often than the visibility timeout never has
  them reclaimed, so the timeout can be short enough to reclaim a dead consumer's entries within seconds.

Every path that delivers an entry again (`reclaim`, `reread_own`) counts its deliveries and buries it
past `max_deliveries`; a plain `read` delivers each entry for the first time.

Redis going away: with a `RedisLink` (`searchr1.core.redis_link`), every command waits for Redis to come back (the retry policy of
`searchr1.core.retry`, no bound on the attempts, backoff capped, each retry logged and counted) and the
link reports whether Redis is up, for the service's readiness. Each Redis command is retried on its own,
so no entry a read delivered is dropped by retrying the read around it; acks are idempotent; a publish
whose reply was lost may be applied twice (the learner trains a task id once: a duplicate group is a
replay, a duplicate task a duplicate group). Without a link, errors reach the caller as before.

Keys live under `searchr1:{run}:` (`StreamKeys`, `searchr1.core.stream_keys`, re-exported here). The
run's two streams are built only by `tasks_stream` (Task entries, group `TASKS_GROUP`) and
`trajectories_stream` (TrajectoryGroup entries, group `TRAJECTORIES_GROUP`), so every service and tool
agrees on key, model and group. What this module does not do: decide when to ack or
how many entries to keep in flight; that is each service's loop.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Sequence, Sized
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel
from redis import asyncio as aioredis
from redis.exceptions import ResponseError

from searchr1.core import stream_scripts as scripts
from searchr1.core.dead_letters import DeadLetter as DeadLetter
from searchr1.core.dead_letters import read_dead as read_dead
from searchr1.core.lease import Lease
from searchr1.core.redis_link import RedisLink
from searchr1.core.redis_link import connect as connect
from searchr1.core.schemas import SchemaError, Task, TrajectoryGroup, decode, encode
from searchr1.core.stream_bury import DEAD_MAXLEN as DEAD_MAXLEN
from searchr1.core.stream_bury import PAYLOAD_FIELD as PAYLOAD_FIELD
from searchr1.core.stream_bury import Burial
from searchr1.core.stream_keys import TASKS_GROUP as TASKS_GROUP
from searchr1.core.stream_keys import TRAJECTORIES_GROUP as TRAJECTORIES_GROUP
from searchr1.core.stream_keys import StreamKeys as StreamKeys
from searchr1.core.stream_trim import parse_id, trim_acked

T = TypeVar("T", bound=BaseModel)
R = TypeVar("R")

log = logging.getLogger("searchr1.core.streams")


@dataclass(frozen=True, slots=True)
class Entry(Generic[T]):
    """One stream entry: its id, the decoded value and how often it has been delivered."""

    id: str
    value: T
    deliveries: int = 1


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
        trim_every: int = 0,
        dead_maxlen: int = DEAD_MAXLEN,
        link: RedisLink | None = None,
        fence: Lease | None = None,
    ) -> None:
        if visibility_timeout_ms <= 0 or max_deliveries <= 0 or dead_maxlen <= 0:
            raise ValueError("visibility_timeout_ms, max_deliveries and dead_maxlen must be positive")
        if trim_every < 0:
            raise ValueError("trim_every must be >= 0 (0: never trim)")
        self.redis = redis
        self.key = key
        self.model = model
        self.group = group
        self.dead_key = dead_key
        self.visibility_timeout_ms = visibility_timeout_ms
        self.max_deliveries = max_deliveries
        self.trim_every = trim_every
        self.dead_maxlen = dead_maxlen
        self._since_trim = 0
        self.link = link
        self._call = link.call if link is not None else _direct
        self._reread_at = -1  # the link's reconnect count when this stream last re-read its own entries
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
        mid = _sid(await self._call(lambda: self.redis.xadd(self.key, fields), "xadd"))
        await self._count_towards_trim(1)
        return mid

    async def publish_many(self, items: Sequence[T]) -> list[str]:
        """Append several entries in one round trip."""
        payloads = [encode(item) for item in items]

        async def send() -> list[str]:
            async with self.redis.pipeline(transaction=False) as pipe:
                for payload in payloads:
                    pipe.xadd(self.key, {PAYLOAD_FIELD: payload})
                return [_sid(r) for r in await pipe.execute()]

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
                entry = await self._decode_or_bury(_sid(raw_id), fields, deliveries=1)
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
                scripts.ACK_FENCED, 3, self.key, *fence.fence_keys(), self.group, *fence.fence_args(), *ids), "xack"))
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

    def reread_own_next(self) -> None:
        """Make the next `reread_own` run even if Redis never went away: a consumer restarted under its
        old name (the learner, whose lease makes it the only one) takes its pending entries back at once
        instead of after the visibility timeout."""
        self._reread_at = -1

    async def reread_own(self, consumer: str, held: Collection[str], count: int = 16) -> list[Entry[T]]:
        """On the first call and once after each time the link saw Redis come back: the entries pending for
        `consumer` that it does not hold (`held`: ids read and not yet acked), oldest first, at most
        `count`, each delivered again (its count raised) — or dead-lettered when it was delivered
        `max_deliveries` times already. Otherwise []."""
        reconnects = self.link.reconnects if self.link is not None else 0
        if reconnects == self._reread_at:
            return []
        rows = await self._call(lambda: self.redis.xpending_range(
            self.key, self.group, min="-", max="+", count=count + len(held), consumername=consumer), "xpending")
        again: list[str] = []
        for r in rows:
            mid, times = _sid(r["message_id"]), int(r["times_delivered"])
            if mid in held:
                continue
            if times >= self.max_deliveries:
                await self._bury_if(mid, times, consumer=consumer, min_idle_ms=0)
            elif len(again) < count:
                again.append(mid)
        out = await self._claim_again(consumer, again)
        first, self._reread_at = self._reread_at < 0, reconnects
        if len(rows) == count + len(held):
            self._reread_at = -1  # more may be left: look again on the next call
        if out:
            log.warning("%s: re-read %d entries still pending for %s %s", self.key, len(out), consumer,
                        "from before this process started" if first else "after redis came back")
        return out

    async def _claim_again(self, consumer: str, ids: Sequence[str]) -> list[Entry[T]]:
        """Deliver `ids` to `consumer` again (count raised), those still pending for it only."""
        if not ids:
            return []
        rows = await self._call(lambda: self.redis.eval(scripts.CLAIM_OWN, 1, self.key, self.group, consumer, "0", *ids),
                                "claim own")
        out: list[Entry[T]] = []
        for raw_id, before, flat in rows:
            mid = _sid(raw_id)
            if not flat:  # trimmed away while pending: nothing left to do
                await self.ack(mid)
                continue
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            entry = await self._decode_or_bury(mid, fields, deliveries=int(before) + 1)
            if entry is not None:
                out.append(entry)
        return out

    async def heartbeat(self, consumer: str, ids: Collection[str]) -> int:
        """Reset the idle time of those of `ids` still pending for `consumer`, in one atomic script that
        never takes one another consumer has reclaimed meanwhile; returns how many."""
        if not ids:
            return 0
        mine = sorted(ids, key=parse_id)
        done = await self._call(lambda: self.redis.eval(scripts.CLAIM_OWN, 1, self.key, self.group, consumer, "1", *mine),
                                "heartbeat")
        return len(done)

    async def release(self, consumer: str, ids: Collection[str]) -> int:
        """Hand back those of `ids` still pending for `consumer`, for any consumer's next `reclaim` to take
        at once (one script: `RELEASE_OWN`); returns how many."""
        if not ids:
            return 0
        idle = str(self.visibility_timeout_ms + 1)
        return int(await self._call(lambda: self.redis.eval(
            scripts.RELEASE_OWN, 1, self.key, self.group, consumer, idle, *sorted(ids, key=parse_id)), "release"))

    async def reclaim(self, consumer: str, count: int = 16, held: Collection[str] = ()) -> list[Entry[T]]:
        """Claim entries idle past the visibility timeout for `consumer`; bury those delivered
        `max_deliveries` times already. Entries `consumer` holds (`held`) are left out before anything is
        counted. Returns the claimed, valid entries."""
        pending = await self._call(lambda: self.redis.xpending_range(
            self.key, self.group, min="-", max="+", count=count + len(held), idle=self.visibility_timeout_ms),
            "xpending")
        to_claim: list[str] = []
        delivered: dict[str, int] = {}
        for p in pending:
            mid = _sid(p["message_id"])
            if mid in held and _sid(p["consumer"]) == consumer:
                continue
            if len(delivered) >= count:
                break
            times = int(p["times_delivered"])
            delivered[mid] = times
            if times >= self.max_deliveries:
                await self._bury_if(mid, times, consumer="", min_idle_ms=self.visibility_timeout_ms)
            else:
                to_claim.append(mid)
        if not to_claim:
            return []
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

    async def _bury_if(self, mid: str, times: int, *, consumer: str, min_idle_ms: int) -> bool:
        """Dead-letter `mid` (delivered `times` times) while it is still pending for `consumer` ('' any)
        and idle `min_idle_ms`; True when it was."""
        reason = f"delivered {times} times without ack (max_deliveries={self.max_deliveries})"
        return await self._burial().bury_if(mid, reason, consumer=consumer, min_idle_ms=min_idle_ms)

    async def dead_letter(self, entry_id: str, reason: str) -> None:
        """Move a delivered entry the consumer will not process to the dead stream with `reason`, and
        ack it (the same record a malformed entry gets)."""
        await self._burial().bury_by_id(entry_id, reason)

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

    def _burial(self) -> Burial:
        """The dead-letter writes of this stream (`searchr1.core.stream_bury`), on its current settings."""
        return Burial(self.redis, self._call, self.key, self.group, self.dead_key, self.dead_maxlen, self.fence)


def tasks_stream(redis: aioredis.Redis, keys: StreamKeys, *, visibility_timeout_ms: int = 60_000,
                 max_deliveries: int = 3, trim_every: int = 0, link: RedisLink | None = None) -> TypedStream[Task]:
    """The run's tasks stream (dispatcher → rollout workers), consumed by `TASKS_GROUP`; with
    `trim_every`, acked entries are deleted every `trim_every` acks or publishes through it."""
    return TypedStream(redis, keys.tasks, Task, TASKS_GROUP, dead_key=keys.dead,
                       visibility_timeout_ms=visibility_timeout_ms, max_deliveries=max_deliveries,
                       trim_every=trim_every, link=link)


def trajectories_stream(redis: aioredis.Redis, keys: StreamKeys, *, visibility_timeout_ms: int = 60_000,
                        max_deliveries: int = 3, trim_every: int = 0, link: RedisLink | None = None,
                        fence: Lease | None = None) -> TypedStream[TrajectoryGroup]:
    """The run's trajectories stream (rollout workers → learner), consumed by `TRAJECTORIES_GROUP`; with
    `trim_every`, entries the learner has acked are deleted every `trim_every` acks or publishes through
    it (a worker publishing groups keeps the stream bounded without the learner's help). With `fence`
    (the learner's lease), every ack is checked against its token inside Redis."""
    return TypedStream(redis, keys.trajectories, TrajectoryGroup, TRAJECTORIES_GROUP, dead_key=keys.dead,
                       visibility_timeout_ms=visibility_timeout_ms, max_deliveries=max_deliveries,
                       trim_every=trim_every, link=link, fence=fence)
