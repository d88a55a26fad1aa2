"""A crashed worker's tasks are redone within seconds, a live one's never taken, against a real
redis-server: a consumer restarted under its own name re-reads its pending entries on its first read;
heartbeats (XCLAIM JUSTID to itself) keep a live consumer's slow entries from passing a short visibility
timeout, never take an entry another consumer has reclaimed, and leave the delivery count alone; a worker
whose slow task outlives the visibility timeout keeps it while a second worker reclaims nothing."""

from __future__ import annotations

import asyncio

from searchr1.core.schemas import Task
from searchr1.streams import StreamKeys, tasks_stream
from tests.integration.test_rollout_worker_redis import Gen, _stack

KEYS = StreamKeys("fr")


def _task(i: int) -> Task:
    return Task(task_id=f"t{i}", question=f"q{i}?", golden_answers=["a"])


async def test_restarted_consumer_rereads_its_own_pending_at_once(redis):
    before = tasks_stream(redis, KEYS, visibility_timeout_ms=3_600_000, max_deliveries=3)
    await before.ensure_group()
    await before.publish_many([_task(i) for i in range(3)])
    assert len(await before.read("rollout-0", count=2)) == 2  # then the process is killed
    after = tasks_stream(redis, KEYS, visibility_timeout_ms=3_600_000, max_deliveries=3)  # the restarted process, same name
    again = await after.reread_own("rollout-0", set(), count=8)
    assert [e.value.task_id for e in again] == ["t0", "t1"]  # not an hour later: now
    assert await after.reread_own("rollout-0", set(), count=8) == []  # once


async def test_heartbeat_keeps_live_entries_and_never_steals(redis):
    s = tasks_stream(redis, KEYS, visibility_timeout_ms=300, max_deliveries=3)
    await s.ensure_group()
    await s.publish_many([_task(i) for i in range(2)])
    held = await s.read("live", count=2)
    ids = {e.id for e in held}
    for _ in range(4):  # 0.6 s in all, twice the visibility timeout, heartbeating every 0.15 s
        await asyncio.sleep(0.15)
        assert await s.heartbeat("live", ids) == 2
        assert await s.reclaim("other") == []
    await asyncio.sleep(0.35)  # "live" died: no more heartbeats
    taken = await s.reclaim("other")
    assert {e.id for e in taken} == ids and all(e.deliveries == 2 for e in taken)
    assert await s.heartbeat("live", ids) == 0  # a late heartbeat takes nothing back
    rows = await redis.xpending_range(KEYS.tasks, "rollout", min="-", max="+", count=10)
    assert {r["consumer"] for r in rows} == {b"other"} and {r["times_delivered"] for r in rows} == {2}


class SlowGen(Gen):
    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    async def generate(self, request, request_id):
        await asyncio.sleep(self.delay_s)
        return await super().generate(request, request_id)


async def test_a_slow_live_worker_keeps_its_task(redis, tmp_path):
    """The task takes 1.2 s, four times the 0.3 s visibility timeout; the worker heartbeats every 0.075 s
    and a second consumer reclaims every 0.05 s: the task is done once, by its worker, delivered once."""
    st = await _stack(redis, KEYS, SlowGen(0.6), tmp_path, visibility_timeout_ms=300, reclaim_interval_s=0.05,
                      heartbeat_s=0.075)
    await st.tasks.publish(Task(task_id="slow", question="q?", golden_answers=["Paris"], group_size=2))
    stop = asyncio.Event()
    run = asyncio.create_task(st.worker.run(stop))
    thief = tasks_stream(redis, KEYS, visibility_timeout_ms=300, max_deliveries=3)
    stolen = []
    async with asyncio.timeout(30):  # guard only
        while not (got := await st.groups.read("learner", count=1, block_ms=50)):
            stolen += await thief.reclaim("thief")
    stop.set()
    await run
    assert stolen == []
    assert [g.value.task.task_id for g in got] == ["slow"] and await st.tasks.pending() == 0


class StuckGen(Gen):
    """An engine whose generate call never returns (a hung engine that did not die)."""

    async def generate(self, request, request_id):
        await asyncio.Event().wait()


async def test_a_worker_stuck_in_a_drain_reports_not_alive(redis, tmp_path):
    """New weights are announced while the only task hangs in the engine: the worker drains before
    loading them and the drain never ends. `/healthz` turns 503 once the loop has not passed for the stall
    bound, while `/readyz` (Redis answers) stays 200 — the supervisor restarts it."""
    import httpx

    from searchr1.core.metrics import new_registry, start_metrics_server
    from searchr1.core.schemas import WeightVersion
    from searchr1.core.watchdog import Watchdog
    from searchr1.weightsync import announce

    dog = Watchdog("rollout", 0.5)
    st = await _stack(redis, KEYS, StuckGen(), tmp_path, weight_poll_s=0.05, watchdog=dog)
    server = start_metrics_server(new_registry(), ready=lambda: True, live=dog.alive)
    await st.tasks.publish(Task(task_id="hang", question="q?", golden_answers=["a"], group_size=1))
    stop = asyncio.Event()
    run = asyncio.create_task(st.worker.run(stop))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            async with asyncio.timeout(30):  # guard only
                while not st.worker._inflight:
                    await asyncio.sleep(0.02)
                assert (await client.get("/healthz")).status_code == 200
                await announce(redis, KEYS, WeightVersion(version=1, uri=str(tmp_path), sha256="0" * 64))
                while (await client.get("/healthz")).status_code == 200:
                    await asyncio.sleep(0.05)
            assert (await client.get("/healthz")).status_code == 503
            assert (await client.get("/readyz")).status_code == 200
    finally:
        st.worker.drain_timeout_s = 0.1
        stop.set()
        for t in st.worker._inflight:
            t.cancel()
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        server.close()


async def test_a_long_drain_keeps_heartbeating(redis, tmp_path):
    """New weights are announced while a task four times longer than the visibility timeout runs: the
    worker drains before loading them and keeps heartbeating the task meanwhile, so a second consumer
    reclaiming every 50 ms never takes it."""
    from searchr1.core.schemas import WeightVersion
    from searchr1.weightsync import announce

    st = await _stack(redis, KEYS, SlowGen(1.2), tmp_path, visibility_timeout_ms=300, reclaim_interval_s=0.05,
                      heartbeat_s=0.075, weight_poll_s=0.05)
    await st.tasks.publish(Task(task_id="slow", question="q?", golden_answers=["Paris"], group_size=1))
    stop = asyncio.Event()
    run = asyncio.create_task(st.worker.run(stop))
    thief = tasks_stream(redis, KEYS, visibility_timeout_ms=300, max_deliveries=3)
    stolen = []
    async with asyncio.timeout(30):  # guard only
        while not st.worker._inflight:
            await asyncio.sleep(0.01)
        await announce(redis, KEYS, WeightVersion(version=1, uri=str(tmp_path), sha256="0" * 64))
        while not (got := await st.groups.read("learner", count=1, block_ms=50)):
            stolen += await thief.reclaim("thief")
    stop.set()
    await run
    assert stolen == [] and [g.value.task.task_id for g in got] == ["slow"]
