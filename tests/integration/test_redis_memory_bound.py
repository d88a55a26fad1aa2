"""Bounded Redis memory against a real redis-server: trimming deletes only the entries every consumer
group has acked (never a pending or an unread one, and a reclaim after a trim still gets the pending
entry's payload), the dead stream is capped, and a publish/read/ack soak keeps `used_memory` flat."""

from __future__ import annotations

import asyncio
import os

from searchr1 import streams
from searchr1.core.schemas import Task
from searchr1.streams import StreamKeys, read_dead

KEYS = StreamKeys("trim")


def task(i: int, pad: int = 0) -> Task:
    return Task(task_id=f"t{i}", question=f"question {i}?" + "x" * pad, golden_answers=[str(i)])


async def ids_in(redis, key: str) -> list[str]:
    return [streams.text(rid) for rid, _ in await redis.xrange(key)]


async def test_trim_never_removes_pending_or_unread_entries(redis):
    s = streams.tasks_stream(redis, KEYS, visibility_timeout_ms=50, max_deliveries=3)
    await s.ensure_group()
    await redis.xgroup_create(KEYS.tasks, "audit", id="0")  # a second group reading the same stream
    ids = await s.publish_many([task(i) for i in range(10)])
    got = await s.read("w1", count=6)  # 0..5 delivered to the rollout group
    await s.ack(*[e.id for e in got if e.value.task_id not in {"t2", "t4"}])  # t2, t4 stay pending
    other = await redis.xreadgroup("audit", "a", {KEYS.tasks: ">"}, count=8)
    await redis.xack(KEYS.tasks, "audit", *[rid for rid, _ in other[0][1]])  # audit acked 0..7
    removed = await s.trim()
    # rollout still needs t2 (pending) and t6.. (unread): only t0, t1 are acked by both groups
    assert removed == 2
    assert await ids_in(redis, KEYS.tasks) == ids[2:]
    await s.ack(got[2].id)  # t2 done; t4 still pending, so t2 and t3 may go now
    assert await s.trim() == 2
    assert await ids_in(redis, KEYS.tasks) == ids[4:]
    await asyncio.sleep(0.1)
    reclaimed = await s.reclaim("w2")  # the pending entry survived the trims with its payload
    assert [e.value.task_id for e in reclaimed] == ["t4"]
    assert await read_dead(redis, KEYS.dead) == []


async def test_trim_every_acks_keeps_the_stream_short(redis):
    s = streams.tasks_stream(redis, KEYS, trim_every=4, visibility_timeout_ms=60_000, max_deliveries=3)
    await s.ensure_group()
    for round_ in range(10):
        await s.publish_many([task(round_ * 4 + i) for i in range(4)])
        got = await s.read("w", count=4)
        await s.ack(*[e.id for e in got])
    assert await s.length() <= 4  # 40 published, all acked: at most the last batch is left
    assert await s.pending() == 0


async def test_a_stream_without_group_is_never_trimmed(redis):
    s = streams.tasks_stream(redis, KEYS, visibility_timeout_ms=60_000, max_deliveries=3)
    await redis.xadd(KEYS.tasks, {b"m": b"x"})
    assert await s.trim() == 0 and await s.length() == 1


async def test_dead_stream_is_capped(redis):
    s = streams.TypedStream(redis, KEYS.tasks, Task, streams.TASKS_GROUP, dead_key=KEYS.dead, dead_maxlen=10)
    await s.ensure_group()
    for i in range(300):
        await redis.xadd(KEYS.tasks, {b"m": b"not msgpack %d" % i})
    assert await s.read("w", count=300) == []  # all malformed: buried
    assert await redis.xlen(KEYS.dead) < 300  # ~ MAXLEN trims whole nodes of 100 entries
    assert await redis.xlen(KEYS.dead) >= 10


async def test_soak_used_memory_flat_after_warmup(redis):
    """Publish, read and ack groups of ~16 KB through a trimming stream: after warm-up, `used_memory`
    stays within a small margin while the data pushed through is many times that margin."""
    rounds = int(os.environ.get("SEARCHR1_SOAK_ROUNDS", "1500"))
    pad, batch = 16_000, 4
    s = streams.tasks_stream(redis, KEYS, trim_every=batch, visibility_timeout_ms=60_000, max_deliveries=3)
    await s.ensure_group()

    async def step(k: int) -> None:
        await s.publish_many([task(k * batch + i, pad) for i in range(batch)])
        got = await s.read("w", count=batch)
        await s.ack(*[e.id for e in got])

    warmup = rounds // 5
    for k in range(warmup):
        await step(k)
    warm = int((await redis.info("memory"))["used_memory"])
    peak = warm
    for k in range(warmup, rounds):
        await step(k)
        if k % 50 == 0:
            peak = max(peak, int((await redis.info("memory"))["used_memory"]))
    end = int((await redis.info("memory"))["used_memory"])
    pushed = (rounds - warmup) * batch * pad
    print(f"soak: {rounds} rounds, {pushed / 2**20:.1f} MiB pushed after warm-up; used_memory "
          f"warm {warm / 2**20:.2f} MiB, peak {peak / 2**20:.2f} MiB, end {end / 2**20:.2f} MiB")
    assert end - warm < 2**20 and peak - warm < 2**20
    assert pushed > 50 * 2**20
