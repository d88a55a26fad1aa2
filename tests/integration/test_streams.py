"""Redis Streams layer against a real redis-server: publish/read/ack, crash recovery by reclaim,
dead-lettering of malformed and poison entries, backpressure figures."""

from __future__ import annotations

import asyncio

import pytest

from searchr1 import streams
from searchr1.core.schemas import Task, TrajectoryGroup, encode
from searchr1.streams import PAYLOAD_FIELD, StreamKeys, TypedStream, read_dead

KEYS = StreamKeys("test")


def tasks_stream(redis, **kw) -> TypedStream[Task]:
    kw.setdefault("visibility_timeout_ms", 200)
    kw.setdefault("max_deliveries", 3)
    return streams.tasks_stream(redis, KEYS, **kw)


def task(i: int) -> Task:
    return Task(task_id=f"t{i}", question=f"question {i}?", golden_answers=[str(i)])


async def test_publish_read_ack(redis):
    s = tasks_stream(redis)
    await s.ensure_group()
    await s.ensure_group()  # idempotent
    ids = await s.publish_many([task(i) for i in range(3)])
    assert len(ids) == 3 and await s.length() == 3
    assert await s.lag() == 3 and await s.in_flight() == 3
    got = await s.read("c1", count=10)
    assert [e.value.task_id for e in got] == ["t0", "t1", "t2"]
    assert await s.pending() == 3 and await s.lag() == 0
    assert await s.ack(*[e.id for e in got]) == 3
    assert await s.pending() == 0 and await s.in_flight() == 0
    assert await s.read("c1", count=10) == []


async def test_killed_consumer_loses_nothing(redis):
    """c1 reads and dies before acking; after the visibility timeout c2 reclaims and finishes."""
    s = tasks_stream(redis)
    await s.ensure_group()
    await s.publish_many([task(i) for i in range(4)])
    taken = await s.read("c1", count=2)  # c1 "crashes" here: no ack
    assert len(taken) == 2
    assert await s.reclaim("c2") == []  # not idle long enough yet
    rest = await s.read("c2", count=10)
    await s.ack(*[e.id for e in rest])
    await asyncio.sleep(0.25)
    reclaimed = await s.reclaim("c2")
    assert {e.value.task_id for e in reclaimed} == {e.value.task_id for e in taken}
    assert all(e.deliveries == 2 for e in reclaimed)
    await s.ack(*[e.id for e in reclaimed])
    assert await s.pending() == 0
    done = {e.value.task_id for e in rest} | {e.value.task_id for e in reclaimed}
    assert done == {"t0", "t1", "t2", "t3"}
    assert await read_dead(redis, KEYS.dead) == []


async def test_killed_consumer_in_another_process_connection(redis_server):
    """The same through separate connections, as separate worker processes would do."""
    from searchr1.streams import connect

    r1, r2 = connect(redis_server.url), connect(redis_server.url)
    try:
        await r1.flushdb()
        s1, s2 = tasks_stream(r1), tasks_stream(r2)
        await s1.ensure_group()
        await s1.publish(task(7))
        assert [e.value.task_id for e in await s1.read("worker-a")] == ["t7"]
        await r1.aclose()  # worker-a's process is gone
        await asyncio.sleep(0.25)
        got = await s2.reclaim("worker-b")
        assert [e.value.task_id for e in got] == ["t7"]
        await s2.ack(got[0].id)
        assert await s2.pending() == 0
    finally:
        await r2.aclose()


async def test_malformed_entry_goes_to_dead_with_reason(redis):
    s = tasks_stream(redis)
    await s.ensure_group()
    await redis.xadd(KEYS.tasks, {PAYLOAD_FIELD: b"\xc1not msgpack"})
    await redis.xadd(KEYS.tasks, {b"other": b"x"})
    # a TrajectoryGroup where a Task is expected
    await redis.xadd(KEYS.tasks, {PAYLOAD_FIELD: encode(task(0)).replace(b"Task", b"Tusk")})
    await s.publish(task(1))
    got = await s.read("c1", count=10)
    assert [e.value.task_id for e in got] == ["t1"]
    dead = await read_dead(redis, KEYS.dead)
    assert len(dead) == 3
    assert "not msgpack" in dead[0].reason
    assert "no 'm' field" in dead[1].reason
    assert "expected a Task" in dead[2].reason
    assert dead[0].payload == b"\xc1not msgpack" and dead[0].source == KEYS.tasks
    assert await s.pending() == 1  # only the good one awaits its ack


async def test_poison_entry_dead_lettered_after_max_deliveries(redis):
    s = tasks_stream(redis, max_deliveries=2, visibility_timeout_ms=100)
    await s.ensure_group()
    await s.publish(task(9))
    assert len(await s.read("c1")) == 1  # delivery 1, never acked
    await asyncio.sleep(0.12)
    assert len(await s.reclaim("c2")) == 1  # delivery 2, never acked
    await asyncio.sleep(0.12)
    assert await s.reclaim("c3") == []  # delivered twice: buried
    dead = await read_dead(redis, KEYS.dead)
    assert len(dead) == 1 and "delivered 2 times" in dead[0].reason
    assert dead[0].payload == encode(task(9))
    assert await s.pending() == 0


async def test_publish_type_checked(redis):
    s = tasks_stream(redis)
    with pytest.raises(TypeError):
        await s.publish("not a task")  # type: ignore[arg-type]


async def test_blocking_read_wakes_on_publish(redis_server):
    from searchr1.streams import connect

    reader, writer = connect(redis_server.url), connect(redis_server.url)
    try:
        await reader.flushdb()
        s_r, s_w = tasks_stream(reader), tasks_stream(writer)
        await s_r.ensure_group()
        pending_read = asyncio.create_task(s_r.read("c", count=1, block_ms=5000))
        await asyncio.sleep(0.1)
        await s_w.publish(task(5))
        got = await asyncio.wait_for(pending_read, 5)
        assert [e.value.task_id for e in got] == ["t5"]
    finally:
        await reader.aclose()
        await writer.aclose()


async def test_run_streams_share_keys_groups_and_models(redis):
    """The tasks and trajectories streams built by their constructors (as the learner, the rollout
    workers and the status line build them) name the run's keys, one consumer group each, and carry
    their own wire model only."""
    from tests.support.synthetic import synthetic_group

    tasks, trajectories = streams.tasks_stream(redis, KEYS), streams.trajectories_stream(redis, KEYS, trim_every=5)
    assert (tasks.key, tasks.group, tasks.model, tasks.dead_key) == (
        KEYS.tasks, streams.TASKS_GROUP, Task, KEYS.dead)
    assert (trajectories.key, trajectories.group, trajectories.model, trajectories.dead_key) == (
        KEYS.trajectories, streams.TRAJECTORIES_GROUP, TrajectoryGroup, KEYS.dead)
    assert streams.TASKS_GROUP != streams.TRAJECTORIES_GROUP
    await trajectories.ensure_group()
    with pytest.raises(TypeError):
        await trajectories.publish(task(1))  # type: ignore[arg-type]
    group = synthetic_group("g", group_size=2, vocab=16)
    await trajectories.publish(group)
    reader = streams.trajectories_stream(redis, KEYS)  # another process's view of the same stream
    got = await reader.read("learner-0", count=1)
    assert [e.value.task.task_id for e in got] == ["g"]
