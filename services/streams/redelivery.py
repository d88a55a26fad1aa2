"""The paths that deliver a stream's entry again, and the run's two typed streams (the streams and their
groups: docs/architecture.md, "Streams").

`TypedStream[T]` publishes and reads one pydantic wire model per entry. Publishing, reading, acking
(fenced by the learner's lease when the stream has one), dead-lettering, trimming and the counts are
`StreamBase`'s (`searchr1.streams.delivery`); this module adds the paths that deliver an entry again:

- `reclaim(consumer, count, held)` → entries pending longer than the visibility timeout are claimed by
  this consumer (XPENDING to see delivery counts, then XCLAIM); past `max_deliveries` they go to the dead
  stream instead with the reason (one Lua script per entry, which buries it only while it is still idle
  past the timeout). Entries this consumer holds (`held`) are left out before anything is counted, so
  a consumer never buries what it is still working on. XAUTOCLAIM would claim in one call but does not
  report delivery counts, which the dead-letter rule needs;
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
  them reclaimed, so the timeout can be short enough to reclaim a dead consumer's entries within seconds;
- `release(consumer, ids)` → hand entries back for any consumer's next `reclaim` to take at once.

Every path that delivers an entry again (`reclaim`, `reread_own`) counts its deliveries and buries it
past `max_deliveries`; a plain `read` delivers each entry for the first time. A burial acks the entry, so
with a `fence` it is checked against the lease token in the same script, on these paths too.

The run's two streams are built only by `tasks_stream` (Task entries, group `TASKS_GROUP`) and
`trajectories_stream` (TrajectoryGroup entries, group `TRAJECTORIES_GROUP`), so every service and tool
agrees on key, model and group. What this module does not do: decide when to ack or how many entries to
keep in flight; that is each service's loop.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import TypeVar

from pydantic import BaseModel
from redis import asyncio as aioredis

from searchr1.core.schemas import Task, TrajectoryGroup
from searchr1.streams.delivery import Entry, StreamBase
from searchr1.streams.keys import TASKS_GROUP, TRAJECTORIES_GROUP, StreamKeys, parse_id, text
from searchr1.streams.lease import Lease
from searchr1.streams.link import RedisLink
from searchr1.streams.scripts import CLAIM_OWN, RELEASE_OWN

T = TypeVar("T", bound=BaseModel)

log = logging.getLogger("searchr1.streams")


class TypedStream(StreamBase[T]):
    """A stream of `model` entries consumed by one consumer group, with the paths that deliver an entry
    again (reclaim, re-read of a consumer's own, heartbeat, release)."""

    def redelivery(self) -> tuple[int, int]:
        """(visibility timeout in ms, max deliveries) of this consumer end: refused (ValueError) on an end
        built without them, one that only publishes or counts."""
        if self.visibility_timeout_ms is None or self.max_deliveries is None:
            raise ValueError(f"{self.key}: built without visibility_timeout_ms and max_deliveries (a "
                             f"publishing or counting end); only a consumer built with its settings delivers "
                             f"entries again")
        return self.visibility_timeout_ms, self.max_deliveries

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
        _, max_deliveries = self.redelivery()
        reconnects = self.link.reconnects if self.link is not None else 0
        if reconnects == self._reread_at:
            return []
        rows = await self._call(lambda: self.redis.xpending_range(
            self.key, self.group, min="-", max="+", count=count + len(held), consumername=consumer), "xpending")
        again: list[str] = []
        for r in rows:
            mid, times = text(r["message_id"]), int(r["times_delivered"])
            if mid in held:
                continue
            if times >= max_deliveries:
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
        rows = await self._call(lambda: self.redis.eval(CLAIM_OWN, 1, self.key, self.group, consumer, "0", *ids),
                                "claim own")
        out: list[Entry[T]] = []
        for raw_id, before, flat in rows:
            mid = text(raw_id)
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
        done = await self._call(lambda: self.redis.eval(CLAIM_OWN, 1, self.key, self.group, consumer, "1", *mine),
                                "heartbeat")
        return len(done)

    async def release(self, consumer: str, ids: Collection[str]) -> int:
        """Hand back those of `ids` still pending for `consumer`, for any consumer's next `reclaim` to take
        at once (one script: `RELEASE_OWN`); returns how many."""
        if not ids:
            return 0
        idle = str(self.redelivery()[0] + 1)
        return int(await self._call(lambda: self.redis.eval(
            RELEASE_OWN, 1, self.key, self.group, consumer, idle, *sorted(ids, key=parse_id)), "release"))

    async def reclaim(self, consumer: str, count: int = 16, held: Collection[str] = ()) -> list[Entry[T]]:
        """Claim entries idle past the visibility timeout for `consumer`; bury those delivered
        `max_deliveries` times already. Entries `consumer` holds (`held`) are left out before anything is
        counted. Returns the claimed, valid entries."""
        visibility_ms, max_deliveries = self.redelivery()
        pending = await self._call(lambda: self.redis.xpending_range(
            self.key, self.group, min="-", max="+", count=count + len(held), idle=visibility_ms), "xpending")
        to_claim: list[str] = []
        delivered: dict[str, int] = {}
        for p in pending:
            mid = text(p["message_id"])
            if mid in held and text(p["consumer"]) == consumer:
                continue
            if len(delivered) >= count:
                break
            times = int(p["times_delivered"])
            delivered[mid] = times
            if times >= max_deliveries:
                await self._bury_if(mid, times, consumer="", min_idle_ms=visibility_ms)
            else:
                to_claim.append(mid)
        if not to_claim:
            return []
        claimed = await self._call(lambda: self.redis.xclaim(
            self.key, self.group, consumer, min_idle_time=visibility_ms, message_ids=to_claim),
            "xclaim")
        out: list[Entry[T]] = []
        for raw_id, fields in claimed:
            if fields is None:  # deleted while pending
                await self.ack(text(raw_id))
                continue
            mid = text(raw_id)
            entry = await self._decode_or_bury(mid, fields, deliveries=delivered.get(mid, 0) + 1)
            if entry is not None:
                out.append(entry)
        return out

    async def _bury_if(self, mid: str, times: int, *, consumer: str, min_idle_ms: int) -> bool:
        """Dead-letter `mid` (delivered `times` times) while it is still pending for `consumer` ('' any)
        and idle `min_idle_ms`; True when it was."""
        reason = f"delivered {times} times without ack (max_deliveries={self.max_deliveries})"
        buried = await self._burial().bury_if(mid, reason, consumer=consumer, min_idle_ms=min_idle_ms)
        self.buried += int(buried)
        return buried


def tasks_stream(redis: aioredis.Redis, keys: StreamKeys, *, visibility_timeout_ms: int | None = None,
                 max_deliveries: int | None = None, trim_every: int = 0,
                 link: RedisLink | None = None) -> TypedStream[Task]:
    """The run's tasks stream (dispatcher → rollout workers), consumed by `TASKS_GROUP`; with
    `trim_every`, acked entries are deleted every `trim_every` acks or publishes through it. A worker
    passes its `[rollout.tasks]` visibility timeout and max deliveries; the dispatcher's end, which only
    publishes, passes neither."""
    return TypedStream(redis, keys.tasks, Task, TASKS_GROUP, dead_key=keys.dead,
                       visibility_timeout_ms=visibility_timeout_ms, max_deliveries=max_deliveries,
                       trim_every=trim_every, link=link)


def trajectories_stream(redis: aioredis.Redis, keys: StreamKeys, *, visibility_timeout_ms: int | None = None,
                        max_deliveries: int | None = None, trim_every: int = 0, link: RedisLink | None = None,
                        fence: Lease | None = None) -> TypedStream[TrajectoryGroup]:
    """The run's trajectories stream (rollout workers → learner), consumed by `TRAJECTORIES_GROUP`; with
    `trim_every`, entries the learner has acked are deleted every `trim_every` acks or publishes through
    it (a worker publishing groups keeps the stream bounded without the learner's help). With `fence`
    (the learner's lease), every ack is checked against its token inside Redis. The learner passes its
    visibility timeout and max deliveries; a worker's end, which only publishes, passes neither."""
    return TypedStream(redis, keys.trajectories, TrajectoryGroup, TRAJECTORIES_GROUP, dead_key=keys.dead,
                       visibility_timeout_ms=visibility_timeout_ms, max_deliveries=max_deliveries,
                       trim_every=trim_every, link=link, fence=fence)
