"""The streams' `RedisLink` against a real redis-server with an append-only file, stopped and restarted on
the same port: a read, a publish and an ack issued while Redis is away wait for it and complete once it
is back (nothing dropped, nothing acked twice or early); the consumer group and its pending entries
survive the restart, and the entries a consumer had been delivered but never saw are re-read once, minus
the ones it holds; `/readyz` on a metrics port follows the link; a command Redis refuses is not retried."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from redis.exceptions import BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from searchr1.core.metrics import RedisMetrics, new_registry, start_metrics_server
from searchr1.core.redis_server import RedisServer
from searchr1.core.retry import is_redis_transient
from searchr1.core.schemas import Task
from searchr1.streams import RedisLink, StreamKeys, connect, tasks_stream


def _task(i: int) -> Task:
    return Task(task_id=f"t{i}", question=f"q{i}?", golden_answers=["a"], group_size=1)


@pytest.fixture
def aof_redis(tmp_path):
    server = RedisServer(workdir=tmp_path / "redis", appendonly=True).start()
    yield server
    server.stop()


def _link() -> tuple[RedisLink, RedisMetrics]:
    m = RedisMetrics.on(new_registry(), "test")
    return RedisLink("test", backoff_s=0.05, max_backoff_s=0.5, **m.link_callbacks()), m


def test_transient_redis_errors():
    assert is_redis_transient(RedisConnectionError("refused"))
    assert is_redis_transient(BusyLoadingError("Redis is loading the dataset in memory"))
    assert is_redis_transient(RedisTimeoutError("timeout"))
    assert is_redis_transient(ConnectionResetError())
    assert not is_redis_transient(ResponseError("NOGROUP No such key"))
    assert not is_redis_transient(ValueError("x"))


async def test_calls_wait_through_a_restart_and_own_pending_entries_are_reread(aof_redis):
    link, m = _link()
    redis = connect(aof_redis.url)
    try:
        stream = tasks_stream(redis, StreamKeys("rc"), link=link, visibility_timeout_ms=60_000, max_deliveries=3)
        await stream.ensure_group()
        assert link.up and m.up._value.get() == 1
        assert await stream.reread_own("c1", set()) == []  # the first call: nothing left from before
        await stream.publish_many([_task(i) for i in range(4)])
        held = await stream.read("c1", count=2)
        assert [e.value.task_id for e in held] == ["t0", "t1"]
        # a read whose reply never reached the consumer: delivered to c1, pending, unseen
        await redis.xreadgroup(stream.group, "c1", {stream.key: ">"}, count=1)
        assert await stream.reread_own("c1", {e.id for e in held}) == [], "nothing re-read without an outage"

        await asyncio.to_thread(aof_redis.stop)
        ack = asyncio.create_task(stream.ack(held[0].id))
        publish = asyncio.create_task(stream.publish(_task(9)))
        await asyncio.sleep(1.0)
        assert not ack.done() and not publish.done(), "calls wait while Redis is away"
        assert not link.up and m.up._value.get() == 0 and m.retries._value.get() >= 2
        await asyncio.to_thread(aof_redis.start)
        assert await asyncio.wait_for(ack, 15) == 1
        await asyncio.wait_for(publish, 15)
        assert link.up and link.reconnects == 1 and m.reconnects._value.get() == 1

        # the group and its pending entries came back from the append-only file
        assert await stream.pending() == 2  # t1 (held) and t2 (unseen)
        again = await stream.reread_own("c1", {held[1].id})
        assert [e.value.task_id for e in again] == ["t2"]
        assert await stream.reread_own("c1", {held[1].id}) == [], "re-read once per reconnect"
        rest = await stream.read("c1", count=10)
        assert [e.value.task_id for e in rest] == ["t3", "t9"], "nothing published twice, nothing skipped"
    finally:
        await redis.aclose()


async def test_a_blocked_read_rides_through_a_restart(aof_redis):
    link, _ = _link()
    redis, producer = connect(aof_redis.url), connect(aof_redis.url)
    try:
        stream = tasks_stream(redis, StreamKeys("rb"), link=link, visibility_timeout_ms=60_000, max_deliveries=3)
        await stream.ensure_group()
        reading = asyncio.create_task(stream.read("c1", count=1, block_ms=20_000))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(aof_redis.stop)
        await asyncio.sleep(2.0)
        assert not reading.done()
        await asyncio.to_thread(aof_redis.start)
        await tasks_stream(producer, StreamKeys("rb"), visibility_timeout_ms=60_000, max_deliveries=3).publish(_task(1))
        got = await asyncio.wait_for(reading, 20)
        assert [e.value.task_id for e in got] == ["t1"]
    finally:
        await redis.aclose()
        await producer.aclose()


async def test_refused_commands_are_not_retried(aof_redis):
    link, m = _link()
    redis = connect(aof_redis.url)
    try:
        stream = tasks_stream(redis, StreamKeys("rr"), link=link, visibility_timeout_ms=60_000, max_deliveries=3)
        with pytest.raises(ResponseError, match="NOGROUP"):
            await stream.read("c1")  # no group yet: Redis answers, with an error
        assert m.retries._value.get() == 0
    finally:
        await redis.aclose()


async def test_readyz_follows_the_link_and_stays_open_with_a_token(aof_redis):
    link, _ = _link()
    registry = new_registry()
    server = start_metrics_server(registry, token="s3cret", ready=lambda: link.up)
    redis = connect(aof_redis.url)
    stop = asyncio.Event()
    watch = asyncio.create_task(link.watch(redis, stop, interval_s=0.2, timeout_s=0.5))
    base = f"http://127.0.0.1:{server.port}"

    async def ready_status(client: httpx.AsyncClient, want: int, within_s: float) -> int:
        deadline = asyncio.get_running_loop().time() + within_s
        while True:
            status = (await client.get(f"{base}/readyz")).status_code
            if status == want or asyncio.get_running_loop().time() > deadline:
                return status
            await asyncio.sleep(0.1)

    try:
        async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
            assert await ready_status(client, 200, 5) == 200
            assert (await client.get(f"{base}/healthz")).status_code == 200
            assert (await client.get(f"{base}/metrics")).status_code == 401
            await asyncio.to_thread(aof_redis.stop)
            assert await ready_status(client, 503, 5) == 503
            assert (await client.get(f"{base}/readyz")).json() == {"ready": False}
            assert (await client.get(f"{base}/healthz")).status_code == 200, "alive while Redis is away"
            await asyncio.to_thread(aof_redis.start)
            assert await ready_status(client, 200, 10) == 200
            assert link.reconnects == 1
    finally:
        stop.set()
        await asyncio.wait_for(watch, 5)
        await redis.aclose()
        server.close()
