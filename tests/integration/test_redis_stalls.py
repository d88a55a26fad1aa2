"""Stalls and refusals that are not outages, against a real redis-server: a black-holed connection (a
proxy that stops forwarding without closing) turns the link not-ready within the socket timeout and the
call completes once packets flow again; OOM (maxmemory + noeviction) and MISCONF refusals are waited
through, not-ready and counted, instead of crashing the caller."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError

from searchr1.core.metrics import RedisMetrics, new_registry
from searchr1.core.schemas import Task
from searchr1.streams import RedisLink, StreamKeys, connect, refusal_kind, tasks_stream
from tests.support.blackhole import BlackholeProxy


def _task(i: int, pad: int = 0) -> Task:
    return Task(task_id=f"t{i}", question="q?" + "x" * pad, golden_answers=["a"])


def _link() -> tuple[RedisLink, RedisMetrics]:
    m = RedisMetrics.on(new_registry(), "test")
    return RedisLink("test", backoff_s=0.05, max_backoff_s=0.2, **m.link_callbacks()), m


async def _until(cond, what: str, guard_s: float = 30.0) -> None:
    """Poll `cond()`; the guard only keeps a broken build from hanging the suite."""
    async with asyncio.timeout(guard_s):
        while not cond():
            await asyncio.sleep(0.05)


def test_refusals_are_classified():
    assert refusal_kind(OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")) == "oom"
    assert refusal_kind(ReadOnlyError("You can't write against a read only replica.")) == "readonly"
    assert refusal_kind(ResponseError("MISCONF Redis is configured to save RDB snapshots")) == "misconf"
    assert refusal_kind(ResponseError("NOGROUP No such key or consumer group")) is None
    assert refusal_kind(ConnectionError("reset")) is None


def test_default_client_has_timeouts_and_keepalive():
    client = connect("redis://127.0.0.1:1/0")
    kw = client.connection_pool.connection_kwargs
    assert kw["socket_timeout"] and kw["socket_connect_timeout"] and kw["socket_keepalive"]
    assert kw["health_check_interval"] > 0


async def test_black_holed_connection_turns_not_ready_then_recovers(redis_server):
    proxy = await BlackholeProxy("127.0.0.1", redis_server.port).start()
    link, m = _link()
    redis = connect(proxy.url(), socket_timeout_s=0.5)
    try:
        await redis.flushdb()
        stream = tasks_stream(redis, StreamKeys("bh"), link=link)
        await stream.ensure_group()
        assert link.up
        proxy.blackhole()
        publishing = asyncio.create_task(stream.publish(_task(1)))
        await _until(lambda: not link.up, "link down")  # today's client waits here forever
        assert m.retries._value.get() >= 1
        assert not publishing.done()
        proxy.restore()
        async with asyncio.timeout(30):
            await publishing
        assert link.up and link.reconnects == 1
        assert await stream.length() >= 1  # a publish whose reply was lost may land twice
    finally:
        await redis.aclose()
        await proxy.close()


async def test_oom_is_waited_through_not_raised(redis, redis_server):
    link, m = _link()
    stream = tasks_stream(redis, StreamKeys("oom"), link=link)
    await stream.ensure_group()
    used = int((await redis.info("memory"))["used_memory"])
    await redis.config_set("maxmemory", used + 2**20)
    await redis.config_set("maxmemory-policy", "noeviction")
    try:
        ids = []
        while True:  # fill until Redis refuses a write
            try:
                ids.append(await redis.xadd(StreamKeys("oom").tasks, {b"m": b"x" * 256}))
            except OutOfMemoryError:
                break
        publishing = asyncio.create_task(stream.publish(_task(1)))
        await _until(lambda: not link.up, "link down")  # today's link raises OutOfMemoryError here
        assert m.errors.labels("oom")._value.get() >= 1
        assert not publishing.done()
        await redis.delete(StreamKeys("oom").tasks)  # memory freed (as acked entries being trimmed would)
        await stream.ensure_group()
        async with asyncio.timeout(30):
            await publishing
        assert link.up
    finally:
        await redis.config_set("maxmemory", 0)


async def test_misconf_is_waited_through(redis):
    link, m = _link()
    calls = 0

    async def refused_twice() -> str:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise ResponseError("MISCONF Redis is configured to save RDB snapshots, but it's unable to persist")
        return "ok"

    assert await link.call(refused_twice, "xadd") == "ok"
    assert calls == 3 and m.errors.labels("misconf")._value.get() == 2 and link.up


async def test_a_refusal_inside_a_pipeline_is_waited_through(redis):
    """A real MISCONF (a background save that cannot write, `stop-writes-on-bgsave-error`) met by a pipelined
    publish (the dispatcher's `publish_many`): redis-py reports it as `Command # 1 (XADD …) of pipeline caused
    error: …`, which is the same refusal and is waited through, not raised (it ended the dispatcher)."""
    link, m = _link()
    keys = StreamKeys("misconf")
    stream = tasks_stream(redis, keys, link=link)
    await stream.ensure_group()
    saved = (await redis.config_get("dir"))["dir"]
    await redis.config_set("stop-writes-on-bgsave-error", "yes")
    await redis.config_set("save", "3600 1")
    await redis.config_set("dir", "/proc")  # no file can be created there, not even by root
    try:
        await redis.bgsave()
        for _ in range(300):
            if (await redis.info("persistence"))["rdb_last_bgsave_status"] == "err":
                break
            await asyncio.sleep(0.1)
        publishing = asyncio.create_task(stream.publish_many([_task(1), _task(2)]))
        await _until(lambda: not link.up, "link down")
        assert m.errors.labels("misconf")._value.get() >= 1 and not publishing.done()
    finally:
        await redis.config_set("dir", saved)
        await redis.config_set("save", "")
    async with asyncio.timeout(30):
        assert len(await publishing) == 2
    assert link.up and await stream.length() == 2
    annotated = ResponseError("Command # 1 (XADD searchr1:x:tasks * m ...) of pipeline caused error: "
                              "MISCONF Redis is configured to save RDB snapshots")
    assert refusal_kind(annotated) == "misconf"
    assert refusal_kind(ResponseError("Command # 1 (XADD k * m v) of pipeline caused error: ('NOGROUP x',)")) is None


async def test_wrong_command_is_still_raised(redis):
    link, _ = _link()
    stream = tasks_stream(redis, StreamKeys("nog"), link=link)
    with pytest.raises(ResponseError, match="NOGROUP"):
        await stream.read("c1")


async def test_watch_reports_memory_for_the_alert(redis):
    link, m = _link()
    await redis.config_set("maxmemory", 512 * 2**20)
    stop = asyncio.Event()
    try:
        watch = asyncio.create_task(link.watch(redis, stop, interval_s=0.05, memory_interval_s=0.0))
        await _until(lambda: m.memory_max._value.get() > 0, "memory sampled")
        stop.set()
        await watch
        assert m.memory_max._value.get() == 512 * 2**20 and 0 < m.memory_used._value.get() < 512 * 2**20
    finally:
        await redis.config_set("maxmemory", 0)
